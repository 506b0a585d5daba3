"""Method ``subspace``: train inside the subspace another run's trajectory spans
(docs/explanation/subspaces.md; the training itself is `analysis.finetune.subspace`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis.config import setting
from analysis.finetune.spec import MethodSpec, at_classifier_layer, refuse_export, short_source


@dataclass(frozen=True)
class SubspaceOptions:
    """Methods ``subspace`` / ``subspace-random``: train inside a subspace of each layer.

    ``subspace`` needs ``source``: the run (or trajectory folder) whose trajectory spans the
    subspace; ``subspace-random`` takes its dimensions from ``source`` when given.
    """

    source: str | None = setting(
        None, help="run id (or trajectory folder) whose trajectory spans the subspace",
        flat="subspace_from", kind="run",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.source is not None and (
            not isinstance(self.source, str) or not self.source.strip()
        ):
            raise ValueError("subspace_from must be a run id or a trajectory folder.")


def prepare(model, cfg, inputs):
    from analysis.finetune.subspace import prepare_subspace

    return prepare_subspace(model, cfg, inputs)


def needs_source(options: SubspaceOptions) -> None:
    if not options.source:
        raise ValueError("Method 'subspace' needs subspace_from: the run whose trajectory to use.")


def source_label(kind: str, config: Mapping[str, Any]) -> str:
    """``subspace of ab12cd``: the kind and the source run's short name."""
    source = (config.get("options") or {}).get("source")
    label = f"{kind} of {short_source(str(source))}" if source else str(config.get("method"))
    return label + at_classifier_layer(config)


SPEC = MethodSpec(
    name="subspace",
    label="train inside the subspace of another run's trajectory (Subspaces page)",
    colour="#393b79",
    default_lr=1e-2,  # a handful of coordinates per layer
    prepare=prepare,
    options=SubspaceOptions,
    order=80,
    check=needs_source,
    export=refuse_export(
        "subspace training moves each layer inside a basis read from a tunescope trajectory (a "
        "re-parameterisation with its own forward pass): no transformers or PEFT setting "
        "expresses it"
    ),
    run_label=lambda config: source_label("subspace", config),
)
