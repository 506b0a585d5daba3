"""Method ``bitfit``: every bias of the encoder trains (BitFit)."""

from __future__ import annotations

from analysis.finetune.spec import MethodSpec, TrainedModel, export_as_prepared


def prepare(model, cfg, inputs):
    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared

    biases = [p for name, p in model.encoder.named_parameters() if name.endswith("bias")]
    train_only(model, biases)
    return Prepared.from_model(model, f"every bias ({len(biases)} tensors) and the classifier")


def recognise(model: TrainedModel) -> dict | None:
    """Some encoder tensors train, and all of them are biases."""
    biases_only = model.trained and all(name.endswith("bias") for name in model.trained)
    return {} if model.peft is None and biases_only else None


SPEC = MethodSpec(
    name="bitfit",
    label="only the biases train",
    colour="#17becf",
    default_lr=1e-3,  # few parameters, a fresh classifier
    prepare=prepare,
    order=60,
    sweep=2,
    export=export_as_prepared,
    recognise=recognise,
)
