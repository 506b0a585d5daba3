"""What the run claims (X4, H1–H2, S1–S2) share: a planned run (`PlannedRun`), finding the
finished, running or queued run that stands for it (`run_status`: same run group and seed),
queueing the missing ones through the one launch path, their time estimate, and turning an
arm's finished runs into a comparison."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from analysis.claims.result import ClaimResult
from analysis.compare import Arm, Comparison
from analysis.finetune.config import FinetuneConfig
from analysis.runs.executor import ExecutorChoice
from analysis.runs.launch import launch
from analysis.runs.planner import ALIVE, planned_key, stand_index
from analysis.runs.record import setting_key
from analysis.runs.records import run_label
from analysis.runs.results import estimate_step_time, group_of

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB


@dataclass(frozen=True)
class PlannedRun:
    """One run a claim needs: the arm it belongs to, its config, and whether a claim can use it
    now (``stage`` 0) or only once the trajectory run is done (stage 1)."""

    claims: tuple[str, ...]
    arm: str
    config: FinetuneConfig
    stage: int = 0

    @property
    def key(self) -> tuple[str, int]:
        """(setting key, seed): which run this is (`analysis.runs.record.setting_key`)."""
        return setting_key(self.config.to_dict()), self.config.seed

    def group_in(self, runs: pd.DataFrame) -> tuple[str, int]:
        """(run group, seed) of this run among ``runs`` (`analysis.runs.results.group_of`)."""
        return group_of(self.config.to_dict(), runs), self.config.seed


def full_run(base: FinetuneConfig) -> FinetuneConfig:
    """Full fine-tuning exactly as `comparison_configs` writes it (so X4 and S1 share it)."""
    return dataclasses.replace(
        base, method="full", options=None, zero_weights=None, trajectory_every=None, lr=None
    )


def queue_runs(
    db: RunsDB,
    runs: Sequence[PlannedRun],
    sweep_id: str | None = None,
    executor: ExecutorChoice | None = None,
) -> list[str]:
    """Queue ``runs`` for the background workers: the path ``sweep`` uses (the executor checked,
    ``db.enqueue``, then the workers ``executor`` needs — this machine's by default — started
    unless alive, also with nothing new, so that a caller waiting on queued runs keeps them
    served). Returns the new run ids."""
    return launch(db, [(r.config, None) for r in runs], executor, sweep_id).ids


def run_status(planned: Sequence[PlannedRun], runs: pd.DataFrame) -> dict[tuple[str, int], dict]:
    """For each planned run's (setting key, seed): the run that stands for it
    (`analysis.runs.planner.stand_index`) — a done one (newest), else a queued / running one —
    as {id, status, result, device}; absent when none (a failed or cancelled run is not a
    match: it is queued again)."""
    if runs.empty:
        return {}
    index = stand_index(runs)
    found: dict[tuple[str, int], dict] = {}
    for p in planned:
        stand = index.get(planned_key(p.config, runs))
        if stand is not None and stand.status in ALIVE:
            found[p.key] = {"id": stand.run_id, "status": stand.status, "result": stand.result,
                            "device": stand.device}  # fmt: skip
    return found


def missing_runs(planned: Sequence[PlannedRun], runs: pd.DataFrame) -> list[PlannedRun]:
    """The planned runs no done, running or queued run of the database stands for."""
    status = run_status(planned, runs)
    return [p for p in planned if p.key not in status]


def estimate_seconds(runs: Sequence[PlannedRun], history: pd.DataFrame) -> tuple[float | None, str]:
    """Training time of ``runs`` (steps × seconds per step measured on earlier finished runs of
    the model: same label, else same method, else any method), and where the figure comes from;
    (None, why) when the model has no finished run yet."""
    total = 0.0
    for run in runs:
        per_step, source = estimate_step_time(
            history, run.config.model.name, run.config.method, run_label(run.config.to_dict())
        )
        if per_step is None:
            return None, source
        total += per_step * run.config.steps
    return total, (
        "steps × seconds per step of earlier runs of this model (the same setting where there is "
        "one, else the same method, else any method)"
    )


def arm_of(name: str, rows: list[dict]) -> Arm:
    return Arm.from_results(name, [r["result"] for r in rows if r["status"] == "done"])


def comparison_result(
    claim: str, verdict: str, c: Comparison, n_seeds: int, ids: list[str], detail: str,
    comparisons: list[Comparison],
) -> ClaimResult:  # fmt: skip
    lo, hi = c.interval()
    return ClaimResult(claim, verdict, ours=c.diff, interval=(lo, hi), n_seeds=n_seeds, runs=ids,
                       detail=detail, comparisons=comparisons)  # fmt: skip
