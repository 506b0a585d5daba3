"""Method ``adapter``: Houlsby adapters (Houlsby et al. 2019) and the LayerNorms of the chosen
layers train; the adapters are written here (the AdapterHub package pins transformers 4.x).

An adapter is a bottleneck MLP with a residual, ``a(x) = x + W_up · act(W_down · x + b_down) +
b_up`` with x of shape (B, S, d_model) and a bottleneck of ``size`` units. Two per adapted layer:
on the output of the attention output projection and on the output of the feed-forward output
projection, both before the block's residual + LayerNorm (forward hooks on
``layer_modules(...)['attn_out']`` and ``['ffn_out']``, which add the residual). ``W_up`` and
``b_up`` start at zero, so a fresh adapter is exactly the identity; ``W_down`` starts small and
random, so the gradient reaches it once ``W_up`` moves.

The adapters are registered as children of their block (``adapter_attn``, ``adapter_ffn``, each
``down``, ``act``, ``up``), so they belong to that layer's parameters (state dict, device moves,
per-layer bookkeeping). torch is imported when they are built: the registry reads this module's
``SPEC`` without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from torch import nn

ADAPTER_SITES = (("attn_out", "adapter_attn"), ("ffn_out", "adapter_ffn"))
INIT_STD = 1e-2  # the down projection's init; the up projection starts at zero


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


# -- the adapters --------------------------------------------------------------------------------


def houlsby_adapter(d_model: int, size: int, init_std: float = INIT_STD) -> nn.Sequential:
    """The bottleneck up(gelu(down(x))), (B, S, d_model) → same; zero at initialisation (its
    hook adds the residual x)."""
    from collections import OrderedDict

    from torch import nn

    down, up = nn.Linear(d_model, size), nn.Linear(size, d_model)
    nn.init.normal_(down.weight, std=init_std)
    nn.init.zeros_(down.bias)
    nn.init.zeros_(up.weight)
    nn.init.zeros_(up.bias)
    return nn.Sequential(OrderedDict(down=down, act=nn.GELU(), up=up))


def _residual(adapter: nn.Module):
    def replace_output(module, args, output):
        return output + adapter(output)

    return replace_output


def add_adapters(
    blocks: nn.ModuleList, family: str, layers: Sequence[int], size: int
) -> list[nn.Sequential]:
    """Insert two adapters into each of ``layers`` (1-based) of ``blocks``; returns them all."""
    from analysis.models import layer_modules

    added = []
    for layer in layers:
        block = blocks[layer - 1]
        parts = layer_modules(block, family)
        for site, name in ADAPTER_SITES:
            if hasattr(block, name):
                raise ValueError(f"Layer {layer} already has adapters.")
            target = parts[site]
            adapter = houlsby_adapter(target.out_features, size)
            adapter.to(device=target.weight.device, dtype=target.weight.dtype)
            block.add_module(name, adapter)
            target.register_forward_hook(_residual(adapter))
            added.append(adapter)
    return added


# -- the method ----------------------------------------------------------------------------------


def prepare(model, cfg, inputs):
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
