"""The Runs page's parts: the filtered table (its rows selectable: `ui.runs.selection`) and its
export, several runs' curves overlaid, and one run in full (its note and tags, its files,
deleting it)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from analysis.runs.chance import chance_flag, page_baseline
from analysis.runs.record import runs_of, setting_digest
from analysis.runs.results import distinct_labels, export_records, with_groups
from analysis.words import counted
from ui.datasets import data_label
from ui.figures.finetune import loss_curve
from ui.figures.runs import overlay_curves
from ui.links import BIND, publish, take_link
from ui.paths import check_allowed
from ui.runs.selection import table_key
from ui.tables import dashes

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB

KEEP = "session"  # filters and choices stay across page switches
RUN_KEY = "runs_run"  # the run shown in full; its link parameter is ``run``
HIDDEN = ["config_json", "result_json"]
FILTERS = {"model": "Model", "data": "Data", "method": "Method", "status": "Status"}


def import_form(db: RunsDB) -> None:
    """Bring back runs trained elsewhere: a run folder that the exported recipe's callback wrote
    (docs/reference/recipe.md), or a Trainer's output folder holding such folders — what
    ``tunescope runs import`` does. Each run folder is imported once; bad input is one message."""
    from analysis.runs.imported import import_folder

    with st.expander("Import runs from your own training"):
        with st.form("runs_import", border=False):
            typed = st.text_input(
                "Folder", placeholder="trainer-output",
                help="A run folder (it holds run.json) or a Trainer's output_dir (its "
                "tunescope-runs/ folder holds them). Relative: inside the data folder; elsewhere: "
                "a folder listed in TUNESCOPE_ALLOWED_ROOTS.",
            )  # fmt: skip
            asked = st.form_submit_button("Import")
        if not (asked and typed.strip()):
            return
        try:
            ids = import_folder(check_allowed(typed), db=db)
        except (ValueError, OSError) as exc:
            st.error(str(exc))
            return
        if ids:
            st.success(f"Imported {counted(len(ids), 'run')}, tagged imported: {', '.join(ids)}.")
        else:
            st.info(f"Nothing new: the runs in {typed.strip()} are in the runs database already.")


def run_name(run: pd.Series) -> str:
    """One line naming a run: id · what it trained · status · data · score."""
    score = "" if pd.isna(run.get("score")) else f" · {run['metric']} {run['score']:.3f}"
    return f"{run['id']} · {run['label']} · {run['status']} · {data_label(run['data'])}{score}"


def filtered_runs(db: RunsDB, everything: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Filters (model, data, method, status, tag) over the runs; returns (runs, filters)."""
    columns = st.columns(5)
    filters: dict = {}
    for column, (name, title) in zip(columns, FILTERS.items(), strict=False):
        chosen = column.multiselect(
            title, sorted(everything[name].dropna().unique()), key=f"runs_filter_{name}",
            format_func=data_label if name == "data" else str, persist_state=KEEP, bind=BIND,
        )  # fmt: skip
        filters[name] = chosen or None
    tags = columns[4].multiselect(
        "Tag", db.all_tags(), key="runs_filter_tag", persist_state=KEEP, bind=BIND,
        help="Runs carrying any of these tags",
    )  # fmt: skip
    filters["tag"] = tags or None
    return with_groups(db.list_runs(**filters)), filters  # + group and a telling label


# What a reader looks for first; ids, timestamps and the worker's bookkeeping come after.
LEADING = ["method", "label", "score", "metric", "flag", "status", "seed", "data", "id"]


def telling_labels(runs: pd.DataFrame) -> list[str]:
    """Each run's label, plus the settings in which runs sharing that label differ (two "full"
    runs read ``full · steps 100`` and ``full · steps 200``: `distinct_labels`); the seed is its
    own column."""
    records = runs_of(runs)
    settings = {r.id: r.setting for r in records}
    by_group: dict[str, dict] = {}
    for setting in settings.values():
        by_group.setdefault(setting_digest(setting), setting)
    labels = distinct_labels(by_group)
    return [labels[setting_digest(settings[r.id])] for r in records]


