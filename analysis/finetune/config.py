"""One fine-tuning run, as a frozen, self-validating config (SPEC.md, "Strategies" and "Heads").

The same object drives the page's form, the CLI, the runs database (``to_dict`` / ``from_dict``)
and the engine. What every run shares (budget, optimiser, data sizes, device) are fields of
`FinetuneConfig`; what only one method uses lives in that method's options, a small frozen
dataclass that validates itself, declared in the method's own module
(``analysis/finetune/methods/<name>.py``: `HeadsOptions`, `AdapterOptions`, `LoraOptions`,
`SubspaceOptions`, re-exported here), as PEFT's ``LoraConfig`` does. The accepted methods, their
default body learning rates and their flat JSON keys come from the method registry
(`analysis.finetune.registry`). Each setting's help text is declared once, in its field's
metadata, and read by the CLI and the page (`analysis.config.help_of`). Checks that need the
model's shape (layers within 1..L, heads within 0..H-1) run in `FinetuneConfig.check_model`
once the model is loaded.

The JSON form (``to_dict``) is flat, as stored in the runs database since its first version:
each option sits beside the common keys under its flat key (``heads``, ``adapter_layers``,
``adapter_size``, ``lora_r``, ``lora_alpha``, ``lora_layers``, ``subspace_from``).

The fresh classifier trains with its own learning rate, ``classifier_lr`` (1e-3 for every
method), in its own AdamW parameter group: so "frozen" and "top layer only" differ only in what
the body trains (SPEC.md, "Learning rates"). Its flat JSON key is ``head_lr``, as stored since it
existed (so stored runs keep their run groups); ``from_dict`` takes either name. Configs stored
before it existed load with the default; their classifier actually trained at ``lr``
(`analysis.runs.record.migrate_config` says so).

A heads run also stores where its selection came from (``heads_settings``: the selector, k,
PageRank settings… of `HeadSelection.settings`), so a PageRank run and a random-heads run of the
same size tell themselves apart; configs stored before that load with empty settings.

Default body learning rates are each method's ``MethodSpec.default_lr`` (its module says why;
override with ``lr``).

The defaults learn (measured, issue 20): the default full run of MiniLM on movie snippets (200
steps, batch 16, the whole train part, body 5e-5, classifier 1e-3) scored test accuracy 0.833
against the majority class's 0.501, in 597 s on a shared 2-core CPU. Runs that do not learn are
flagged by `analysis.runs.chance`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from analysis.config import POOLINGS, DataSpec, ModelSpec, setting
from analysis.finetune.methods.adapter import AdapterOptions
from analysis.finetune.methods.heads import HeadsOptions
from analysis.finetune.methods.lora import LoraOptions
from analysis.finetune.methods.subspace import SubspaceOptions
from analysis.finetune.registry import default_lr, flat_defaults, method_spec, option_owners
from analysis.finetune.spec import DEFAULT_CLASSIFIER_LR, LR_GRID, is_int, is_number, layer_list
from analysis.heads.selection_file import HeadSelection, layers_json
from analysis.subspace.budget import resolve_every

__all__ = ["AdapterOptions", "FinetuneConfig", "HeadsOptions", "LoraOptions", "SubspaceOptions",
           "flat_config", "layer_list", "options_from_flat"]  # fmt: skip
TRAJECTORY_DTYPES = ("float32", "float16", "bfloat16")
# Fields whose flat JSON key is another (older) name: stored configs and run groups keep it.
STORED_NAMES = {"classifier_lr": "head_lr"}
# The options of the built-in methods (a method's own module declares them; any options class
# of a registered method is accepted).
MethodOptions = Any
OptionsT = TypeVar("OptionsT")


# -- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run. Layers are 1-based (SPEC), heads 0-based.

    method: what trains (besides the fresh classifier, which always trains)
      - ``full``: everything, embeddings included.
      - ``layers``: layers ℓ_bottom..ℓ_top of ``layers`` = (ℓ_bottom, ℓ_top, ℓ_head); embeddings
        only for (1, L, L).
      - ``heads``: the Q/K/V rows and bias entries of a head selection (`HeadsOptions`).
      - ``adapter``: Houlsby adapters and the LayerNorms of some layers (`AdapterOptions`).
      - ``lora``: LoRA on query and value of some layers (`LoraOptions`).
      - ``bitfit``: every bias. ``frozen``: nothing but the classifier.
      - ``subspace`` / ``subspace-random``: subspace coordinates (`SubspaceOptions`,
        `analysis.finetune.subspace`).
    options: the method's options; None takes the method's defaults (an error where the method
      needs a choice: the heads of ``heads``, the source run of ``subspace``).
    layers: for ``layers`` required; for every other method only ℓ_head is used (the classifier
      reads layer ℓ_head and the layers above it are removed), and for adapter / lora
      ℓ_bottom..ℓ_top is the default placement. None = (1, L, L).
    lr: None picks the method's default (module docstring); after construction it is a float.
    """

    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    method: str = setting("full", help="what trains besides the classifier")
    layers: tuple[int, int, int] | None = setting(
        None, help="ℓ_bottom,ℓ_top,ℓ_head, e.g. 1,3,3: layers ℓ_bottom..ℓ_top train, the "
        "classifier reads ℓ_head and the layers above it are removed"
    )  # fmt: skip
    options: MethodOptions | None = setting(None, help="the method's own options")
    steps: int = setting(200, help="optimizer steps")
    lr: float | None = setting(
        None, help="learning rate of the encoder's trained parameters (blank: the method's "
        "default: its spec's default_lr)"
    )  # fmt: skip
    classifier_lr: float = setting(
        DEFAULT_CLASSIFIER_LR,
        help="learning rate of the fresh classifier, the same for every method",
    )
    batch_size: int = setting(16, help="examples per training step")
    max_length: int = setting(128, help="tokens kept per example")
    seed: int = setting(0, help="training seed (classifier init, data order, subsets)")
    n_train: int | None = setting(None, help="train examples used, a seeded subset (default all)")
    n_eval: int | None = setting(
        1000, help="dev and test examples scored at most (the same subset for every run)"
    )
    eval_every: int = setting(50, help="score the dev part every k steps (model selection)")
    pooling: str = setting("mean", help="mean of the real tokens, or the first token")
    weight_decay: float = setting(0.01, help="AdamW weight decay of the matrices")
    warmup: float = setting(0.1, help="share of the steps spent warming the learning rate up")
    trajectory_every: int | None = setting(
        None, help="snapshot every layer's weights every k steps (for the Subspaces page); "
        "'auto': k = ⌈steps / 32⌉, at most 32 snapshots"
    )  # fmt: skip
    trajectory_dtype: str = setting("float32", help="dtype the snapshots are stored in")
    zero_weights: str | None = setting(
        None, help="JSON file of encoder weights set to zero before training (disable experiment)"
    )
    device: str | None = setting(None, help="cpu, cuda:0… (default: the GPU when there is one)")
    mixed_precision: bool = setting(True, help="bf16 / fp16 autocast on CUDA (ignored on CPU)")

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise ValueError("model must be a ModelSpec.")
        if not isinstance(self.data, DataSpec):
            raise ValueError("data must be a DataSpec.")
        method_spec(self.method)  # an unknown method: a ValueError naming the known ones
        self._check_layers()
        self._check_options()
        self._check_training()

    def _check_layers(self) -> None:
        if self.layers is None:
            if method_spec(self.method).needs_layers:
                raise ValueError(
                    f"Method {self.method!r} needs layers = (ℓ_bottom, ℓ_top, ℓ_head), e.g. (1, 3, 3)."
                )
            return
        layers = tuple(self.layers) if not isinstance(self.layers, str) else ()
        if len(layers) != 3 or not all(is_int(x) for x in layers):
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
        object.__setattr__(self, "layers", layers)

    def _check_options(self) -> None:
        spec = method_spec(self.method)
        wanted = spec.options
        options = self.options
        if wanted is None:
            if options is not None:
                raise ValueError(
                    f"Method {self.method!r} takes no options ({type(options).__name__} "
                    "belongs to another method)."
                )
            return
        if options is None:
            options = spec.default_options()
            if options is None:
                raise ValueError(f"Method {self.method!r} needs {spec.missing or 'its options'}.")
        if not isinstance(options, wanted):
            raise ValueError(
                f"Method {self.method!r} takes {wanted.__name__}, not {type(options).__name__}."
            )
        if spec.check is not None:
            spec.check(options)
        head = self.head_layer
        used = options.layers_used() if hasattr(options, "layers_used") else ()
        if head is not None and used and max(used) > head:
            raise ValueError(
                f"{self.method} uses layer {max(used)}, above ℓ_head = {head}: the layers above "
                "ℓ_head are removed."
            )
        object.__setattr__(self, "options", options)

    def _check_training(self) -> None:
        positive_ints = {
            "steps": "the number of optimizer steps",
            "batch_size": "the batch size",
            "eval_every": "the evaluation interval (steps)",
        }
        for name, what in positive_ints.items():
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(
                    f"{name} ({what}) must be a positive whole number (got {value!r})."
                )
        lr = default_lr(self.method) if self.lr is None else self.lr
        if not is_number(lr) or not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"The learning rate must be a positive finite number (got {lr!r}).")
        object.__setattr__(self, "lr", float(lr))
        rate = self.classifier_lr
        if not is_number(rate) or not math.isfinite(rate) or rate <= 0:
            raise ValueError(
                f"The classifier's learning rate must be a positive finite number (got {rate!r})."
            )
        object.__setattr__(self, "classifier_lr", float(rate))
        if not is_int(self.max_length) or not 8 <= self.max_length <= 4096:
            raise ValueError(
                f"Max length must be between 8 and 4096 tokens (got {self.max_length!r})."
            )
        if not is_int(self.seed) or self.seed < 0:
            raise ValueError(f"The seed must be a non-negative whole number (got {self.seed!r}).")
        if self.n_train is not None and (not is_int(self.n_train) or self.n_train < 2):
            raise ValueError(f"n_train must be at least 2 examples or None (got {self.n_train!r}).")
        if self.n_eval is not None and (not is_int(self.n_eval) or self.n_eval < 1):
            raise ValueError(
                f"n_eval must be a positive whole number or None (got {self.n_eval!r})."
            )
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"Unknown pooling {self.pooling!r}: choose one of {', '.join(POOLINGS)}."
            )
        wd = self.weight_decay
        if not is_number(wd) or not math.isfinite(wd) or wd < 0:
            raise ValueError(f"Weight decay must be a finite number ≥ 0 (got {wd!r}).")
        object.__setattr__(self, "weight_decay", float(wd))
        if not is_number(self.warmup) or not 0 <= self.warmup < 1:
            raise ValueError(
                f"warmup is the share of steps spent warming up, in [0, 1) (got {self.warmup!r})."
            )
        object.__setattr__(self, "warmup", float(self.warmup))
        every = resolve_every(self.trajectory_every, self.steps)  # "auto" → ⌈steps / 32⌉
        object.__setattr__(self, "trajectory_every", every)
        if every is not None and (not is_int(every) or every < 1):
            raise ValueError(
                f"trajectory_every must be a positive number of steps or None (got {every!r})."
            )
        if self.trajectory_dtype not in TRAJECTORY_DTYPES:
            raise ValueError(
                f"Unknown trajectory dtype {self.trajectory_dtype!r}: choose one of "
                f"{', '.join(TRAJECTORY_DTYPES)}."
            )
        if self.zero_weights is not None and (
            not isinstance(self.zero_weights, str) or not self.zero_weights.strip()
        ):
            raise ValueError("zero_weights must be the path of a JSON file.")
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

    @property
    def heads(self) -> HeadSelection | None:
        """The head selection of method ``heads`` (None for every other method)."""
        return self.options.heads if isinstance(self.options, HeadsOptions) else None

    @property
    def subspace_from(self) -> str | None:
        """The source run of the subspace methods (None for every other method)."""
        return self.options.source if isinstance(self.options, SubspaceOptions) else None

    def options_for(self, options_class: type[OptionsT]) -> OptionsT:
        """The options, checked to be of ``options_class`` (a preparer asks for its own)."""
        if not isinstance(self.options, options_class):
            raise TypeError(
                f"Method {self.method!r} has {type(self.options).__name__}, not "
                f"{options_class.__name__}."
            )
        return self.options

    def resolved_layers(self, n_layers: int) -> tuple[int, int, int]:
        """(ℓ_bottom, ℓ_top, ℓ_head) with the default (1, L, L) filled in."""
        return self.layers if self.layers is not None else (1, n_layers, n_layers)

    def placement(self, n_layers: int) -> tuple[int, ...]:
        """Layers that get adapters / LoRA: the explicit list, else ℓ_bottom..ℓ_top, else all."""
        explicit = getattr(self.options, "layers", None)
        if explicit is not None:
            return explicit
        bottom, top, _ = self.resolved_layers(n_layers)
        return tuple(range(bottom, top + 1))

    def check_model(self, n_layers: int, n_heads: int) -> None:
        """The checks that need the model: every layer within 1..L, every head within 0..H-1."""
        used = [("layers", x) for x in self.layers or ()]
        used += [(self.method, x) for x in getattr(self.options, "layers_used", tuple)()]
        for name, layer in used:
            if layer > n_layers:
                raise ValueError(
                    f"{name} uses layer {layer}, but this model has {n_layers} layers (1..{n_layers})."
                )
        if self.heads is not None:
            self.heads.check_fits(n_layers, n_heads)

    # -- JSON --------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A flat, JSON-ready dict (tuples become lists; heads become {"layer": [heads]})."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "options":
                out.update(self._flat_options())
                continue
            if f.name in ("model", "data"):
                value = dataclasses.asdict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[STORED_NAMES.get(f.name, f.name)] = value
        return out

    def _flat_options(self) -> dict[str, Any]:
        flat = flat_defaults()
        spec = method_spec(self.method)
        for f in spec.fields if self.options is not None else ():
            value = getattr(self.options, f.name)
            if isinstance(value, HeadSelection):
                flat[f"{f.flat}_settings"] = dict(value.settings) or None
                value = layers_json(value.layers)
            elif isinstance(value, tuple):
                value = list(value)
            flat[f.flat] = value
        return flat

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> FinetuneConfig:
        """Inverse of `to_dict` (unknown keys are an error, missing keys take their defaults).

        A flat method key that the method does not use must hold its default (``heads`` for
        method ``full`` is an error, not silently dropped).
        """
        own = {f.name for f in fields(cls)} - {"options"}
        defaults = flat_defaults()
        stored = {key: name for name, key in STORED_NAMES.items()}
        both = [k for k in STORED_NAMES if k in payload and STORED_NAMES[k] in payload]
        if both:
            raise ValueError(f"Give {both[0]} or {STORED_NAMES[both[0]]}, not both.")
        unknown = sorted(set(payload) - own - set(defaults) - set(stored))
        if unknown:
            raise ValueError(f"Unknown fine-tuning config keys: {', '.join(unknown)}.")
        kwargs = {stored.get(k, k): v for k, v in payload.items() if k in own or k in stored}
        for name, spec_class in (("model", ModelSpec), ("data", DataSpec)):
            if isinstance(kwargs.get(name), Mapping):
                try:
                    kwargs[name] = spec_class(**kwargs[name])
                except TypeError as exc:
                    raise ValueError(f"Bad {name} spec in a fine-tuning config: {exc}") from None
        if isinstance(kwargs.get("layers"), list):
            kwargs["layers"] = tuple(kwargs["layers"])
        method = kwargs.get("method", "full")
        flat = {k: v for k, v in payload.items() if k in defaults}
        kwargs["options"] = options_from_flat(method, flat)
        return cls(**kwargs)


