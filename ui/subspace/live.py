"""The Subspaces page follows its own runs live: while runs of this model are queued or running,
a fragment polls the runs database every few seconds, says what is in flight, and reruns the
page once a run has finished, so a trajectory run (or a comparison run) appears without
navigating away and back (as the Fine-tune page's live queue does)."""

from __future__ import annotations

import streamlit as st

from analysis.runs.record import runs_of
from analysis.words import counted
from ui.finetune.state import get_db

POLL_S = 3
_SEEN = "sub_live_done"  # the finished runs of the model the page was last drawn with


def _done_ids(model: str) -> frozenset[str]:
    return frozenset(get_db().list_runs(model=model, status="done")["id"])


def remember_done(model: str) -> None:
    """Call when the page is drawn: the finished runs it shows."""
    st.session_state[_SEEN] = (model, _done_ids(model))


@st.fragment(run_every=POLL_S)
def follow_runs(model: str) -> None:
    """The live line, and a rerun of the whole page when a run of ``model`` has finished."""
    db = get_db()
    db.reap_dead()
    active = db.list_runs(model=model, status=["queued", "running"])
    seen = st.session_state.get(_SEEN)
    if seen is not None and seen[0] == model and _done_ids(model) != seen[1]:
        st.rerun()  # a run finished: redraw the page with it
    if active.empty:
        return
    running = active[active["status"] == "running"]
    parts = []
    for run in runs_of(running):
        steps = db.steps(run.id, kind="train")
        at = int(steps["step"].max()) if not steps.empty else 0
        parts.append(f"{run.id} ({run.label}) at step {at} of {run.steps}")
    st.info(
        f"{counted(len(running), 'run')} of {model} running, {len(active) - len(running)} queued"
        + (f": {'; '.join(parts)}" if parts else "")
        + f". This page shows each one as soon as it finishes (checked every {POLL_S} s).",
        icon=":material/hourglass_top:",
    )
