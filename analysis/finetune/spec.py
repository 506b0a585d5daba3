"""What a fine-tuning method declares about itself (`MethodSpec`), and its options' fields.

Every method is one module under ``analysis/finetune/methods/`` that declares one ``SPEC``;
`analysis.finetune.registry` collects them. Everything else is derived from the specs: the
names `FinetuneConfig` accepts, its flat JSON keys, the CLI's flags, the Fine-tune page's fields,
the runs database's labels, the figures' colours and the default learning rates. Adding a method
is adding one module (and its tests).

An options dataclass declares each field with ``setting(default, help=…, flat=…, kind=…)``
(`analysis.config.setting`): its help text, its flat JSON key (the
runs database has stored these keys since its first version, e.g. ``lora_r``) and its kind, which
says how the CLI parses it and which widget the page draws:

=========  ============================  ==============================================
kind       CLI                           page
=========  ============================  ==============================================
layers     ``--adapter-layers 3,4``      a multiselect of the model's layers
int        ``--lora-r 4``                a whole-number field
float      ``--lora-alpha 16``           a number field
text       ``--subspace-from RUN_ID``    a text field
heads      ``--heads FILE`` (selection)  a heads-file upload (default: the Heads page's)
=========  ============================  ==============================================

This module is free of torch (the CLI's ``--help`` reads the specs); a method's preparer imports
torch when it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig
    from analysis.finetune.model import EncoderClassifier
    from analysis.finetune.prepared import MethodInputs, Prepared
    from analysis.models import LoadedModel

    Preparer = Callable[[EncoderClassifier, FinetuneConfig, MethodInputs], Prepared]
    # (cfg, loaded) -> the method's part of a recipe's "train" (`MethodSpec`, export)
    ExportHook = Callable[[FinetuneConfig, LoadedModel], dict[str, Any]]

OPTION_KINDS = ("layers", "int", "float", "text", "heads")
# The classifier's learning rate, the same for every method (SPEC.md, "Learning rates").
DEFAULT_CLASSIFIER_LR = 1e-3
# A learning-rate grid multiplies each method's body rate by these (SPEC.md, "Learning rates").
LR_GRID = (0.5, 1.0, 2.0)
# The keys an export hook may return: the parts of a recipe's "train" beyond what the export
# reads off the prepared model (`analysis.export.build`; `tunescope_recipe.apply_recipe` reads
# "adapters", PEFT's adapter_config.json is written from "lora").
EXPORT_KEYS = ("adapters", "lora")


@dataclass(frozen=True)
class OptionField:
    """One option of one method, as the CLI and the page see it."""

    name: str  # the dataclass field
    flat: str  # the flat JSON key and (with dashes) the CLI flag
    kind: str
    help: str
    default: Any  # None where the method needs a choice
    required: bool = False  # no default: the method cannot run without it

    @property
    def flag(self) -> str:
        return "--" + self.flat.replace("_", "-")


def option_fields(options: type | None) -> tuple[OptionField, ...]:
    """The `option` fields of an options dataclass (none for a method without options)."""
    if options is None:
        return ()
    out = []
    for f in dataclasses.fields(options):
        required = f.default is dataclasses.MISSING
        meta = f.metadata
        if meta.get("kind") not in OPTION_KINDS:
            raise ValueError(
                f"{options.__name__}.{f.name}: give its flat key and one of the kinds "
                f"{', '.join(OPTION_KINDS)} (setting(..., flat=..., kind=...))."
            )
        default = None if required else f.default
        out.append(OptionField(f.name, meta["flat"], meta["kind"], meta["help"], default, required))
    return tuple(out)


def default_run_label(config: Mapping[str, Any]) -> str:
    """A run's short name: its method, and ``@ℓ_head`` where the classifier reads a lower layer."""
    return str(config.get("method", "?")) + at_head(config)


def at_head(config: Mapping[str, Any]) -> str:
    """`` @3`` when the config names its layers (the classifier reads layer ℓ_head), else ""."""
    layers = config.get("layers")
    return f" @{layers[2]}" if layers else ""


