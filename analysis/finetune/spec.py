"""What a fine-tuning method declares about itself (`MethodSpec`), and the pieces its module uses.

Every method is one module under ``analysis/finetune/methods/`` that declares one ``SPEC``;
`analysis.finetune.registry` collects them. Everything else is derived from the specs: the
names `FinetuneConfig` accepts, the CLI's flags, the Fine-tune page's fields, the runs' labels,
the figures' colours, the default learning rates, the export and the recognition of a user's
own Trainer runs. Adding a method is adding one module and its tests (docs/reference/methods.md).

An options dataclass declares each field with ``setting(default, help=…, flat=…, kind=…)``
(`analysis.config.setting`): its help text, its flat name (the CLI flag, with dashes, and the
key configs stored before options were nested used: ``lora_r``) and its kind, which says how the
CLI parses it, which widget the page draws and how the stored config writes it:

- ``layers``: ``--adapter-layers 3,4``; a multiselect of the model's layers; stored [3, 4].
- ``int`` / ``float``: ``--lora-r 4``; a number field; stored 4.
- ``text``: ``--some-name x``; a text field; stored "x".
- ``run``: ``--subspace-from RUN_ID``; a text field (a run id or a folder); stored "RUN_ID".
- ``heads``: ``--heads FILE`` (a selection); a heads-file upload (default: the Heads page's
  selection); stored {"layers": {"1": [0, 3]}, "settings": {…}}.
- ``per_layer``: ``--lora-ranks 3:16,4:8``; a text field ``3:16, 4:8``; stored {"3": 16, "4": 8}.

A stored config holds ``"options"``: the method's own options, by field name, in that JSON form
(`options_json`); nothing of any other method. Layers are 1-based everywhere a user reads them.

This module is free of torch (the CLI's ``--help`` reads the specs); a method's preparer, export
and recogniser import torch or PEFT when they run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPTION_KINDS = ("layers", "int", "float", "text", "run", "heads", "per_layer")
# The classifier's learning rate, the same for every method (docs/explanation/strategies.md).
DEFAULT_CLASSIFIER_LR = 1e-3
# A learning-rate grid multiplies each method's body rate by these.
LR_GRID = (0.5, 1.0, 2.0)

# (model, cfg, inputs) -> Prepared: what trains (`analysis.finetune.prepare`).
Preparer = Callable[[Any, Any, Any], Any]
# (cfg, loaded) -> Exported: the method's part of a recipe (`analysis.export.build`).
ExportHook = Callable[[Any, Any], "Exported"]


@dataclass(frozen=True)
class OptionField:
    """One option of one method, as the CLI and the page see it."""

    name: str  # the dataclass field, and its key under a stored config's "options"
    flat: str  # the CLI flag (with dashes) and the key of configs stored flat
    kind: str
    help: str
    default: Any  # None where the method needs a choice
    required: bool = False  # no default: the method cannot run without it

    @property
    def flag(self) -> str:
        return "--" + self.flat.replace("_", "-")


def option_fields(options: type | None) -> tuple[OptionField, ...]:
    """The `setting` fields of an options dataclass (none for a method without options)."""
    if options is None:
        return ()
    out = []
    for f in dataclasses.fields(options):
        required = f.default is dataclasses.MISSING
        meta = f.metadata
        if meta.get("kind") not in OPTION_KINDS:
            raise ValueError(
                f"{options.__name__}.{f.name}: give its flat name and one of the kinds "
                f"{', '.join(OPTION_KINDS)} (setting(..., flat=..., kind=...))."
            )
        default = None if required else f.default
        out.append(OptionField(f.name, meta["flat"], meta["kind"], meta["help"], default, required))
    return tuple(out)


# -- what an export hook returns -----------------------------------------------------------------


@dataclass(frozen=True)
class Adapters:
    """Modules a method inserts that no library config describes: the recipe module
    (`tunescope_recipe.add_adapters`) builds them. kind: which module (``houlsby``); layers:
    1-based; sites: the module's name on its block → the projection whose output it rewrites."""

    kind: str
    size: int
    init_std: float
    layers: tuple[int, ...]
    sites: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.size, "init_std": self.init_std,
                "layers": list(self.layers), "sites": dict(self.sites)}  # fmt: skip


