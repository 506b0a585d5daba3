"""Shared pieces of the fine-tune and runs pages: the runs database, an uploaded head selection,
and the run-time estimate. (ℓ* and the Heads page's selection come from `ui.suggestions`.)"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from analysis.heads.selection_file import HeadSelection, selection_from_json
from analysis.runs.db import RunsDB
from analysis.workspace import Workspace

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig
    from analysis.models import LoadedModel


@st.cache_resource(max_entries=4)
def _open_db(workspace: Workspace) -> RunsDB:
    return RunsDB(workspace)


def get_db() -> RunsDB:
    """The runs database of the current workspace (one connection per process)."""
    return _open_db(Workspace.current())


def heads_from_upload(content: bytes) -> HeadSelection:
    """A head selection from an uploaded selection file (the heads page's download)."""
    return selection_from_json(content)


def format_seconds(seconds: float | None) -> str:
    if seconds is None or pd.isna(seconds):
        return "?"
    seconds = float(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def measured_step_time(db: RunsDB, cfg: FinetuneConfig, label: str) -> tuple[float | None, str]:
    """Seconds per step of earlier completed runs of this model (same label, else same method,
    else any), and where the figure comes from."""
    from analysis.runs.results import estimate_step_time

    runs = db.list_runs(model=cfg.model.name)
    return estimate_step_time(runs, cfg.model.name, cfg.method, label)


def timed_step_time(cfg: FinetuneConfig, loaded: LoadedModel) -> float:
    """Seconds per step timed here on 3 steps of a small copy of ``cfg`` (the first, warm-up
    step is not counted); remembered for the session."""
    import dataclasses

    from analysis.finetune.engine import run_finetune

    cache = st.session_state.setdefault("ft_timings", {})
    key = json.dumps({**cfg.to_dict(), "seed": 0, "steps": 0}, sort_keys=True, default=str)
    if key not in cache:
        probe = dataclasses.replace(
            cfg,
            steps=3,
            n_train=max(2, 3 * cfg.batch_size),
            n_eval=4,
            eval_every=1000,
            trajectory_every=None,
        )
        with st.spinner(f"Timing 3 steps of a {cfg.method} run…"):
            cache[key] = run_finetune(probe, loaded=loaded).step_time_s
    return cache[key]
