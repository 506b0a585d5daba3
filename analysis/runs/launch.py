"""The one way runs are launched: check the executor, queue the runs, start their workers.

Used by the CLI (``finetune``, ``sweep``, ``claims``), the Fine-tune, Heads, Subspaces and Paper
check pages. The executor is checked first — an unreachable Ray cluster, or a live Ray worker of
this queue on another cluster, is a ValueError with nothing queued — then the runs are queued,
then the workers the choice needs start (one per device on this machine, or the Ray worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analysis.runs.executor import RAY, ExecutorChoice

if TYPE_CHECKING:
    import pandas as pd

    from analysis.finetune.config import FinetuneConfig
    from analysis.runs.db import RunsDB
    from analysis.runs.planner import Experiment


@dataclass(frozen=True)
class Launched:
    """What `launch` did: the new run ids, and a line naming the workers that train them."""

    ids: list[str]
    workers: str
    executor: ExecutorChoice

    @property
    def how(self) -> str:
        """How the runs train, for a page or the CLI to say."""
        if self.executor.executor == RAY:
            return "on the Ray cluster, as many at once as it holds"
        return "one after another on each worker: one per GPU, or the CPU's cores shared out"


def launch(
    db: RunsDB,
    runs: Sequence[tuple[FinetuneConfig, str | None]],
    executor: ExecutorChoice | None = None,
    sweep_id: str | None = None,
) -> Launched:
    """Queue ``runs`` ((config, family) pairs: the layer family of the sweep strategy that asks
    for it, or None) in ``db`` and start the workers ``executor`` (default: this machine's)
    needs, also with nothing new to queue, so that a caller waiting on queued runs keeps them
    served."""
    from analysis.runs.worker import check_executor, start_workers

    executor = executor or ExecutorChoice()
    root = db.workspace.root
    check_executor(executor, root)
    ids = [db.enqueue(cfg, sweep_id=sweep_id, family=family) for cfg, family in runs]
    return Launched(ids, start_workers(executor, root), executor)


def launch_experiment(
    db: RunsDB,
    experiment: Experiment,
    runs: pd.DataFrame,
    executor: ExecutorChoice | None = None,
    sweep_id: str | None = None,
) -> Launched:
    """Queue what a planned experiment needs now (`analysis.runs.planner.start`: its first round,
    or every run of a grid; failed runs again) under ``sweep_id``, and start the workers
    ``executor`` needs — checked first, as `launch` does. Its later rounds are queued as its runs
    end."""
    from analysis.runs.planner import start
    from analysis.runs.worker import check_executor, start_workers

    executor = executor or ExecutorChoice()
    root = db.workspace.root
    check_executor(executor, root)
    sweep_id = sweep_id or new_sweep_id()
    ids = start(db, experiment, runs, sweep_id)
    return Launched(ids, start_workers(executor, root), executor)


def new_sweep_id(kind: str = "experiment") -> str:
    """A fresh sweep id: ``<kind>-YYYYmmdd-HHMMSS-<4 hex>``."""
    import secrets
    import time

    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
