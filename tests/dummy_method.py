"""A fine-tuning method declared in one file, as a new method would be (the registry test adds it
with `analysis.finetune.registry.register`; a built-in one lives in analysis/finetune/methods/)."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.config import setting
from analysis.finetune.spec import (
    MethodSpec,
    at_classifier_layer,
    export_as_prepared,
    is_number,
    layer_list,
)


@dataclass(frozen=True)
class DummyOptions:
    """The LayerNorms of the chosen layers train; ``scale`` only shows in the label."""

    scale: float = setting(2.0, help="a number the run carries", flat="dummy_scale", kind="float")
    layers: tuple[int, ...] | None = setting(
        None, help="layers whose LayerNorms train (default: every layer)", flat="dummy_layers",
        kind="layers",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if not is_number(self.scale) or not self.scale > 0:
            raise ValueError(f"dummy_scale must be positive (got {self.scale!r}).")
        if self.layers is not None:
            object.__setattr__(self, "layers", layer_list(self.layers, "dummy_layers"))


def prepare(model, cfg, inputs):
    from analysis.finetune.prepare import blocks, train_only
    from analysis.finetune.prepared import Prepared

    layers = cfg.options.layers or tuple(range(1, len(model.layers) + 1))
    norms = [p for b in blocks(model, layers) for n, p in b.named_parameters() if "LayerNorm" in n]
    train_only(model, norms)
    return Prepared.from_model(model, f"LayerNorms of layers {layers} and the classifier")


def run_label(config) -> str:
    """``dummy ×0.5``: the stored config's options are under "options"."""
    return f"dummy ×{config['options']['scale']:g}" + at_classifier_layer(config)


SPEC = MethodSpec(
    name="dummy",
    label="a test method: LayerNorms of some layers",
    colour="#000000",
    default_lr=3e-3,
    prepare=prepare,
    options=DummyOptions,
    order=999,
    sweep=99,
    run_label=run_label,
    export=export_as_prepared,  # its LayerNorms are read off the prepared model
)
