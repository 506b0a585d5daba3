"""The launch form's time estimate: steps × seconds per step, from earlier runs of the model or
timed here on 2 steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from analysis.runs.records import run_label
from analysis.words import counted
from ui.finetune.state import format_seconds, measured_step_time, timed_step_time

if TYPE_CHECKING:
    from analysis.models import LoadedModel
    from analysis.runs.db import RunsDB

TIMED = "ft_timed_step_s"  # this session's timings: (model, method, batch, length, device) → s


def show_estimate(db: RunsDB, configs: list, loaded: LoadedModel, time_now: bool) -> None:
    """Steps × seconds per step, summed over the runs. Seconds per step: measured on earlier runs
    of this model; else, on "Estimate time", timed now on one run per method."""
    total, sources = 0.0, set()
    # Timings of this session (model, method, batch size, max length), so "Queue" right after
    # "Estimate time" estimates from them instead of saying there is nothing to estimate from.
    timed, fresh = st.session_state.setdefault(TIMED, {}), set()
    for _, cfg in configs:
        per_step, source = measured_step_time(db, cfg, run_label(cfg.to_dict()))
        what = (cfg.model.name, cfg.method, cfg.batch_size, cfg.max_length, cfg.device)
        if per_step is None and (time_now or what in timed):
            if time_now and what not in fresh:  # once per kind of run and press
                timed[what] = timed_step_time(cfg, loaded)
                fresh.add(what)
            if what in fresh:
                source = f"timed just now on 2 steps of one {cfg.method} run (others alike)"
            else:
                source = f"timed earlier in this session on 2 steps of one {cfg.method} run"
            per_step = timed[what]
        if per_step is None:
            st.info(
                f"No earlier {cfg.method} run of this model to estimate from: press **Estimate "
                "time** for a quick timing of 2 steps here."
            )
            return
        total += per_step * cfg.steps
        sources.add(source)
    st.info(
        f"Estimated training time: **{format_seconds(total)}** for {counted(len(configs), 'run')} "
        "(steps × seconds per step; loading data and scoring dev/test come on top). "
        f"Source: {_sources(sources)}."
    )


def _sources(sources: set[str]) -> str:
    if len(sources) <= 2:
        return "; ".join(sorted(sources))
    kinds = {"measured" if s.startswith("measured") else "timed" for s in sources}
    if kinds == {"measured"}:
        return "measured on earlier runs of this model (same layers where possible, else method)"
    return "measured on earlier runs where possible, else timed just now on 2 steps per method"
