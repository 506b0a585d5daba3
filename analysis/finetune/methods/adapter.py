"""Method ``adapter``: Houlsby adapters and the LayerNorms of the chosen layers train."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis.config import setting
from analysis.finetune.spec import MethodSpec, at_head, is_int, layer_list, span


@dataclass(frozen=True)
class AdapterOptions:
    """Method ``adapter``: Houlsby adapters and the LayerNorms of the chosen layers train."""

    layers: tuple[int, ...] | None = setting(
        None, help="layers that get adapters, e.g. 3,4 (default: ℓ_bottom..ℓ_top, else all)",
        flat="adapter_layers", kind="layers",
    )  # fmt: skip
    size: int = setting(
        64, help="bottleneck units of each adapter", flat="adapter_size", kind="int"
    )

    def __post_init__(self) -> None:
        if self.layers is not None:
            object.__setattr__(self, "layers", layer_list(self.layers, "adapter_layers"))
        if not is_int(self.size) or self.size < 1:
            raise ValueError(f"adapter_size must be a positive whole number (got {self.size!r}).")

    def layers_used(self) -> tuple[int, ...]:
        return self.layers or ()


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


def export(cfg, loaded):
    """Houlsby adapters in the recipe: where they go (0-based layers, the hooked projections) and
    their size (the LayerNorms that train are read off the prepared model)."""
    from analysis.finetune.adapters import ADAPTER_SITES, INIT_STD
    from analysis.models import LAYER_PARTS

    options = cfg.options_for(AdapterOptions)
    parts = LAYER_PARTS[loaded.model_family]
    return {
        "adapters": {
            "kind": "houlsby",
            "size": options.size,
            "init_std": INIT_STD,
            "layers": [layer - 1 for layer in cfg.placement(loaded.n_layers)],
            "sites": {name: parts[site] for site, name in ADAPTER_SITES},
        }
    }


def placement_label(method: str, config: Mapping[str, Any]) -> str:
    """``lora 3,4`` for an explicit placement, ``lora 1–3`` for ℓ_bottom..ℓ_top, else the name."""
    explicit, layers = config.get(f"{method}_layers"), config.get("layers")
    if explicit:
        label = f"{method} " + ",".join(str(x) for x in explicit)
    elif layers:
        label = f"{method} {layers[0]}–{layers[1]}"
    else:
        label = method
    return label + at_head(config)


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
    run_label=lambda config: placement_label("adapter", config),
)
