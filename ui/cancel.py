"""The "Cancel the rest" button, confirmed in a second step: it cancels every queued run and stops
every running one among the runs a page follows (a sweep's, a comparison's, the Paper check's,
the runs selected on the Runs page) in one transaction (`RunQueue.cancel_runs`). Finished runs,
their results and curves stay."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import streamlit as st

from analysis.words import counted

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB

ACTIVE = ("queued", "running")


def cancel_rest(
    db: RunsDB,
    statuses: Mapping[str, str],
    key: str,
    label: str = "Cancel the rest",
    then: Callable[[], object] | None = None,
) -> None:
    """``label (N queued, M running)`` for the runs of ``statuses`` (run id → status) that are
    queued or running; nothing when none is. A click asks to confirm; confirming cancels them
    and calls ``then`` (a page forgets what it would queue next). The buttons act in callbacks,
    before the page redraws, so what it draws next already shows the runs cancelled."""
    active = [run_id for run_id, status in statuses.items() if status in ACTIVE]
    sure = f"{key}_sure"
    if not active:
        st.session_state.pop(sure, None)
        return
    n_queued = sum(statuses[run_id] == "queued" for run_id in active)
    n_running = len(active) - n_queued
    if not st.session_state.get(sure):
        st.button(f"{label} ({n_queued} queued, {n_running} running)", key=key, on_click=_ask,
                  args=(sure,))  # fmt: skip
        return
    st.warning(
        f"Cancel {counted(n_queued, 'queued run')} and stop {counted(n_running, 'running one')} at their next "
        "step? Finished runs, their results and curves stay.",
        icon=":material/cancel:",
    )
    yes, no = st.columns(2)
    yes.button("Yes, cancel them", key=f"{key}_yes", type="primary", on_click=_cancel,
               args=(db, active, sure, then))  # fmt: skip
    no.button("No, keep them", key=f"{key}_no", on_click=st.session_state.pop, args=(sure, None))


def _ask(sure: str) -> None:
    st.session_state[sure] = True


def _cancel(db: RunsDB, run_ids: list[str], sure: str, then: Callable[[], object] | None) -> None:
    st.session_state.pop(sure, None)
    try:
        done = db.cancel_runs(run_ids)
    except ValueError as exc:  # a run deleted in the meantime
        st.toast(str(exc), icon="⚠️")
        return
    if then is not None:
        then()
    st.toast(done.describe() + ".")
