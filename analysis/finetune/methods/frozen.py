"""Method ``frozen``: nothing but the fresh classifier trains."""

from __future__ import annotations

from analysis.finetune.spec import MethodSpec, TrainedModel, export_as_prepared


def prepare(model, cfg, inputs):
    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared

    train_only(model, ())
    return Prepared.from_model(model, "classifier only (frozen encoder)")


def recognise(model: TrainedModel) -> dict | None:
    """No encoder tensor trains."""
    return {} if model.peft is None and not model.trained else None


SPEC = MethodSpec(
    name="frozen",
    label="nothing but the classifier trains",
    colour="#bcbd22",
    default_lr=1e-3,  # no body: the rate is unused (the classifier has its own)
    prepare=prepare,
    order=70,
    sweep=3,
    has_body=False,
    export=export_as_prepared,
    recognise=recognise,
)
