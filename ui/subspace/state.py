"""Data of the subspace page: runs that recorded a trajectory, the per-trajectory report (kept in
process, computed with a progress bar; the SVDs themselves are disk-cached), and the files of the
disable experiment."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.models import encoder_layers
from analysis.runs.record import runs_of
from analysis.subspace.report import SubspaceReport, analyse_trajectory
from analysis.subspace.trajectory import open_trajectory
from analysis.workspace import Workspace
from ui.memo import ProgressMemo

if TYPE_CHECKING:
    from analysis.models import LoadedModel
    from analysis.runs.db import RunsDB

_REPORTS: ProgressMemo[SubspaceReport] = ProgressMemo(max_entries=4)


def trajectory_runs(db: RunsDB, model: str) -> pd.DataFrame:
    """Completed runs of ``model`` that recorded a trajectory: id, data, method, label, seed, t,
    score, metric, trajectory_dir, config (newest first)."""
    runs = db.list_runs(model=model, status="done")
    rows = []
    for (_, run), record in zip(runs.iterrows(), runs_of(runs), strict=True):
        result = record.result or {}
        folder = result.get("trajectory_dir")
        if not folder or not (Path(folder) / "index.json").is_file():
            continue
        meta = result.get("trajectory") or {}
        rows.append(
            {
                "id": run["id"],
                "data": run["data"],
                "method": run["method"],
                "label": run["label"],
                "seed": run["seed"],
                "t": max(int(meta.get("n_snapshots", 0)) - 1, 0),
                "score": run["score"],
                "metric": run["metric"],
                "trajectory_dir": folder,
                "config": record.stored,
            }
        )
    columns = ["id", "data", "method", "label", "seed", "t", "score", "metric", "trajectory_dir",
               "config"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def layer_param_counts(loaded: LoadedModel) -> list[int]:
    """D_ℓ, the parameter count of each encoder layer (what one snapshot stores per layer)."""
    return [sum(p.numel() for p in layer.parameters()) for layer in encoder_layers(loaded.model)]


def get_report(trajectory_dir: str, centre: bool) -> SubspaceReport:
    """`analyse_trajectory` of a folder, once per process (an LRU of a few), with a progress bar."""
    traj = open_trajectory(trajectory_dir)
    return _REPORTS.get(
        (trajectory_dir, traj.fingerprint, centre),
        "Analysing the trajectory",
        lambda progress: analyse_trajectory(traj, centre=centre, progress=progress),
    )


def outlier_file(run_id: str) -> str:
    """The current workspace's outlier zero-weights file of run ``run_id``."""
    return str(Workspace.current().outlier_file(run_id))


def random_file(run_id: str, seed: int) -> str:
    return str(Workspace.current().random_file(run_id, seed))


def random_files(run_id: str) -> list[str]:
    return [str(p) for p in Workspace.current().random_files(run_id)]
