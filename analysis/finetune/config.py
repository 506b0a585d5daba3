"""One fine-tuning run, as a frozen, self-validating config (docs/explanation/strategies.md).

The same object drives the page's form, the CLI, the runs database (``to_dict`` / ``from_dict``)
and the engine. What every run shares (budget, optimiser, data sizes, device) are fields of
`FinetuneConfig`; what only one method uses lives in that method's options, a small frozen
dataclass that validates itself, declared in the method's own module
(``analysis/finetune/methods/<name>.py``), as PEFT's ``LoraConfig`` does. The accepted methods and
their default body learning rates come from the method registry (`analysis.finetune.registry`).
Each setting's help text is declared once, in its field's metadata, and read by the CLI and the
page (`analysis.config.help_of`). Checks that need the model's shape (layers within 1..L, heads
within 0..H-1) run in `FinetuneConfig.check_model` once the model is loaded.

The stored form (``to_dict``) keeps the method's options under ``"options"`` and the
classifier's layer under ``"classifier_layer"`` (`analysis.finetune.stored`); `flat_config`
takes the options flat, by their flat names.

The fresh classifier trains with its own learning rate, ``classifier_lr`` (1e-3 for every
method), in its own AdamW parameter group: so "frozen" and "top layer only" differ only in what
the body trains. Runs that do not learn are flagged by `analysis.runs.chance`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from analysis.config import POOLINGS, DataSpec, ModelSpec, setting
from analysis.finetune.registry import default_lr, method_spec
from analysis.finetune.spec import (
    DEFAULT_CLASSIFIER_LR,
    LR_GRID,
    is_int,
    is_number,
    layer_list,
    options_json,
)
from analysis.finetune.stored import config_kwargs
from analysis.subspace.budget import resolve_every

__all__ = ["FinetuneConfig", "canonical", "flat_config", "grid_factors", "layer_list", "lr_scaled"]
TRAJECTORY_DTYPES = ("float32", "float16", "bfloat16")
OptionsT = TypeVar("OptionsT")
# Whole-number settings: field → (least value, None allowed, the rule a bad value is told).
WHOLE_SETTINGS = {
    "steps": (1, False, "steps (the number of optimizer steps) must be a positive whole number"),
    "batch_size": (1, False, "batch_size (the batch size) must be a positive whole number"),
    "eval_every": (1, False, "eval_every (the evaluation interval (steps)) must be a positive "
                   "whole number"),
    "seed": (0, False, "The seed must be a non-negative whole number"),
    "n_train": (2, True, "n_train must be at least 2 examples or None"),
    "n_eval": (1, True, "n_eval must be a positive whole number or None"),
}  # fmt: skip
# Real-valued settings: field → (what a valid value satisfies, the rule a bad value is told).
REAL_SETTINGS: dict[str, tuple[Callable[[float], bool], str]] = {
    "lr": (lambda x: x > 0, "The learning rate must be a positive finite number"),
    "classifier_lr": (lambda x: x > 0,
                      "The classifier's learning rate must be a positive finite number"),
    "weight_decay": (lambda x: x >= 0, "Weight decay must be a finite number ≥ 0"),
    "warmup": (lambda x: 0 <= x < 1, "warmup is the share of steps spent warming up, in [0, 1)"),
}  # fmt: skip


# -- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run. Layers are 1-based, heads 0-based.

    method: what trains besides the fresh classifier, which always trains: a method of the
      registry (``full``, ``layers``, ``heads``, ``adapter``, ``lora``, ``ia3``, ``bitfit``,
      ``frozen``, ``subspace``…; `analysis.finetune.registry.method_specs`).
    options: the method's options (its module's options dataclass); None takes its defaults (an
      error where the method needs a choice: the heads of ``heads``, the source run of
      ``subspace``).
    layers: (ℓ_bottom, ℓ_top, ℓ_cls): layers ℓ_bottom..ℓ_top train and the classifier reads
      layer ℓ_cls (`classifier_layer`), the layers above it removed. Required for ``layers``;
      every other method uses only ℓ_cls, and methods that place modules (adapter, LoRA, IA3)
      take ℓ_bottom..ℓ_top as their default placement. None = (1, L, L).
    lr: None picks the method's default body rate; after construction it is a float.
    """

    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    method: str = setting("full", help="what trains besides the classifier")
    layers: tuple[int, int, int] | None = setting(
        None, help="ℓ_bottom,ℓ_top,ℓ_cls, e.g. 1,3,3: layers ℓ_bottom..ℓ_top train, the "
        "classifier reads ℓ_cls and the layers above it are removed"
    )  # fmt: skip
    options: Any = setting(None, help="the method's own options")
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
                    f"Method {self.method!r} needs layers = (ℓ_bottom, ℓ_top, ℓ_cls), "
                    "e.g. (1, 3, 3)."
                )
            return
        layers = tuple(self.layers) if not isinstance(self.layers, str) else ()
        if len(layers) != 3 or not all(is_int(x) for x in layers):
            raise ValueError(
                f"layers must be three whole numbers (ℓ_bottom, ℓ_top, ℓ_cls), got {self.layers!r}."
            )
        bottom, top, classifier = layers
        if min(layers) < 1:
            raise ValueError(f"Layers are numbered from 1 (0 is the embeddings); got {layers!r}.")
        if bottom > top:
            raise ValueError(f"ℓ_bottom ({bottom}) must not be above ℓ_top ({top}).")
        if classifier < top:
            raise ValueError(
                f"The classifier's layer ℓ_cls ({classifier}) must not be below ℓ_top ({top}): "
                "the layers above it are removed, so they cannot be trained."
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
        object.__setattr__(self, "options", options)
        top, used = self.classifier_layer, self.layers_used()
        if top is not None and used and max(used) > top:
            raise ValueError(
                f"{self.method} uses layer {max(used)}, above the classifier's layer ℓ_cls = "
                f"{top}: the layers above it are removed."
            )

    def _check_training(self) -> None:
        for name, (least, optional, rule) in WHOLE_SETTINGS.items():
            value = getattr(self, name)
            if not (optional and value is None) and (not is_int(value) or value < least):
                raise ValueError(f"{rule} (got {value!r}).")
        object.__setattr__(self, "lr", default_lr(self.method) if self.lr is None else self.lr)
        for name, (ok, rule) in REAL_SETTINGS.items():
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) or not ok(value):
                raise ValueError(f"{rule} (got {value!r}).")
            object.__setattr__(self, name, float(value))
        if not is_int(self.max_length) or not 8 <= self.max_length <= 4096:
            raise ValueError(
                f"Max length must be between 8 and 4096 tokens (got {self.max_length!r})."
            )
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"Unknown pooling {self.pooling!r}: choose one of {', '.join(POOLINGS)}."
            )
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
        check_device(self.device)
        if not isinstance(self.mixed_precision, bool):
            raise ValueError("mixed_precision must be true or false.")

    # -- derived values --------------------------------------------------------------------------

    @property
    def classifier_layer(self) -> int | None:
        """ℓ_cls, the layer the classifier reads, when given (the model is cut there); None =
        the model's top layer L."""
        return self.layers[2] if self.layers is not None else None

    def option(self, kind: str) -> Any:
        """The value of the method's first option of this kind (`analysis.finetune.spec`:
        ``heads``, ``run``, ``layers``…), or None when it has none."""
        for field in method_spec(self.method).fields:
            if field.kind == kind and self.options is not None:
                return getattr(self.options, field.name)
        return None

    def layers_used(self) -> tuple[int, ...]:
        """Every layer the options name (options of kind layers, per_layer and heads)."""
        used: set[int] = set()
        for field in method_spec(self.method).fields if self.options is not None else ():
            value = getattr(self.options, field.name)
            if value is None:
                continue
            if field.kind == "layers":
                used.update(value)
            elif field.kind == "per_layer":
                used.update(layer for layer, _ in value)
            elif field.kind == "heads":
                used.update(layer for layer, _ in value.layers)
        return tuple(sorted(used))

    def options_for(self, options_class: type[OptionsT]) -> OptionsT:
        """The options, checked to be of ``options_class`` (a preparer asks for its own)."""
        if not isinstance(self.options, options_class):
            raise TypeError(
                f"Method {self.method!r} has {type(self.options).__name__}, not "
                f"{options_class.__name__}."
            )
        return self.options

    def resolved_layers(self, n_layers: int) -> tuple[int, int, int]:
        """(ℓ_bottom, ℓ_top, ℓ_cls) with the default (1, L, L) filled in."""
        return self.layers if self.layers is not None else (1, n_layers, n_layers)

    def placement(self, n_layers: int) -> tuple[int, ...]:
        """Layers a method places its modules in (adapters, LoRA, IA3): its option of kind
        layers, else ℓ_bottom..ℓ_top, else all."""
        explicit = self.option("layers")
        if explicit is not None:
            return explicit
        bottom, top, _ = self.resolved_layers(n_layers)
        return tuple(range(bottom, top + 1))

    def check_model(self, n_layers: int, n_heads: int) -> None:
        """The checks that need the model: every layer within 1..L, every head within 0..H-1."""
        used = [("layers", x) for x in self.layers or ()]
        used += [(self.method, x) for x in self.layers_used()]
        for name, layer in used:
            if layer > n_layers:
                raise ValueError(
                    f"{name} uses layer {layer}, but this model has {n_layers} layers (1..{n_layers})."
                )
        selection = self.option("heads")
        if selection is not None:
            selection.check_fits(n_layers, n_heads)

    # -- the stored form ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The stored form: JSON-ready, the method's options under "options", the layers as
        ``"layers": [ℓ_bottom, ℓ_top]`` and ``"classifier_layer": ℓ_cls``
        (`analysis.finetune.stored`)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "layers":
                out["layers"] = list(value[:2]) if value else None
                out["classifier_layer"] = value[2] if value else None
                continue
            if f.name == "options":
                value = options_json(method_spec(self.method), value)
            elif f.name in ("model", "data"):
                value = dataclasses.asdict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> FinetuneConfig:
        """Inverse of `to_dict` (unknown keys are an error, missing keys take their defaults;
        a method's options may also be given flat, as `flat_config` takes them)."""
        return cls(**config_kwargs(payload, {f.name for f in fields(cls)}, stored=True))


