"""Method ``full``: everything trains, embeddings included (the (1, L, L) baseline)."""

from __future__ import annotations

from analysis.finetune.spec import MethodSpec, TrainedModel, export_as_prepared


def prepare(model, cfg, inputs):
    from analysis.finetune.prepared import Prepared

    model.requires_grad_(True)
    return Prepared.from_model(model, "everything: embeddings, every kept layer, classifier")


def recognise(model: TrainedModel) -> dict | None:
    """Every encoder tensor trains."""
    return {} if model.peft is None and len(model.trained) == len(model.names) else None


SPEC = MethodSpec(
    name="full",
    label="train everything, embeddings included: the (1, L, L) baseline",
    colour=None,  # a baseline point of the layer strategies' figure
    default_lr=5e-5,  # BERT-style, a little above 2e-5 because runs are short
    prepare=prepare,
    order=20,
    reference=True,
    export=export_as_prepared,
    recognise=recognise,
)
