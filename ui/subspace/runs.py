"""Runs on the subspace page: choose (or queue) a trajectory run, and compare intrinsic / random
subspace, frozen and full fine-tuning, and the disable experiment, over seeds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from analysis.config import default_of
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_names
from analysis.runs.chance import page_baseline
from analysis.runs.comparisons import (
    comparison_configs,
    comparison_table,
    comparison_verdicts,
    summarise_comparison,
)
from analysis.subspace.budget import MAX_SNAPSHOTS, auto_every, snapshot_count, trajectory_bytes
from analysis.subspace.outliers import outlier_positions_file, random_positions_like
from analysis.subspace.report import SubspaceReport
from analysis.words import counted
from ui import verdicts
from ui.datasets import data_label
from ui.figures import subspace as figures
from ui.finetune.executor import chosen_executor, executor_picker
from ui.links import publish, take_link
from ui.subspace.state import outlier_file, random_file, random_files, trajectory_runs
from ui.tables import dashes

KEEP = "session"  # the forms keep their values across page switches
RUN_KEY = "sub_run"  # the pinned trajectory run; its link parameter is ``run``

if TYPE_CHECKING:
    from analysis.config import ExtractConfig
    from analysis.runs.db import RunsDB
    from analysis.runs.executor import ExecutorChoice


def _queue(db: RunsDB, configs: list) -> None:
    """Queue ``configs`` ((group, config) pairs) where the "Train on" choice says (this machine,
    one worker per device, or a Ray cluster), through the one launch path. The comparison's
    group is no layer family: the runs record none (`comparison_group` reads it off a config)."""
    from analysis.runs.launch import launch

    launched = launch(db, [(cfg, None) for _, cfg in configs], _executor(db))
    st.success(
        f"Queued {counted(len(launched.ids), 'run')}; they train {launched.how} "
        f"({launched.workers}). This page follows them live and shows each one as soon as it "
        "finishes."
    )


def _executor(db: RunsDB) -> ExecutorChoice:
    """The page's "Train on" choice (drawn by `pick_run`; the same widget, and the same choice,
    as the Fine-tune page's)."""
    return chosen_executor()


def _launch_form(db: RunsDB, cfg: ExtractConfig, layer_params: list[int]) -> None:
    """Queue a full fine-tuning run that records its trajectory; the snapshot interval defaults
    to the library's rule (at most 32 snapshots) and the disk it will take is shown first."""
    st.markdown(
        "Full fine-tuning of the sidebar's model on the sidebar's data, snapshotting every "
        f"layer's weights every k steps (automatic: k = ⌈steps / {MAX_SNAPSHOTS}⌉, at most "
        f"{MAX_SNAPSHOTS} snapshots)."
    )
    c1, c2, c3, c4 = st.columns(4)
    steps = c1.number_input(
        "steps",
        2,
        100_000,
        default_of(FinetuneConfig, "steps"),
        key="sub_steps",
        persist_state=KEEP,
    )
    every = c2.number_input(
        "snapshot every k steps (0 = auto)", 0, 100_000, 0, key="sub_every", persist_state=KEEP
    )
    dtype = c3.selectbox("stored as", ["float16", "float32"], key="sub_dtype", persist_state=KEEP)
    seed = c4.number_input("seed", 0, 2**31 - 1, 0, key="sub_seed", persist_state=KEEP)
    k = auto_every(int(steps)) if every == 0 else int(every)
    t = snapshot_count(int(steps), k)
    size = trajectory_bytes(layer_params, int(steps), k, dtype)
    st.caption(
        f"k = {k} → θ₀ and t = {t} snapshots of {len(layer_params)} layers "
        f"({sum(layer_params) / 1e6:.2f} M parameters): about **{format_bytes(size)}** on disk "
        f"(θ₀ in float32, each snapshot in {dtype}). The Runs page deletes a run's files."
    )
    if t > 4 * MAX_SNAPSHOTS:
        st.warning(f"{t} snapshots is far more than the spectrum needs: consider k = 0 (auto).")
    if st.button("Queue a run with trajectory capture", key="sub_queue"):
        run = FinetuneConfig(
            model=cfg.model, data=cfg.data, method="full", steps=int(steps), seed=int(seed),
            max_length=cfg.max_length, pooling=cfg.pooling,
            trajectory_every=k, trajectory_dtype=dtype,
        )  # fmt: skip
        _queue(db, [("trajectory", run)])


def format_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} GB"


def _label(run) -> str:
    score = "" if pd.isna(run.score) else f" · {run.metric} {run.score:.3f}"
    return (
        f"{run.id} · {run.method} {run.label} · {data_label(run.data)} · seed {run.seed} · "
        f"t = {run.t}{score}"
    )


def default_run(runs: pd.DataFrame) -> str:
    """The newest plain fine-tuning run with at least two snapshots, else the newest. Plain: not
    of a method that reads a source run (a subspace run's own start-and-end trajectory has one
    move)."""
    subspace = method_names(lambda spec: spec.option_field("run") is not None)
    plain = runs[~runs["method"].isin(subspace) & (runs["t"] >= 2)]
    return str((plain if not plain.empty else runs)["id"].iloc[0])