def check_device(device: str | None) -> None:
    """A ValueError unless ``device`` is None or a device torch knows ("cpu", "cuda:0")."""
    if device is None:
        return
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"Unknown device {device!r} (e.g. 'cpu', 'cuda:0').") from None


def canonical(cfg: FinetuneConfig, n_layers: int) -> FinetuneConfig:
    """``cfg`` under its one name on a model of ``n_layers`` layers (its method's
    ``MethodSpec.canonical``: layers (1, L, L) trains everything, embeddings included, which is
    full fine-tuning), so it is queued, labelled and grouped once."""
    same_as = method_spec(cfg.method).canonical
    return cfg if same_as is None else same_as(cfg, n_layers)


def grid_factors(method: str, factors: tuple[float, ...] = LR_GRID) -> tuple[float, ...]:
    """The body learning-rate multipliers a grid tries for ``method``: ``factors``, or (1.0,)
    for a method whose body does not train (frozen)."""
    return factors if method_spec(method).has_body else (1.0,)


def lr_scaled(cfg: FinetuneConfig, factor: float) -> FinetuneConfig:
    """``cfg`` with its body learning rate (given, or the method's default) times ``factor``."""
    return cfg if factor == 1.0 else dataclasses.replace(cfg, lr=cfg.lr * factor)


def flat_config(**kwargs: Any) -> FinetuneConfig:
    """A config from flat keyword arguments, each option under its flat name
    (``flat_config(method="lora", lora_r=4, layers=(1, 3, 3))``)."""
    return FinetuneConfig(**config_kwargs(kwargs, {f.name for f in fields(FinetuneConfig)}))
