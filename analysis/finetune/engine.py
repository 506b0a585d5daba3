"""The training loop (stub: signatures only; the loop lands next)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.finetune.config import FinetuneConfig
from analysis.progress import Progress


@dataclass
class FinetuneResult:
    score: float | None
    metric: str
    dev_score: float | None
    n_trainable: int
    n_params: int
    share: float
    layers_forward: int
    layers_backward: int
    wall_s: float
    step_time_s: float
    peak_mem_mb: float
    seed: int
    config: dict[str, Any]
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    trajectory_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_finetune(
    cfg: FinetuneConfig,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[int, dict], None] | None = None,
    on_eval: Callable[[int, dict], None] | None = None,
    run_dir: Path | None = None,
    loaded=None,
) -> FinetuneResult:
    raise NotImplementedError
