"""Method ``subspace-random``: train inside a random orthonormal subspace of the shape of
``subspace``'s (the paper's control; `analysis.finetune.subspace`)."""

from __future__ import annotations

from analysis.finetune.methods.subspace import SubspaceOptions, source_label
from analysis.finetune.spec import MethodSpec, refuse_export


def prepare(model, cfg, inputs):
    from analysis.finetune.subspace import prepare_subspace_random

    return prepare_subspace_random(model, cfg, inputs)


SPEC = MethodSpec(
    name="subspace-random",
    label="train inside a random subspace (of a source run's shape, else r = 32)",
    colour="#9c9ede",
    default_lr=1e-2,
    prepare=prepare,
    options=SubspaceOptions,
    order=90,
    random=True,  # the basis is drawn with the run's seed
    export=refuse_export(
        "random-subspace training re-parameterises each layer (a fixed random basis and its own "
        "forward pass): no transformers or PEFT setting expresses it"
    ),
    run_label=lambda config: source_label("random subspace", config),
)