@dataclass(frozen=True)
class Exported:
    """A method's part of a recipe, beyond what is read off the prepared model (which tensors
    have ``requires_grad``, which rows the gradient masks keep): nothing (``Exported()``), a PEFT
    config or the modules the method adds.

    peft: a ``peft.PeftConfig``, written with ``save_pretrained`` as the recipe's
      adapter_config.json (PEFT's own 0-based layer indices); the user wraps their model with
      ``get_peft_model``. layers: the 1-based layers it adapts, which recipe.json says.
    adapters: modules the recipe module inserts (`Adapters`).
    n_trainable: the encoder entries the method trains, where the hook knows it without building
      a model (a PEFT config's count); the export checks it against the prepared model.
    """

    peft: Any = None
    layers: tuple[int, ...] = ()
    adapters: Adapters | None = None
    n_trainable: int | None = None

    def __post_init__(self) -> None:
        if self.peft is not None and self.adapters is not None:
            raise ValueError("An export is a PEFT config or added modules, not both.")


def export_as_prepared(cfg: Any, loaded: Any) -> Exported:
    """The export hook of a method whose recipe is all read off the prepared model."""
    return Exported()


def refuse_export(reason: str) -> ExportHook:
    """The export hook of a method the export cannot express: it raises a ValueError with
    ``reason`` (why no transformers / PEFT setting says what the method does)."""

    def refuse(cfg: Any, loaded: Any) -> Exported:
        raise ValueError(reason)

    return refuse


def peft_config(name: str, **fields: Any) -> Any:
    """``peft.<name>(**fields)`` (``LoraConfig``, ``IA3Config``…), or a ValueError naming the
    fields this PEFT lacks (an older PEFT would silently write a config that means less)."""
    import peft

    config_class = getattr(peft, name)
    have = {f.name for f in dataclasses.fields(config_class)}
    missing = [key for key in fields if key not in have]
    if missing:
        raise ValueError(
            f"peft {peft.__version__} has no {name} field {', '.join(missing)}: the exported "
            "adapter_config.json would not say what the run trains; upgrade peft"
        )
    return config_class(**fields)


def peft_layer_key(layer: int, part: str) -> str:
    """The name suffix PEFT matches a module of 1-based ``layer`` by: ``layer.2.attention.self
    .query`` for layer 3 (``target_modules`` entries and ``rank_pattern`` keys; every supported
    family keeps its blocks in a ModuleList named ``layer``)."""
    return f"layer.{layer - 1}.{part}"


# -- recognising a user's own run ----------------------------------------------------------------


@dataclass(frozen=True)
class TrainedModel:
    """A user's model as set up for training, as `MethodSpec.recognise` sees it
    (`analysis.runs.callback.infer_method`).

    peft: the PEFT config of a PEFT-wrapped model (None for a plain one). names: the encoder's
    parameter names (transformers' names, e.g. ``encoder.layer.0.attention.self.query.weight``);
    trained: those with ``requires_grad``.
    """

    peft: Any
    names: tuple[str, ...]
    trained: tuple[str, ...]

    @property
    def peft_type(self) -> str | None:
        """PEFT's name of the method (``LORA``, ``IA3``…), or None for a plain model."""
        if self.peft is None:
            return None
        kind = self.peft.peft_type
        return str(getattr(kind, "value", kind))

    @property
    def n_layers(self) -> int:
        return max((layer for n in self.names if (layer := layer_of(n))), default=0)


def layer_of(name: str) -> int | None:
    """The 1-based layer a parameter name belongs to (``…layer.0.…`` → 1), or None."""
    found = re.search(r"(?:^|\.)layer\.(\d+)\.", name)
    return int(found.group(1)) + 1 if found else None


def recognise_peft(peft_type: str) -> Callable[[TrainedModel], dict[str, Any] | None]:
    """The recogniser of a method whose export is a PEFT config of ``peft_type``."""

    def recognise(model: TrainedModel) -> dict[str, Any] | None:
        return {} if model.peft_type == peft_type else None

    return recognise