def options_from_flat(method: str, flat: Mapping[str, Any]) -> Any:
    """The options of ``method`` from flat keys (``lora_r``, ``heads``…); None = the defaults.

    A key that belongs to another method must be absent or hold its default.
    """
    spec = method_spec(method)
    defaults, owners = flat_defaults(), option_owners()
    mine = {f.flat: f for f in spec.fields}
    for key, value in flat.items():
        owned = key in mine or (key.endswith("_settings") and key[: -len("_settings")] in mine)
        if not owned and value != defaults[key]:
            takers = owners.get(key, owners.get(key.removesuffix("_settings"), (None, ())))[1]
            raise ValueError(
                f"{key} is only used by method{'s' if len(takers) > 1 else ''} "
                f"{' / '.join(repr(o) for o in takers)}."
            )
    if spec.options is None:
        return None
    given: dict[str, Any] = {}
    for key, f in mine.items():
        value = flat.get(key)
        if value is None:
            if f.required:
                return None  # FinetuneConfig says what is missing
            continue
        if f.kind == "heads" and not isinstance(value, HeadSelection):
            settings = flat.get(f"{key}_settings") or {}
            if not isinstance(settings, Mapping):
                raise ValueError(
                    f"{key}_settings must be a JSON object (the selection's settings)."
                )
            value = HeadSelection(value, settings=dict(settings))
        elif f.kind == "layers" and isinstance(value, list):
            value = tuple(value)
        given[f.name] = value
    return spec.options(**given)


