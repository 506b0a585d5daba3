"""The live queue: polls the runs database every 2 s and redraws running runs (loss curve, step,
ETA, a Cancel button), the queue with "Cancel the rest" of each sweep in it, and the latest
finished runs. Only this fragment reruns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from analysis.runs.chance import chance_flag
from analysis.runs.record import Run, runs_of
from analysis.words import counted
from ui.cancel import cancel_rest
from ui.figures.finetune import loss_curve
from ui.finetune.state import format_seconds, get_db
from ui.tables import dashes

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB

RECENT = 6
QUEUED_COLUMNS = ["id", "method", "label", "seed", "family", "sweep_id", "created"]
QUEUED_NAMES = {"sweep_id": "sweep"}


@st.fragment(run_every=2)
def queue_view() -> None:
    from analysis.runs.worker import last_choice, start_workers, worker_pids

    db = get_db()
    db.reap_dead()
    active = db.list_runs(status=["queued", "running"])
    queued = active[active["status"] == "queued"]
    running = active[active["status"] == "running"]
    root = db.workspace.root
    pids = worker_pids(root)
    if not queued.empty and not pids:
        # A queue with nobody serving it: start the kind of worker it was last queued for.
        try:
            start_workers(last_choice(root), root)
        except ValueError as exc:  # e.g. that Ray cluster is unreachable now
            st.warning(
                f"{counted(len(queued), 'run')} {'waits' if len(queued) == 1 else 'wait'} in the "
                f"queue: {exc}"
            )
        pids = worker_pids(root)
    serving = ", ".join(f"{device} (pid {pid})" for device, pid in pids.items())
    st.caption(
        f"Workers: {serving or 'none (one starts when something is queued)'} · "
        f"{len(running)} running · {len(queued)} queued · refreshes every 2 s"
    )
    for _, run in running.iloc[::-1].iterrows():
        running_card(db, run)
    if not queued.empty:
        st.markdown("**Queued** (oldest first)")
        shown = queued.iloc[::-1][QUEUED_COLUMNS]
        st.dataframe(shown.rename(columns=QUEUED_NAMES), hide_index=True, width="stretch")
        if st.button("Cancel every queued run", key="ft_cancel_queued"):
            db.cancel_runs(queued["id"].tolist())
            st.rerun(scope="fragment")
    for sweep_id, sweep in active.groupby("sweep_id", sort=False):  # (a run queued alone: none)
        statuses = dict(zip(sweep["id"], sweep["status"], strict=True))
        cancel_rest(db, statuses, f"ft_cancel_rest_{sweep_id}", f"Cancel the rest of {sweep_id}")
    recent = db.list_runs(status=["done", "failed", "cancelled"], limit=RECENT)
    if not recent.empty:
        st.markdown("**Latest finished**")
        recent = recent.assign(flag=[chance_flag(r.result) for r in runs_of(recent)])
        columns = ["method", "label", "score", "metric", "flag", "status", "seed", "wall_s",
                   "error", "id"]  # fmt: skip
        st.dataframe(dashes(recent[columns]), hide_index=True, width="stretch")
        if (recent["flag"] != "").any():
            st.caption(
                "*flag*: at chance level — the run predicts one class only or does not beat the "
                "majority class of its test part."
            )


def running_card(db: RunsDB, run: pd.Series, key: str = "ft") -> None:
    """One training run: its step, loss and ETA, its train-loss and dev-score curve, and Cancel
    (widget keys start with ``key``: the Recommend page shows its comparison's runs too)."""
    steps = db.steps(run["id"])
    total = Run.from_row(run).steps
    train = steps[steps["kind"] == "train"].pivot_table(index="step", columns="key", values="value")
    with st.container(border=True):
        card, button = st.columns([5, 1])
        if train.empty:
            card.markdown(
                f"**{run['label']}** seed {run['seed']} · {run['message'] or 'starting…'}"
            )
            card.progress(float(run["progress"] or 0.0))
        else:
            last = train.iloc[-1]
            step = int(train.index[-1])
            card.markdown(
                f"**{run['label']}** ({run['method']}) seed {run['seed']} · step {step}/{total} · "
                f"loss {last.get('loss', float('nan')):.4f} · ETA {format_seconds(last.get('eta_s'))}"
            )
            card.progress(min(step / total, 1.0))
            st.plotly_chart(loss_curve(steps), width="stretch", key=f"{key}_curve_{run['id']}")
        if run["cancel_requested"]:
            button.caption("cancelling…")
        elif button.button("Cancel", key=f"{key}_cancel_{run['id']}"):
            db.request_cancel(run["id"])
            st.rerun(scope="fragment")