def table_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The table as shown: `LEADING` columns first, telling labels, the chance-level flag
    (`analysis.runs.chance`), data sets by name, "–" for what a run has not got."""
    shown = runs.drop(columns=HIDDEN).assign(data=runs["data"].map(data_label))
    if not runs.empty:
        shown["label"] = telling_labels(runs)
        shown["flag"] = [chance_flag(r.result) for r in runs_of(runs)]
    else:
        shown["flag"] = pd.Series(dtype=object)
    first = [c for c in LEADING if c in shown]
    return dashes(shown[first + [c for c in shown.columns if c not in first]])


def runs_table(db: RunsDB, runs: pd.DataFrame, filters: dict) -> list[str]:
    """The table, its rows selectable (`ui.runs.selection`), and its downloads; returns the ids
    of the selected rows."""
    shown = table_view(runs)
    event = st.dataframe(
        shown, hide_index=True, width="stretch", key=table_key(shown["id"].tolist()),
        on_select="rerun", selection_mode="multi-row",
    )  # fmt: skip
    if (shown["flag"].astype(str).str.len() > 1).any():
        st.caption(
            "*flag*: the run predicts one class only, or does not beat always answering the "
            "test part's most frequent class: its score is not a finding."
        )
    left, right = st.columns(2)
    left.download_button(
        "Download CSV (one row a run, with notes and tags)",
        runs.drop(columns=["result_json"]).to_csv(index=False),
        "runs.csv",
        "text/csv",
    )
    right.download_button(
        "Download JSON (config, result, note, tags, steps and run group)",
        json.dumps(export_records(db, **filters), indent=1, default=str),
        "runs.json",
        "application/json",
    )
    return [shown["id"].iloc[row] for row in event.selection.rows if row < len(shown)]


def compare_view(db: RunsDB, runs: pd.DataFrame) -> None:
    """Several runs' loss and dev curves on one figure."""
    names = {row["id"]: run_name(row) for _, row in runs.iterrows()}
    finished = runs.loc[runs["status"] == "done", "id"].tolist()
    # In the link as run ids (``compare``): a run's name holds its status and score, which change.
    take_link("runs_compare", lambda text: [i for i in text.split(",") if i in names] or None,
              "names none of these runs", "the newest finished runs", param="compare")  # fmt: skip
    keep = [i for i in st.session_state.get("runs_compare", finished[:2]) if i in names]
    st.session_state["runs_compare"] = keep  # runs filtered away leave the comparison
    chosen = st.multiselect(
        "Runs to overlay", list(names), format_func=names.get, key="runs_compare",
        persist_state=KEEP,
    )  # fmt: skip
    publish("compare", ",".join(chosen), ",".join(finished[:2]))
    if not chosen:
        st.caption("Choose two or more runs to see their curves against each other.")
        return
    metrics = runs.set_index("id").loc[chosen, "metric"].dropna().unique()
    metric = str(metrics[0]) if len(metrics) == 1 else "score"
    steps = {f"{i} · {runs.set_index('id').loc[i, 'label']}": db.steps(i) for i in chosen}
    st.markdown(
        f"Each run's train loss per step (top) and its dev {metric} at each evaluation (bottom), "
        "one colour per run: which run learns faster, and which ends better on the dev part."
    )
    chosen_runs = runs[runs["id"].isin(chosen)]
    baseline = page_baseline(r.result for r in runs_of(chosen_runs))
    st.plotly_chart(overlay_curves(steps, metric, baseline), width="stretch")
    if baseline is not None:
        st.caption(
            f"Dashed line: the majority class of the test part ({baseline.describe()}); the dev "
            "part's is close to it. A curve that stays on it has not learned."
        )
    if len(metrics) > 1:
        st.caption(
            f"These runs report different metrics ({', '.join(metrics)}): compare with care."
        )


def pick_run(runs: pd.DataFrame) -> str:
    """The run shown in full: kept across pages (this page's own, not the Subspaces page's) and
    in the link (``run``)."""
    ids = runs["id"].tolist()
    take_link(
        RUN_KEY, lambda t: t if t in ids else None, "is not one of the runs listed", "the newest",
        param="run",
    )  # fmt: skip
    if st.session_state.get(RUN_KEY) not in ids:
        st.session_state.pop(RUN_KEY, None)
    names = {row["id"]: run_name(row) for _, row in runs.iterrows()}
    chosen = st.selectbox("Run", ids, format_func=names.get, key=RUN_KEY, persist_state=KEEP)
    publish("run", chosen)  # always: the default (the newest run) changes as runs finish
    return chosen


