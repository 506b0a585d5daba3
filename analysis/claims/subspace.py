"""The subspace claims of Zhang et al. 2023: S1 (tuning in the intrinsic subspace ≈ full
fine-tuning ≫ a random subspace) and S2 (zeroing the outlier weights hurts more than zeroing as
many random weights).

They come in two stages: first the trajectory run (full fine-tuning, snapshots every
``steps // 16`` steps, seed = the first seed); once it is done, the intrinsic / random subspace
runs from it and — from its outliers (`analysis.subspace.report`, u = the final move projected on
the trajectory's subspace) — the zero-weights files of the disable experiment (same place and
names as the Subspaces page's, so either finds the other's). "Random weights zeroed" draws its
weights with the run's seed (the Subspaces page's and the paper's protocol).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.claims.config import ClaimsConfig
from analysis.claims.result import ClaimResult
from analysis.claims.runs import PlannedRun, comparison_result, run_status
from analysis.runs.comparisons import comparison_configs
from analysis.runs.planner import planned_compare
from analysis.subspace.outliers import outlier_positions_file, random_positions_like
from analysis.subspace.report import analyse_trajectory
from analysis.subspace.trajectory import open_trajectory
from analysis.workspace import Workspace

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB

ARMS = {
    "S1": ("full", "intrinsic subspace", "random subspace"),
    "S2": ("outliers zeroed", "random weights zeroed"),
}
SOURCE_ARM = "trajectory source"


def outlier_file(root: Path | str, run_id: str) -> str:
    """The outlier zero-weights file of trajectory run ``run_id`` under the cache root ``root``
    (`Workspace.outlier_file`: where the Subspaces page writes it too)."""
    return str(Workspace(root).outlier_file(run_id))


def random_file(root: Path | str, run_id: str, seed: int) -> str:
    """The zero-weights file of as many random weights, drawn with ``seed``."""
    return str(Workspace(root).random_file(run_id, seed))


def source_run(cfg: ClaimsConfig, runs: pd.DataFrame) -> dict | None:
    """The subspace claims' trajectory run: {id, status, result} (a done one first), or None."""
    source = PlannedRun(("S1",), SOURCE_ARM, cfg.trajectory_run())
    return run_status([source], runs).get(source.key)


def plan_subspace(
    cfg: ClaimsConfig, source: str | None, root: Path | str | None, add: Callable[..., None]
) -> None:
    """S1's and S2's runs: the trajectory run first (stage 0); once ``source``, its id, is done,
    the runs in its subspace and — once their zero-weights files exist under ``root`` — the
    disable experiment's runs (stage 1)."""
    claims = [c for c in ARMS if c in cfg.only]
    for claim in claims:
        add(claim, SOURCE_ARM, cfg.trajectory_run())
    if not claims or source is None:
        return
    outliers = outlier_file(root, source) if root is not None else None
    have_files = outliers is not None and Path(outliers).is_file()
    configs = comparison_configs(
        cfg.base_run(),
        source,
        cfg.seeds,
        outliers if have_files else None,
        (lambda s: random_file(root, source, s)) if have_files else None,
    )
    for claim in claims:
        for group, config in configs:
            if group in ARMS[claim]:
                add(claim, group, config, stage=1)


def write_disable_files(db: RunsDB, source: str, seeds: Sequence[int]) -> tuple[str, int]:
    """The disable experiment's files from the trajectory run ``source``: its outliers
    (|u_i − mean| > 3 std per layer of u = the final move projected on the trajectory's
    subspace) and, per seed, as many random weights. Returns (outlier file, n zeroed)."""
    report = analyse_trajectory(open_trajectory(db.trajectory_dir(source)))
    path = str(db.workspace.outlier_file(source))
    outlier_positions_file(report.trajectory, report.outliers, path)
    for seed in seeds:
        random_positions_like(
            report.trajectory, report.outliers, seed, str(db.workspace.random_file(source, seed))
        )
    return path, sum(lo.n_outliers for lo in report.outliers)


def judge_s1(arms, entries, n_seeds, ids, need) -> ClaimResult:
    vs_full = planned_compare(arms["intrinsic subspace"], arms["full"])
    vs_random = planned_compare(arms["intrinsic subspace"], arms["random subspace"])
    if vs_full.winner == "B" or vs_random.winner == "B":
        verdict = "does not hold"
    elif vs_random.winner == "A":
        verdict = "holds"
    else:
        verdict = "inconclusive"
    detail = f"vs full: {vs_full.verdict}; vs random subspace: {vs_random.verdict}"
    return comparison_result("S1", verdict, vs_full, n_seeds, ids, detail, [vs_full, vs_random])


def judge_s2(arms, entries, n_seeds, ids, need) -> ClaimResult:
    c = planned_compare(arms["outliers zeroed"], arms["random weights zeroed"])
    verdict = {"B": "holds", "A": "does not hold", None: "inconclusive"}[c.winner]
    return comparison_result("S2", verdict, c, n_seeds, ids, c.verdict, [c])
