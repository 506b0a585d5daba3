"""One fine-tuning run, as a frozen, self-validating config (SPEC.md, "Strategies" and "Heads").

The same object drives the page's form, the CLI, the runs database (``to_dict`` / ``from_dict``)
and the engine. Checks that need the model's shape (layers within 1..L, heads within 0..H-1) run
in `FinetuneConfig.check_model` once the model is loaded.

Default learning rates (short runs of a few hundred steps; override with ``lr``):

============================  =======  =====================================================
method                        lr       why
============================  =======  =====================================================
full, layers                  5e-5     BERT-style fine-tuning, a little above 2e-5 because
                                       runs are short
heads                         2e-4     HiFi's Table 5 uses 1e-4 .. 3e-4
adapter                       1e-3     Houlsby et al. sweep 1e-4 .. 1e-3; fresh modules
lora                          5e-4     LoRA / HiFi tables use 1e-4 .. 5e-4
bitfit, frozen                1e-3     few parameters, a fresh classifier
subspace, subspace-random     1e-2     a handful of coordinates per layer
============================  =======  =====================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from analysis.config import FINETUNE_METHODS, POOLINGS, DataSpec, ModelSpec

METHOD_NAMES = FINETUNE_METHODS
DEFAULT_LR: dict[str, float] = {
    "full": 5e-5,
    "layers": 5e-5,
    "heads": 2e-4,
    "adapter": 1e-3,
    "lora": 5e-4,
    "bitfit": 1e-3,
    "frozen": 1e-3,
    "subspace": 1e-2,
    "subspace-random": 1e-2,
}
TRAJECTORY_DTYPES = ("float32", "float16", "bfloat16")
HEADS_FORMAT = "tunescope-heads/1"

HeadSelection = tuple[
    tuple[int, tuple[int, ...]], ...
]  # ((layer, (head, ...)), ...), layer 1-based


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _layer_tuple(value: Any, what: str) -> tuple[int, ...]:
    try:
        layers = tuple(value)
    except TypeError:
        raise ValueError(f"{what} must be a list of layer numbers (got {value!r}).") from None
    if not layers:
        raise ValueError(f"{what} is empty: give at least one layer.")
    if not all(_is_int(x) for x in layers):
        raise ValueError(f"{what} must be whole layer numbers (got {value!r}).")
    if any(x < 1 for x in layers):
        raise ValueError(
            f"{what}: layers are numbered from 1 (0 is the embeddings); got {value!r}."
        )
    if len(set(layers)) != len(layers):
        raise ValueError(f"{what} lists a layer twice ({value!r}).")
    return tuple(sorted(layers))


def normalise_heads(value: Any) -> HeadSelection:
    """((layer, (head, ...)), ...) sorted, from a dict {layer: heads} or pairs; validated."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(layer, heads) for layer, heads in items]
    except (TypeError, ValueError):
        raise ValueError(
            f"Heads must map layers to head lists, e.g. {{1: [0, 3]}} (got {value!r})."
        ) from None
    out: dict[int, tuple[int, ...]] = {}
    for layer, heads in pairs:
        if isinstance(layer, str) and layer.strip().isdigit():
            layer = int(layer)
        if not _is_int(layer) or layer < 1:
            raise ValueError(
                f"Head selection: layers are numbered from 1 (0 is the embeddings); got {layer!r}."
            )
        if layer in out:
            raise ValueError(f"Head selection lists layer {layer} twice.")
        try:
            chosen = tuple(heads)
        except TypeError:
            raise ValueError(f"Head selection of layer {layer} must be a list of heads.") from None
        if not all(_is_int(h) and h >= 0 for h in chosen):
            raise ValueError(
                f"Head selection of layer {layer}: heads are numbered from 0 (got {list(chosen)!r})."
            )
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"Head selection of layer {layer} lists a head twice.")
        if chosen:
            out[layer] = tuple(sorted(chosen))
    if not out:
        raise ValueError("The head selection is empty: choose at least one head.")
    return tuple(sorted(out.items()))


