"""Method ``heads`` (HiFi): the Q/K/V rows and bias entries of a head selection train."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis.config import setting
from analysis.finetune.spec import MethodSpec, at_classifier_layer, export_as_prepared
from analysis.heads.selection_file import HeadSelection


@dataclass(frozen=True)
class HeadsOptions:
    """Method ``heads`` (HiFi): the Q/K/V rows and bias entries of these heads train.

    ``heads`` is a `HeadSelection`, or what one is made of: ``{layer: [heads]}``, or its stored
    form ``{"layers": {layer: [heads]}, "settings": {…}}`` (the settings say where the selection
    came from: selector, k, PageRank settings…, so a PageRank run and a random-heads run of the
    same size tell themselves apart)."""

    heads: HeadSelection = setting(
        help="the heads to train: a selection file from the Heads page or `analysis heads`",
        flat="heads",
        kind="heads",
    )

    def __post_init__(self) -> None:
        heads = self.heads
        if isinstance(heads, Mapping) and "layers" in heads:
            heads = HeadSelection(heads["layers"], settings=heads.get("settings") or {})
        elif not isinstance(heads, HeadSelection):
            heads = HeadSelection(heads)
        object.__setattr__(self, "heads", heads)


def prepare(model, cfg, inputs):
    """Q, K, V rows h·d_head:(h+1)·d_head (output features) and bias entries of chosen heads."""
    import torch

    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared
    from analysis.models import layer_modules

    n_heads = model.n_heads
    masks: dict[torch.nn.Parameter, torch.Tensor] = {}
    selection = cfg.options_for(HeadsOptions).heads
    for layer, heads in selection.layers:
        parts = layer_modules(model.layers[layer - 1], model.model_family)
        for key in ("query", "key", "value"):
            linear = parts[key]
            d_head = linear.out_features // n_heads
            rows = torch.zeros(linear.out_features, dtype=torch.bool, device=linear.weight.device)
            for h in heads:
                rows[h * d_head : (h + 1) * d_head] = True
            masks[linear.weight] = rows[:, None].expand_as(linear.weight).clone()
            if linear.bias is not None:
                masks[linear.bias] = rows.clone()
    train_only(model, masks)
    layers = ", ".join(str(layer) for layer, _ in selection.layers)
    return Prepared.from_model(
        model,
        f"Q/K/V rows of {selection.n_selected} heads in layers {layers}, and the classifier",
        grad_masks=masks,
    )


def run_label(config: Mapping[str, Any]) -> str:
    """``heads ×6 pagerank``: the number of heads and the selector that chose them."""
    stored = (config.get("options") or {}).get("heads") or {}
    heads = stored.get("layers") or {}
    chosen = heads.values() if isinstance(heads, dict) else [h for _, h in heads]
    label = f"heads ×{sum(len(h) for h in chosen)}"
    selector = (stored.get("settings") or {}).get("selector")
    if selector:
        label += f" {selector}"
    return label + at_classifier_layer(config)


SPEC = MethodSpec(
    name="heads",
    label="HiFi: only the Q/K/V rows of the selected heads train",
    colour="#ff7f0e",
    default_lr=2e-4,  # HiFi's Table 5 uses 1e-4 .. 3e-4
    prepare=prepare,
    options=HeadsOptions,
    order=30,
    sweep=5,
    missing="a head selection (a heads file)",
    run_label=run_label,
    export=export_as_prepared,  # the head rows are the masks read off the prepared model
)