def pick_run(db: RunsDB, cfg: ExtractConfig, layer_params: list[int]) -> dict | None:
    """A picker of completed runs with a trajectory (and a form to queue one).

    The chosen run is pinned: it stays chosen while other runs finish (they join the list, they
    do not take over), until the user picks another; it lives in the link (``run``) and in the
    session under this page's own key (the Runs page's choice is another).
    """
    runs = trajectory_runs(db, cfg.model.name)
    executor_picker(db.workspace.root)
    with st.expander("Record a new trajectory", expanded=runs.empty):
        _launch_form(db, cfg, layer_params)
    ids = runs["id"].tolist()
    take_link(RUN_KEY, lambda t: t if t in ids else None,
              f"is not a finished run of {cfg.model.name} with a trajectory", "the newest",
              param="run")  # fmt: skip
    pinned = st.session_state.get(RUN_KEY)
    if pinned is not None and pinned not in ids:
        st.warning(
            f"Run {pinned} is no longer available (its files were deleted, or it belongs to "
            "another model): showing another run."
        )
        del st.session_state[RUN_KEY]
    if runs.empty:
        st.info(f"No completed run of {cfg.model.name} has recorded a trajectory yet.")
        publish("run", None)
        return None
    labels = {r.id: _label(r) for r in runs.itertuples()}
    default = default_run(runs)
    chosen = st.selectbox(
        "Trajectory run", ids, index=ids.index(default), key=RUN_KEY, format_func=labels.get,
        persist_state=KEEP,
    )  # fmt: skip
    publish("run", chosen)  # always: the default (the newest run) changes as runs finish
    return runs.set_index("id").loc[chosen].to_dict() | {"id": chosen}


def _write_disable_files(report: SubspaceReport, run_id: str, seeds: list[int]) -> None:
    outlier_positions_file(report.trajectory, report.outliers, outlier_file(run_id))
    for seed in seeds:
        random_positions_like(report.trajectory, report.outliers, seed, random_file(run_id, seed))


def comparison_view(
    db: RunsDB, cfg: ExtractConfig, run: dict, report: SubspaceReport, layer_params: list[int]
) -> None:
    """The score comparison from the runs database, and a form queueing the missing runs."""

    run_id = run["id"]
    runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
    source = (run_id, run["trajectory_dir"])
    table = comparison_table(runs, source, outlier_file(run_id), random_files(run_id))
    summary = summarise_comparison(table)
    if summary.empty:
        st.info("No comparison run has finished yet: queue them below.")
    else:
        metric = str(table["metric"].dropna().iloc[0]) if table["metric"].notna().any() else ""
        baseline = page_baseline(table["result"])
        st.plotly_chart(figures.comparison(summary, metric or "score", baseline), width="stretch")
        if baseline is not None:
            st.caption(
                f"Dashed line: the majority class of the test part; dotted: chance "
                f"({baseline.describe()}). A bar at or below the dashed line has not learned."
            )
        st.dataframe(
            dashes(summary.drop(columns=["setting", "budget"])), hide_index=True, width="stretch"
        )
        flagged = table[table["flag"] != ""]
        if not flagged.empty:
            st.warning(
                f"{counted(len(flagged), 'run')} at chance level: "
                + "; ".join(f"{i} ({lab}): {f}" for i, lab, f in
                            zip(flagged["id"], flagged["label"], flagged["flag"], strict=True)),
                icon=":material/warning:",
            )  # fmt: skip
        withheld: list[str] = []
        found = comparison_verdicts(table, withheld)
        verdicts.withheld(withheld)
        if found:
            st.markdown(
                "**Verdicts** — intrinsic vs full and vs random subspace, random subspace vs "
                "frozen, outliers zeroed vs random weights zeroed (runs of the same budget):"
            )
            verdicts.show(found, metric or "score", "subspace_verdicts")
            verdicts.explain()
        st.download_button(
            "Download the comparison runs (CSV)",
            table.drop(columns=["result"]).to_csv(index=False),
            f"subspace-comparison-{run_id}.csv",
            "text/csv",
        )
    if run["data"] != cfg.data.name:
        st.caption(
            f"Transfer: the subspace was found on {data_label(run['data'])}; these runs "
            f"fine-tune on {data_label(cfg.data.name)} (the paper's inductive setting)."
        )
    n_zero = sum(lo.n_outliers for lo in report.outliers)
    ends = trajectory_bytes(layer_params, 1, 1, "float32")  # θ₀ and the end, in float32
    with st.form("subspace_compare"):
        c1, c2 = st.columns(2)
        seeds = c1.number_input("seeds", 1, 10, 3, key="sub_cmp_seeds", persist_state=KEEP)
        steps = c2.number_input(
            "steps per run", 2, 100_000, int(run["config"].get("steps", 200)),
            key="sub_cmp_steps", persist_state=KEEP,
        )  # fmt: skip
        record = st.checkbox(
            "Record the subspace runs' start and end (to inspect their learned update V θ̄ "
            f"here; about {format_bytes(ends)} per run on disk)",
            key="sub_cmp_record", persist_state=KEEP,
        )  # fmt: skip
        st.caption(
            f"Per seed: full, intrinsic subspace, random subspace, frozen; full with the "
            f"{n_zero:,} outlier weights zeroed, and with as many random weights zeroed. No run "
            "records a trajectory unless ticked above."
        )
        if st.form_submit_button("Queue the comparison runs"):
            seed_list = list(range(int(seeds)))
            _write_disable_files(report, run_id, seed_list)
            base = FinetuneConfig(
                model=cfg.model, data=cfg.data, method="full", steps=int(steps),
                max_length=cfg.max_length, pooling=cfg.pooling,
            )  # fmt: skip
            configs = comparison_configs(
                base, run_id, seed_list, outlier_file(run_id), lambda s: random_file(run_id, s),
                record_ends=record,
            )  # fmt: skip
            if n_zero == 0:
                configs = [(g, c) for g, c in configs if "zeroed" not in g]
            _queue(db, configs)
