"""Method ``layers``: layers ℓ_bottom..ℓ_top train; the classifier reads ℓ_cls, and the layers
above it are removed (docs/explanation/strategies.md). (1, L, L) is full fine-tuning."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from analysis.finetune.spec import MethodSpec, TrainedModel, export_as_prepared, layer_of


def prepare(model, cfg, inputs):
    from analysis.finetune.prepare import blocks, train_only
    from analysis.finetune.prepared import Prepared

    n_layers = model.n_layers_total
    bottom, top, classifier = cfg.resolved_layers(n_layers)
    if (bottom, top, classifier) == (1, n_layers, n_layers):
        model.requires_grad_(True)  # (1, L, L) is full fine-tuning: embeddings train too
        return Prepared.from_model(model, f"layers (1, {n_layers}, {n_layers}): full fine-tuning")
    trained = blocks(model, range(bottom, top + 1))
    train_only(model, (p for block in trained for p in block.parameters()))
    return Prepared.from_model(
        model, f"layers {bottom}..{top} and the classifier; classifier on layer {classifier}"
    )


def recognise(model: TrainedModel) -> dict[str, Any] | None:
    """Whole layers train, the embeddings do not: ``layers`` = [lowest, highest], the classifier
    on the top layer the model keeps (the stored form)."""
    if model.peft is not None or any(name.startswith("embeddings.") for name in model.trained):
        return None
    trained = set(model.trained)
    layers = {layer_of(name) for name in trained} - {None}
    if not layers or any(n not in trained for n in model.names if layer_of(n) in layers):
        return None
    return {"layers": [min(layers), max(layers)], "classifier_layer": model.n_layers}


def canonical(cfg, n_layers: int):
    """(1, L, L) trains everything, embeddings included: it is method ``full``, queued,
    labelled and grouped under that name."""
    if cfg.layers == (1, n_layers, n_layers):
        return dataclasses.replace(cfg, method="full", layers=None)
    return cfg


def migrate(stored: dict[str, Any], result: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run of (1, L, L), stored before such runs were queued as ``full``, is the ``full`` run
    it was. Its result tells: every parameter trained (``n_trainable == n_params``), which only
    (1, L, L) does."""
    trained, total = (result or {}).get("n_trainable"), (result or {}).get("n_params")
    if not trained or trained != total:
        return stored
    return {**stored, "method": "full", "layers": None, "classifier_layer": None}


def run_label(config: Mapping[str, Any]) -> str:
    """``(1, 3, 3)``: (ℓ_bottom, ℓ_top, ℓ_cls), the stored ``layers`` and ``classifier_layer``."""
    layers = config.get("layers")
    if not layers:
        return "layers"
    triple = (*layers, config.get("classifier_layer"))
    return "(" + ", ".join(str(int(x)) for x in triple if x is not None) + ")"


SPEC = MethodSpec(
    name="layers",
    label="train layers ℓ_bottom..ℓ_top only; the classifier reads ℓ_cls, layers above are "
    "removed ((1, L, L) is method full)",
    colour=None,  # coloured by its strategy family (ℓ*-down, ℓ*-up, baseline, middle)
    default_lr=5e-5,
    prepare=prepare,
    order=10,
    needs_layers=True,
    canonical=canonical,
    migrate=migrate,
    run_label=run_label,
    export=export_as_prepared,
    recognise=recognise,
)