# -- stored configs and labels -------------------------------------------------------------------


def option_json(kind: str, value: Any) -> Any:
    """An option's value as a stored config writes it (see the module docstring's table)."""
    if value is None:
        return None
    if kind == "layers":
        return list(value)
    if kind == "heads":
        return {"layers": {str(layer): list(heads) for layer, heads in value.layers},
                "settings": dict(value.settings)}  # fmt: skip
    if kind == "per_layer":
        return {str(layer): number for layer, number in value}
    return value


def options_json(spec: MethodSpec, options: Any) -> dict[str, Any]:
    """Every option of ``spec`` in its stored form, by field name ({} without options)."""
    if options is None:
        return {}
    return {f.name: option_json(f.kind, getattr(options, f.name)) for f in spec.fields}


def default_run_label(config: Mapping[str, Any]) -> str:
    """A run's short name: its method, and ``@ℓ`` where the classifier reads a lower layer."""
    return str(config.get("method", "?")) + at_classifier_layer(config)


def at_classifier_layer(config: Mapping[str, Any]) -> str:
    """`` @3`` when the config names the classifier's layer (3), else ""."""
    layer = config.get("classifier_layer")
    return f" @{layer}" if layer else ""


def placement_label(name: str) -> Callable[[Mapping[str, Any]], str]:
    """The run label of a method that places modules in layers (its option ``layers_to_transform``):
    ``lora 3,4`` for an explicit placement, ``lora 1–3`` for ℓ_bottom..ℓ_top, else the name."""

    def label(config: Mapping[str, Any]) -> str:
        explicit = (config.get("options") or {}).get("layers_to_transform")
        layers = config.get("layers")
        if explicit:
            text = f"{name} " + ",".join(str(x) for x in explicit)
        elif layers:
            text = f"{name} {layers[0]}–{layers[1]}"
        else:
            text = name
        return text + at_classifier_layer(config)

    return label