@dataclass(frozen=True)
class MethodSpec:
    """One fine-tuning method.

    name: what ``--method`` and the stored configs call it. label: one line for the page's method
      list. colour: its colour in the figures; None = coloured by its layer strategy's family
      (full and layers runs are ℓ*-down / ℓ*-up / baseline points). default_lr: the body learning
      rate when none is given (SPEC.md, "Learning rates"). options: its options dataclass (fields
      made with `option`) or None. prepare: ``(model, cfg, inputs) -> Prepared``, which imports
      torch only when called. order: its place in every list. sweep: its place among a sweep's
      whole-model baselines (None: not a sweep strategy). needs_layers: the config must give
      (ℓ_bottom, ℓ_top, ℓ_head). has_body: something besides the classifier trains (a
      learning-rate grid varies the body rate, so a method without one runs once). missing: what
      to ask for when the options cannot take their defaults. check: further checks of the
      options (a ValueError). run_label: the run's short name from its flat config.
      export: how a run of this method goes into a recipe for the user's own training
      (`analysis.export.build`). ``export(cfg, loaded) -> dict`` (``loaded``: the
      `analysis.models.LoadedModel`, uncut) returns the method's fragment of the recipe's
      ``train``: ``{}`` when everything that trains is read off the prepared model (which
      tensors have ``requires_grad``, which rows the gradient masks keep: `export_as_prepared`),
      else the keys of `EXPORT_KEYS` (``adapters``: the modules to insert; ``lora``: the PEFT
      LoRA settings). It is called before any model is built; a method that cannot be
      expressed in a plain transformers / PEFT pipeline raises a ValueError with its reason
      (`refuse_export`), and the export says "Method 'x' cannot be exported: <reason>." None:
      the method declares no export, and the export refuses it with a generic message.
    """

    name: str
    label: str
    colour: str | None
    default_lr: float
    prepare: Preparer
    options: type | None = None
    order: int = 100
    sweep: int | None = None
    needs_layers: bool = False
    has_body: bool = True
    missing: str | None = None
    check: Callable[[Any], None] | None = None
    run_label: Callable[[Mapping[str, Any]], str] = default_run_label
    export: ExportHook | None = None

    @property
    def fields(self) -> tuple[OptionField, ...]:
        return option_fields(self.options)

    def default_options(self) -> Any:
        """The options with every default, or None where the method needs a choice."""
        if self.options is None or any(f.required for f in self.fields):
            return None
        return self.options()


# -- helpers the method modules share ------------------------------------------------------------


def export_as_prepared(cfg: FinetuneConfig, loaded: LoadedModel) -> dict[str, Any]:
    """The export hook of a method whose recipe is all read off the prepared model."""
    return {}


def refuse_export(reason: str) -> ExportHook:
    """The export hook of a method the export cannot express: it raises a ValueError with
    ``reason`` (why no transformers / PEFT setting says what the method does)."""

    def refuse(cfg: FinetuneConfig, loaded: LoadedModel) -> dict[str, Any]:
        raise ValueError(reason)

    return refuse


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def layer_list(value: Any, what: str) -> tuple[int, ...]:
    """A sorted tuple of distinct 1-based layer numbers, or a ValueError naming ``what``."""
    try:
        layers = tuple(value)
    except TypeError:
        raise ValueError(f"{what} must be a list of layer numbers (got {value!r}).") from None
    if not layers:
        raise ValueError(f"{what} is empty: give at least one layer.")
    if not all(is_int(x) for x in layers):
        raise ValueError(f"{what} must be whole layer numbers (got {value!r}).")
    if any(x < 1 for x in layers):
        raise ValueError(
            f"{what}: layers are numbered from 1 (0 is the embeddings); got {value!r}."
        )
    if len(set(layers)) != len(layers):
        raise ValueError(f"{what} lists a layer twice ({value!r}).")
    return tuple(sorted(layers))


def span(layers: tuple[int, ...]) -> str:
    """``1..3`` for a contiguous run of layers, else ``1, 3``."""
    if len(layers) > 1 and layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


def short_source(source: str) -> str:
    """A run id's random tail (``ab12cd``) or a trajectory folder's name."""
    name = Path(source).name if ("/" in source or "\\" in source) else source
    return name.rsplit("-", 1)[-1] if name.count("-") >= 2 else name