def heads_from_file(path: str | Path) -> HeadSelection:
    """Read the heads page's selection file ``{"format": "tunescope-heads/1", "layers": {"1": [0, 3]}}``."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"Heads file '{path}' does not exist.") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"Heads file '{path}' is not readable JSON: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != HEADS_FORMAT:
        raise ValueError(
            f"Heads file '{path}' is not a tunescope head selection (expected "
            f'"format": "{HEADS_FORMAT}").'
        )
    if not isinstance(payload.get("layers"), dict):
        raise ValueError(f"Heads file '{path}' has no \"layers\" object.")
    return normalise_heads(payload["layers"])


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run. Layers are 1-based (SPEC), heads 0-based.

    method: what trains (besides the fresh classifier, which always trains)
      - ``full``: everything, embeddings included.
      - ``layers``: layers ℓ_bottom..ℓ_top of ``layers`` = (ℓ_bottom, ℓ_top, ℓ_head); embeddings
        only for (1, L, L).
      - ``heads``: the Q/K/V rows and bias entries of the ``heads`` selection (HiFi).
      - ``adapter``: Houlsby adapters (size ``adapter_size``) and the LayerNorms of
        ``adapter_layers`` (default: ℓ_bottom..ℓ_top of ``layers`` if given, else every layer).
      - ``lora``: LoRA (rank ``lora_r``, scale ``lora_alpha / lora_r``) on query and value of
        ``lora_layers`` (default as for adapters).
      - ``bitfit``: every bias. ``frozen``: nothing but the classifier.
      - ``subspace`` / ``subspace-random``: the subspace coordinates (analysis.subspace_train),
        from the trajectory of run ``subspace_from``.
    layers: for ``layers`` required; for every other method only ℓ_head is used (the classifier
      reads layer ℓ_head and the layers above it are removed), and for adapter / lora ℓ_bottom..ℓ_top
      is the default placement. None = (1, L, L).
    lr: None picks the method's default (module docstring); after construction it is a float.
    n_train: train examples used (a seeded random subset); None = all.
    n_eval: at most this many dev and test examples are scored (the same subset for every run).
    zero_weights: JSON file ``{param_name: [[row, col], ...]}`` of encoder entries set to zero
      before training; names as in the loaded encoder's ``named_parameters()``.
    mixed_precision: bf16 (or fp16 with loss scaling) autocast on CUDA; ignored on the CPU.
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    method: str = "full"
    layers: tuple[int, int, int] | None = None
    heads: HeadSelection | None = None
    adapter_layers: tuple[int, ...] | None = None
    adapter_size: int = 64
    lora_r: int = 8
    lora_alpha: int = 16
    lora_layers: tuple[int, ...] | None = None
    steps: int = 200
    lr: float | None = None
    batch_size: int = 16
    max_length: int = 128
    seed: int = 0
    n_train: int | None = None
    n_eval: int | None = 1000
    eval_every: int = 50
    pooling: str = "mean"
    weight_decay: float = 0.01
    warmup: float = 0.1
    trajectory_every: int | None = None
    trajectory_dtype: str = "float32"
    subspace_from: str | None = None
    zero_weights: str | None = None
    device: str | None = None
    mixed_precision: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.model, ModelSpec):
            raise ValueError("model must be a ModelSpec.")
        if not isinstance(self.data, DataSpec):
            raise ValueError("data must be a DataSpec.")
        if self.method not in METHOD_NAMES:
            raise ValueError(
                f"Unknown fine-tuning method {self.method!r}: choose one of {', '.join(METHOD_NAMES)}."
            )
        self._check_layers(set_)
        self._check_method_fields(set_)
        self._check_training(set_)

    # -- validation, in three parts ------------------------------------------------------------

    def _check_layers(self, set_) -> None:
        if self.layers is None:
            if self.method == "layers":
                raise ValueError(
                    "Method 'layers' needs layers = (ℓ_bottom, ℓ_top, ℓ_head), e.g. (1, 3, 3)."
                )
            return
        layers = tuple(self.layers) if not isinstance(self.layers, str) else ()
        if len(layers) != 3 or not all(_is_int(x) for x in layers):
            raise ValueError(
                f"layers must be three whole numbers (ℓ_bottom, ℓ_top, ℓ_head), got {self.layers!r}."
            )
        bottom, top, head = layers
        if min(layers) < 1:
            raise ValueError(f"Layers are numbered from 1 (0 is the embeddings); got {layers!r}.")
        if bottom > top:
            raise ValueError(f"ℓ_bottom ({bottom}) must not be above ℓ_top ({top}).")
        if head < top:
            raise ValueError(
                f"ℓ_head ({head}) must not be below ℓ_top ({top}): the layers above ℓ_head are "
                "removed, so they cannot be trained."
            )
        set_(self, "layers", layers)

    def _check_method_fields(self, set_) -> None:
        method = self.method
        if self.heads is not None:
            if method != "heads":
                raise ValueError("A head selection is only used by method 'heads'.")
            set_(self, "heads", normalise_heads(self.heads))
        elif method == "heads":
            raise ValueError("Method 'heads' needs a head selection (heads or a heads file).")
        for name, owner in (("adapter_layers", "adapter"), ("lora_layers", "lora")):
            value = getattr(self, name)
            if value is None:
                continue
            if method != owner:
                raise ValueError(f"{name} is only used by method '{owner}'.")
            set_(self, name, _layer_tuple(value, name))
        for name in ("adapter_size", "lora_r"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive whole number (got {value!r}).")
        if not _is_number(self.lora_alpha) or not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha must be positive (got {self.lora_alpha!r}).")
        head = self.head_layer
        if head is not None:
            for name, chosen in (
                ("adapter_layers", self.adapter_layers),
                ("lora_layers", self.lora_layers),
                ("heads", tuple(layer for layer, _ in self.heads or ())),
            ):
                if chosen and max(chosen) > head:
                    raise ValueError(
                        f"{name} uses layer {max(chosen)}, above ℓ_head = {head}: the layers above "
                        "ℓ_head are removed."
                    )
        if method == "subspace" and not self.subspace_from:
            raise ValueError(
                "Method 'subspace' needs subspace_from: the run whose trajectory to use."
            )
        if self.subspace_from is not None:
            if method not in ("subspace", "subspace-random"):
                raise ValueError(
                    "subspace_from is only used by methods subspace / subspace-random."
                )
            if not isinstance(self.subspace_from, str) or not self.subspace_from.strip():
                raise ValueError("subspace_from must be a run id.")
        if self.zero_weights is not None and (
            not isinstance(self.zero_weights, str) or not self.zero_weights.strip()
        ):
            raise ValueError("zero_weights must be the path of a JSON file.")

    def _check_training(self, set_) -> None:
        positive_ints = {
            "steps": "the number of optimizer steps",
            "batch_size": "the batch size",
            "eval_every": "the evaluation interval (steps)",
        }
        for name, what in positive_ints.items():
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(
                    f"{name} ({what}) must be a positive whole number (got {value!r})."
                )
        lr = DEFAULT_LR[self.method] if self.lr is None else self.lr
        if not _is_number(lr) or math.isnan(lr) or math.isinf(lr) or lr <= 0:
            raise ValueError(f"The learning rate must be a positive finite number (got {lr!r}).")
        set_(self, "lr", float(lr))
        if not _is_int(self.max_length) or not 8 <= self.max_length <= 4096:
            raise ValueError(
                f"Max length must be between 8 and 4096 tokens (got {self.max_length!r})."
            )
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"The seed must be a non-negative whole number (got {self.seed!r}).")
        if self.n_train is not None and (not _is_int(self.n_train) or self.n_train < 2):
            raise ValueError(f"n_train must be at least 2 examples or None (got {self.n_train!r}).")
        if self.n_eval is not None and (not _is_int(self.n_eval) or self.n_eval < 1):
            raise ValueError(
                f"n_eval must be a positive whole number or None (got {self.n_eval!r})."
            )
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"Unknown pooling {self.pooling!r}: choose one of {', '.join(POOLINGS)}."
            )
        wd = self.weight_decay
        if not _is_number(wd) or not math.isfinite(wd) or wd < 0:
            raise ValueError(f"Weight decay must be a finite number ≥ 0 (got {wd!r}).")
        set_(self, "weight_decay", float(wd))
        if not _is_number(self.warmup) or not 0 <= self.warmup < 1:
            raise ValueError(
                f"warmup is the share of steps spent warming up, in [0, 1) (got {self.warmup!r})."
            )
        set_(self, "warmup", float(self.warmup))
        every = self.trajectory_every
        if every is not None and (not _is_int(every) or every < 1):
            raise ValueError(
                f"trajectory_every must be a positive number of steps or None (got {every!r})."
            )
        if self.trajectory_dtype not in TRAJECTORY_DTYPES:
            raise ValueError(
                f"Unknown trajectory dtype {self.trajectory_dtype!r}: choose one of "
                f"{', '.join(TRAJECTORY_DTYPES)}."
            )
        if self.device is not None:
            import torch

            try:
                torch.device(self.device)
            except (RuntimeError, TypeError):
                raise ValueError(
                    f"Unknown device {self.device!r} (e.g. 'cpu', 'cuda:0')."
                ) from None
        if not isinstance(self.mixed_precision, bool):
            raise ValueError("mixed_precision must be true or false.")

    # -- derived values --------------------------------------------------------------------------

    @property
    def head_layer(self) -> int | None:
        """ℓ_head when given (the model is cut there); None = the model's top layer L."""
        return self.layers[2] if self.layers is not None else None

    def resolved_layers(self, n_layers: int) -> tuple[int, int, int]:
        """(ℓ_bottom, ℓ_top, ℓ_head) with the default (1, L, L) filled in."""
        return self.layers if self.layers is not None else (1, n_layers, n_layers)

    def placement(self, n_layers: int) -> tuple[int, ...]:
        """Layers that get adapters / LoRA: the explicit list, else ℓ_bottom..ℓ_top, else all."""
        explicit = {"adapter": self.adapter_layers, "lora": self.lora_layers}.get(self.method)
        if explicit is not None:
            return explicit
        bottom, top, _ = self.resolved_layers(n_layers)
        return tuple(range(bottom, top + 1))

    def check_model(self, n_layers: int, n_heads: int) -> None:
        """The checks that need the model: every layer within 1..L, every head within 0..H-1."""
        used: list[tuple[str, int]] = []
        if self.layers is not None:
            used += [("layers", x) for x in self.layers]
        used += [("adapter_layers", x) for x in self.adapter_layers or ()]
        used += [("lora_layers", x) for x in self.lora_layers or ()]
        used += [("heads", layer) for layer, _ in self.heads or ()]
        for name, layer in used:
            if layer > n_layers:
                raise ValueError(
                    f"{name} uses layer {layer}, but this model has {n_layers} layers (1..{n_layers})."
                )
        for layer, heads in self.heads or ():
            if max(heads) >= n_heads:
                raise ValueError(
                    f"Head selection of layer {layer} uses head {max(heads)}, but this model has "
                    f"{n_heads} heads per layer (0..{n_heads - 1})."
                )

    # -- JSON --------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists; heads become {"layer": [heads]})."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("model", "data"):
                value = {g.name: getattr(value, g.name) for g in fields(value)}
            elif f.name == "heads" and value is not None:
                value = {str(layer): list(heads) for layer, heads in value}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> FinetuneConfig:
        """Inverse of `to_dict` (unknown keys are an error, missing keys take their defaults)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise ValueError(f"Unknown fine-tuning config keys: {', '.join(unknown)}.")
        kwargs = dict(payload)
        for name, spec_class in (("model", ModelSpec), ("data", DataSpec)):
            if isinstance(kwargs.get(name), Mapping):
                try:
                    kwargs[name] = spec_class(**kwargs[name])
                except TypeError as exc:
                    raise ValueError(f"Bad {name} spec in a fine-tuning config: {exc}") from None
        for name in ("layers", "adapter_layers", "lora_layers"):
            if isinstance(kwargs.get(name), list):
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)