def canonical(cfg: FinetuneConfig, n_layers: int) -> FinetuneConfig:
    """``cfg`` under its one name: layers (1, L, L) trains everything, embeddings included, which
    is full fine-tuning, so it is queued, labelled and grouped as method ``full``."""
    if cfg.method == "layers" and cfg.layers == (1, n_layers, n_layers):
        return dataclasses.replace(cfg, method="full", layers=None)
    return cfg


def grid_factors(method: str, factors: tuple[float, ...] = LR_GRID) -> tuple[float, ...]:
    """The body learning-rate multipliers a grid tries for ``method`` (SPEC.md, "Learning
    rates"): ``factors``, or (1.0,) for a method whose body does not train (frozen)."""
    return factors if method_spec(method).has_body else (1.0,)


def lr_scaled(cfg: FinetuneConfig, factor: float) -> FinetuneConfig:
    """``cfg`` with its body learning rate (given, or the method's default) times ``factor``."""
    return cfg if factor == 1.0 else dataclasses.replace(cfg, lr=cfg.lr * factor)


def flat_config(**kwargs: Any) -> FinetuneConfig:
    """A config from flat keyword arguments, as the JSON form names them
    (``flat_config(method="lora", lora_r=4, layers=(1, 3, 3))``)."""
    return FinetuneConfig.from_dict(kwargs)