def run_view(db: RunsDB, run_id: str) -> None:
    run = db.get_run(run_id)
    a, b, c, d = st.columns(4)
    a.metric("status", run["status"])
    score = (run["result"] or {}).get("score")  # none: a run trained elsewhere without a test set
    b.metric("test score", "—" if score is None else f"{score:.4f}")
    flag = chance_flag(run["result"])
    if flag:
        st.warning(f"At chance level: this run {flag}.", icon=":material/warning:")
    c.metric("method", run["label"])
    d.metric("seed", run["seed"])
    st.caption(f"{run['model']} · {data_label(run['data'])} · created {run['created']}")
    if run["error"]:
        st.warning(run["error"])
    if run["status"] in ("queued", "running") and st.button("Cancel this run"):
        st.toast(f"Run {run_id}: {db.request_cancel(run_id)}")
    steps = db.steps(run_id)
    if not steps.empty:
        st.markdown("Train loss per step and, on the right axis, the dev score at each evaluation.")
        st.plotly_chart(
            loss_curve(steps, run["label"], (run["result"] or {}).get("metric")), width="stretch"
        )
    notes_form(db, run)
    files_view(db, run)
    left, right = st.columns(2)
    left.markdown("**Config**")
    left.json(run["config"], expanded=False)
    right.markdown("**Result**")
    right.json(run["result"] or {}, expanded=False)


def notes_form(db: RunsDB, run: dict) -> None:
    """The run's note and tags, editable (stored in the runs database, exported with the run)."""
    with st.form(f"runs_note_{run['id']}"):
        note = st.text_area("Note", run["note"], placeholder="what you tried, what you saw…")
        tags = st.text_input(
            "Tags", ", ".join(run["tags"]), placeholder="comma-separated, e.g. baseline, keep"
        )
        if st.form_submit_button("Save note and tags"):
            try:
                db.set_note(run["id"], note)
                saved = db.set_tags(run["id"], tags)
            except ValueError as exc:
                st.error(str(exc), icon="⚠️")
                return
            st.toast(f"Run {run['id']}: note saved, tags {', '.join(saved) or '(none)'}")
            st.rerun()


def files_view(db: RunsDB, run: dict) -> None:
    """The folders the run owns (trajectory, zero-weights files), their size, and deleting
    them or the run itself."""
    st.markdown("**Files**")
    folders = db.run_files(run["id"])
    sizes = {f: sum(p.stat().st_size for p in f.rglob("*") if p.is_file()) for f in folders}
    if folders:
        st.caption(" · ".join(f"`{f}` ({sizes[f] / 1e6:,.1f} MB)" for f in folders))
    else:
        st.caption("This run owns no files (no trajectory, no zero-weights files).")
    busy = run["status"] in ("queued", "running")
    left, right = st.columns(2)
    if folders and left.button(
        f"Delete its files ({sum(sizes.values()) / 1e6:,.1f} MB)", disabled=busy,
        key=f"runs_delete_files_{run['id']}",
    ):  # fmt: skip
        _delete(db, run["id"], files_only=True)
    sure = right.checkbox(
        "Delete the run itself too (with its steps, note and tags)", disabled=busy,
        key=f"runs_delete_sure_{run['id']}",
    )  # fmt: skip
    if sure and right.button("Delete the run", type="primary", key=f"runs_delete_{run['id']}"):
        _delete(db, run["id"], files_only=False)
    if busy:
        st.caption("Cancel the run before deleting it or its files.")


def _delete(db: RunsDB, run_id: str, files_only: bool) -> None:
    try:
        removed = db.delete_files(run_id) if files_only else db.delete_run(run_id)
    except ValueError as exc:
        st.error(str(exc), icon="⚠️")
        return
    what = "its files" if files_only else "the run"
    st.toast(f"Run {run_id}: deleted {what} ({counted(len(removed), 'folder')}).")
    if not files_only:
        st.session_state.pop(RUN_KEY, None)
    st.rerun()
