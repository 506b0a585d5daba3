"""Method ``adapter``: Houlsby adapters and the LayerNorms of the chosen layers train."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.config import setting
from analysis.finetune.spec import (
    Adapters,
    Exported,
    MethodSpec,
    TrainedModel,
    is_int,
    layer_list,
    placement_label,
    span,
)


@dataclass(frozen=True)
class AdapterOptions:
    """Method ``adapter``: Houlsby adapters and the LayerNorms of the chosen layers train."""

    layers_to_transform: tuple[int, ...] | None = setting(
        None, help="layers that get adapters, e.g. 3,4 (default: ℓ_bottom..ℓ_top, else all)",
        flat="adapter_layers", kind="layers",
    )  # fmt: skip
    size: int = setting(
        64, help="bottleneck units of each adapter", flat="adapter_size", kind="int"
    )

    def __post_init__(self) -> None:
        if self.layers_to_transform is not None:
            object.__setattr__(
                self, "layers_to_transform", layer_list(self.layers_to_transform, "adapter_layers")
            )
        if not is_int(self.size) or self.size < 1:
            raise ValueError(f"adapter_size must be a positive whole number (got {self.size!r}).")


def prepare(model, cfg, inputs):
    from analysis.finetune.adapters import add_adapters
    from analysis.finetune.prepare import blocks, train_only
    from analysis.finetune.prepared import Prepared
    from analysis.models import layer_modules

    options = cfg.options_for(AdapterOptions)
    layers = cfg.placement(model.n_layers_total)
    adapters = add_adapters(model.layers, model.model_family, layers, options.size)
    norms = []
    for block in blocks(model, layers):
        parts = layer_modules(block, model.model_family)
        norms += [*parts["attn_norm"].parameters(), *parts["ffn_norm"].parameters()]
    train_only(model, [*(p for a in adapters for p in a.parameters()), *norms])
    return Prepared.from_model(
        model,
        f"Houlsby adapters (size {options.size}) and LayerNorms in layers "
        f"{span(layers)}, and the classifier",
    )


def export(cfg, loaded) -> Exported:
    """The Houlsby adapters the recipe module inserts: where (1-based layers, the projections
    whose outputs they rewrite) and their size; the LayerNorms that train are read off the
    prepared model."""
    from analysis.finetune.adapters import ADAPTER_SITES, INIT_STD
    from analysis.models import LAYER_PARTS

    parts = LAYER_PARTS[loaded.model_family]
    adapters = Adapters(
        kind="houlsby",
        size=cfg.options_for(AdapterOptions).size,
        init_std=INIT_STD,
        layers=cfg.placement(loaded.n_layers),
        sites={name: parts[site] for site, name in ADAPTER_SITES},
    )
    return Exported(adapters=adapters)


def recognise(model: TrainedModel) -> dict | None:
    """Houlsby adapters were inserted (the recipe module names them ``adapter_…``) and train."""
    added = any(".adapter_" in name for name in model.trained)
    return {} if model.peft is None and added else None


SPEC = MethodSpec(
    name="adapter",
    label="Houlsby adapters in the chosen layers (plus their LayerNorms)",
    colour="#8c564b",
    default_lr=1e-3,  # Houlsby et al. sweep 1e-4 .. 1e-3; fresh modules
    prepare=prepare,
    options=AdapterOptions,
    order=40,
    sweep=4,
    export=export,
    recognise=recognise,
    run_label=placement_label("adapter"),
)
