"""The Runs page's actions on several runs at once: the rows selected in its table are compared
(their run groups, and a verdict between two), tagged, cancelled or deleted together."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from analysis.compare import compare
from analysis.runs.chance import BOTH_AT_CHANCE, flags_of, groups_at_chance
from analysis.runs.record import runs_of
from analysis.runs.results import group_arms, results_table, summarise
from analysis.words import counted
from ui import verdicts
from ui.cancel import ACTIVE, cancel_rest
from ui.tables import dashes

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB

ACTIONS = ("Compare", "Tag", "Cancel", "Delete")
GROUP_COLUMNS = ["label", "method", "n_seeds", "score", "score_sem", "dev_score", "step_time_s",
                 "n_trainable", "group"]  # fmt: skip


def table_key(ids: Sequence[str]) -> str:
    """The table's widget key, one per list of rows: a selection (row positions) never outlives
    the rows it was made on, so a run queued, deleted or filtered away clears it."""
    return "runs_table_" + _digest(ids)


def action_key(action: str, ids: Sequence[str]) -> str:
    """The key of an action's widget for this set of runs: a confirmation given for some runs
    is never taken for others."""
    return f"runs_selected_{action}_{_digest(sorted(ids))}"


def _digest(ids: Sequence[str]) -> str:
    return hashlib.sha1(",".join(ids).encode()).hexdigest()[:12]


def selection_view(db: RunsDB, chosen: pd.DataFrame) -> None:
    """What can be done with ``chosen`` (the selected rows of ``RunsDB.list_runs``)."""
    if chosen.empty:
        st.caption(
            "Select runs in the table (the boxes at the left of its rows) to compare, tag, "
            "cancel or delete several at once."
        )
        return
    action = st.radio(
        f"With the {counted(len(chosen), 'selected run')}",
        ACTIONS,
        horizontal=True,
        key="runs_action",
    )
    ids = chosen["id"].tolist()
    if action == "Compare":
        compare_selected(chosen)
    elif action == "Tag":
        tag_selected(db, ids)
    elif action == "Cancel":
        statuses = dict(zip(ids, chosen["status"], strict=True))
        if not any(s in ACTIVE for s in statuses.values()):
            st.caption("None of the selected runs is queued or running.")
        cancel_rest(db, statuses, action_key("cancel", ids), "Cancel the selected")
    else:
        delete_selected(db, chosen)


def compare_selected(chosen: pd.DataFrame) -> None:
    """The selected finished runs by run group (mean ± s.e. over their seeds) and, for two
    groups, the verdict between them (as the Fine-tune page gives it)."""
    table = results_table(chosen)
    if table.empty:
        st.info("None of the selected runs is done: there are no test scores to compare yet.")
        return
    by_id = {run.id: run.result for run in runs_of(chosen)}
    table = table.assign(flag=flags_of(table["id"], by_id))
    summary = summarise(table)
    st.dataframe(dashes(summary[GROUP_COLUMNS]), hide_index=True, width="stretch")
    if len(summary) != 2:
        st.caption(
            f"{counted(len(summary), 'run group')} among the selected finished runs (a group: runs "
            "identical in every setting but the seed). Select the runs of two groups for a "
            "verdict between them."
        )
        return
    (a, label_a), (b, label_b) = zip(summary["group"], summary["label"], strict=True)
    metrics = table["metric"].dropna().unique()
    if len(metrics) > 1:
        st.warning(f"The two groups are scored with different metrics ({', '.join(metrics)}).")
    elif {a, b} <= groups_at_chance(table):
        verdicts.withheld([BOTH_AT_CHANCE.format(a=label_a, b=label_b)])
    else:
        arms = group_arms(table, chosen)
        metric = str(metrics[0]) if len(metrics) else "score"
        verdicts.show([compare(arms[a], arms[b])], metric, "runs_selected")


def tag_selected(db: RunsDB, ids: list[str]) -> None:
    """Add a tag (or several, comma-separated) to every selected run, keeping their own."""
    with st.form("runs_selected_tag", border=False):
        typed = st.text_input("Tag to add", placeholder="comma-separated, e.g. keep")
        if not st.form_submit_button(f"Add to the {counted(len(ids), 'run')}"):
            return
    try:
        added = db.add_tags(ids, typed)
    except ValueError as exc:
        st.error(str(exc), icon="⚠️")
        return
    if not added:
        st.error("Type a tag to add first.", icon="⚠️")
        return
    st.toast(f"Tagged {counted(len(ids), 'run')}: {', '.join(added)}")
    st.rerun()


def delete_selected(db: RunsDB, chosen: pd.DataFrame) -> None:
    """Delete the selected finished runs for good, once confirmed; queued or running ones are
    left (cancel them first)."""
    busy = chosen["status"].isin(ACTIVE)
    ids = chosen.loc[~busy, "id"].tolist()
    if busy.any():
        st.caption(f"{int(busy.sum())} of them are queued or running: cancel them before deleting.")
    if not ids:
        return
    sure = st.checkbox(
        f"Delete the {counted(len(ids), 'finished run')} for good, with their steps, notes, tags and files",
        key=action_key("sure", ids),
    )
    if not (sure and st.button(f"Delete {counted(len(ids), 'run')}", type="primary",
                               key="runs_selected_delete")):  # fmt: skip
        return
    try:
        removed = db.delete_runs(ids)
    except ValueError as exc:
        st.error(str(exc), icon="⚠️")
        return
    st.toast(
        f"Deleted {counted(len(ids), 'run')} and {counted(len(removed), 'folder')} of their files."
    )
    st.rerun()