@dataclass(frozen=True)
class MethodSpec:
    """One fine-tuning method.

    name: what ``--method`` and the stored configs call it. label: one line for the page's method
      list. colour: its colour in the figures; None = coloured by its layer strategy's family
      (full and layers runs are ℓ*-down / ℓ*-up / baseline points). default_lr: the body learning
      rate when none is given. options: its options dataclass (fields made with `setting`) or
      None. prepare: ``(model, cfg, inputs) -> Prepared``, which imports torch only when called.
      order: its place in every list. sweep: its place among a sweep's whole-model baselines
      (None: not offered by sweeps). needs_layers: the config must give (ℓ_bottom, ℓ_top,
      ℓ_cls). has_body: something besides the classifier trains (a learning-rate grid varies
      the body rate, so a method without one runs once). missing: what to ask for when the
      options cannot take their defaults. check: further checks of the options (a ValueError).
      run_label: the run's short name from its stored config (options under ``"options"``).
    export: ``export(cfg, loaded) -> Exported`` (``loaded``: the uncut
      `analysis.models.LoadedModel`), called before any model is built: nothing beyond the
      prepared model (`export_as_prepared`), a PEFT config, or the modules the method adds. A
      method no transformers / PEFT setting expresses raises a ValueError with its reason
      (`refuse_export`), and the export says "Method 'x' cannot be exported: <reason>."; None:
      the method declares no export.
    recognise: ``recognise(TrainedModel) -> dict | None``: whether a user's own model (a
      ``transformers.Trainer`` run) is set up as this method trains, and what that implies for
      its stored config (``{"layers": [1, 3], "classifier_layer": 4}``); None where a model
      cannot tell (head rows).
    title: the method's name as prose writes it (``LoRA``), for its fields' labels.
    reference: full fine-tuning, what the others are measured against (the comparisons' "full",
      the compute a cut model saves, a baseline in the figures); every layer trains.
    random: what it trains is drawn anew for every seed (a control arm: a random subspace).
    canonical: ``canonical(cfg, n_layers) -> cfg``: the same run under its one name on a model
      of ``n_layers`` layers (``layers`` (1, L, L) is ``full``), so it is queued, labelled and
      grouped once; None: the config's own name.
    migrate: ``migrate(stored, result) -> stored``: a config stored earlier, read with its run's
      result (None before it finishes), as the run it was under today's names; None: as stored.

    Derived, not declared: whether the method trains a head selection, reads a source run or
    places its modules (an option of kind ``heads``, ``run`` or ``layers``: `option_field`).
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
    recognise: Callable[[TrainedModel], dict[str, Any] | None] | None = None
    title: str | None = None
    reference: bool = False
    random: bool = False
    canonical: Callable[[Any, int], Any] | None = None
    migrate: Callable[[dict[str, Any], Mapping[str, Any] | None], dict[str, Any]] | None = None

    @property
    def fields(self) -> tuple[OptionField, ...]:
        return option_fields(self.options)

    def option_field(self, kind: str) -> OptionField | None:
        """The method's first option of ``kind`` (`OPTION_KINDS`), or None: ``heads`` for a
        method that trains a head selection, ``run`` for one that reads another run, ``layers``
        for one that places its modules."""
        return next((f for f in self.fields if f.kind == kind), None)

    def field_label(self, field: OptionField) -> str:
        """A field's label on the page: its flat name in words, the method's name as its title
        writes it (``lora_r`` → "LoRA r", ``adapter_layers`` → "Adapter layers")."""
        words = field.flat.replace("_", " ")
        if self.title and words.startswith(self.name + " "):
            return self.title + words[len(self.name) :]
        return words[:1].upper() + words[1:]

    def default_options(self) -> Any:
        """The options with every default, or None where the method needs a choice."""
        if self.options is None or any(f.required for f in self.fields):
            return None
        return self.options()


# -- checks the options share --------------------------------------------------------------------


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


def layer_values(value: Any, what: str, whole: bool) -> tuple[tuple[int, Any], ...]:
    """Sorted ((layer, value), …) from ``{layer: value}`` (layer keys may be digit strings, as in
    JSON) or pairs: 1-based layers, positive values (whole numbers when ``whole``)."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(layer, number) for layer, number in items]
    except (TypeError, ValueError):
        raise ValueError(
            f"{what} must map layers to numbers, e.g. 3:16,4:8 (got {value!r})."
        ) from None
    out: dict[int, Any] = {}
    for layer, number in pairs:
        if isinstance(layer, str) and layer.strip().isdigit():
            layer = int(layer)
        if not is_int(layer) or layer < 1:
            raise ValueError(f"{what}: layers are numbered from 1 (got {layer!r}).")
        if layer in out:
            raise ValueError(f"{what} lists layer {layer} twice.")
        if not (is_int(number) if whole else is_number(number)) or not number > 0:
            kind = "a positive whole number" if whole else "a positive number"
            raise ValueError(f"{what}: layer {layer} needs {kind} (got {number!r}).")
        out[layer] = number
    if not out:
        raise ValueError(f"{what} is empty: give at least one layer.")
    return tuple(sorted(out.items()))


def parse_layer_values(text: str | None, what: str) -> dict[int, int | float] | None:
    """``"3:16, 4:0.5"`` → {3: 16, 4: 0.5} (the CLI's and the page's form of a per_layer option;
    the options check the values); None or "" → None."""
    if text is None or not str(text).strip():
        return None
    out: dict[int, int | float] = {}
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        layer, _, number = part.partition(":")
        try:
            out[int(layer)] = int(number) if number.lstrip("-").isdigit() else float(number)
        except ValueError:
            raise ValueError(
                f"{what} must be layer:value pairs separated by commas, e.g. 3:16,4:8 "
                f"(got {text!r})."
            ) from None
    return out


def span(layers: tuple[int, ...]) -> str:
    """``1..3`` for a contiguous run of layers, else ``1, 3``."""
    if len(layers) > 1 and layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


def short_source(source: str) -> str:
    """A run id's random tail (``ab12cd``) or a trajectory folder's name."""
    name = Path(source).name if ("/" in source or "\\" in source) else source
    return name.rsplit("-", 1)[-1] if name.count("-") >= 2 else name
