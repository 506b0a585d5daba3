"""Runs on the subspace page: choose (or queue) a trajectory run, and compare intrinsic / random
subspace, frozen and full fine-tuning, and the disable experiment, over seeds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from analysis.finetune.config import FinetuneConfig
from analysis.runs.comparisons import (
    comparison_configs,
    comparison_table,
    comparison_verdicts,
    summarise_comparison,
)
from analysis.subspace.outliers import outlier_positions_file, random_positions_like
from analysis.subspace.report import SubspaceReport
from ui import verdicts
from ui.figures import subspace as figures
from ui.subspace.state import outlier_file, random_file, random_files, trajectory_runs

if TYPE_CHECKING:
    from analysis.config import ExtractConfig
    from analysis.runs.db import RunsDB


def _queue(db: RunsDB, configs: list) -> None:
    from analysis.runs.worker import ensure_worker

    ids = [db.enqueue(cfg, strategy=group) for group, cfg in configs]
    pid = ensure_worker(db.path.parent)
    st.success(
        f"Queued {len(ids)} run(s); a background worker (pid {pid}) trains them one after another. "
        "Follow them on the Fine-tune or Runs page; come back when they are done."
    )


def _launch_form(db: RunsDB, cfg: ExtractConfig) -> None:
    with st.form("subspace_launch"):
        st.markdown(
            "Full fine-tuning of the sidebar's model on the sidebar's data, snapshotting every "
            "layer's weights every k steps (about 32 snapshots)."
        )
        c1, c2, c3, c4 = st.columns(4)
        steps = c1.number_input("steps", 2, 100_000, 200, key="sub_steps")
        every = c2.number_input("snapshot every k steps", 1, 10_000, max(1, 200 // 32))
        dtype = c3.selectbox("stored as", ["float16", "float32"])
        seed = c4.number_input("seed", 0, 2**31 - 1, 0)
        if st.form_submit_button("Queue a run with trajectory capture"):
            run = FinetuneConfig(
                model=cfg.model, data=cfg.data, method="full", steps=int(steps), seed=int(seed),
                max_length=cfg.max_length, pooling=cfg.pooling,
                trajectory_every=int(every), trajectory_dtype=dtype,
            )  # fmt: skip
            _queue(db, [("trajectory", run)])


def pick_run(db: RunsDB, cfg: ExtractConfig) -> dict | None:
    """A selectbox of completed runs with a trajectory (and a form to queue one)."""
    runs = trajectory_runs(db, cfg.model.name)
    with st.expander("Record a new trajectory", expanded=runs.empty):
        _launch_form(db, cfg)
    if runs.empty:
        st.info(f"No completed run of {cfg.model.name} has recorded a trajectory yet.")
        return None
    labels = {
        r.id: f"{r.id} · {r.method} {r.label} · {r.data} · seed {r.seed} · t = {r.t}"
        for r in runs.itertuples()
    }
    chosen = st.selectbox("Trajectory run", list(labels), format_func=labels.get, key="sub_run")
    return runs.set_index("id").loc[chosen].to_dict() | {"id": chosen}


def _write_disable_files(report: SubspaceReport, run_id: str, seeds: list[int]) -> None:
    outlier_positions_file(report.trajectory, report.outliers, outlier_file(run_id))
    for seed in seeds:
        random_positions_like(report.trajectory, report.outliers, seed, random_file(run_id, seed))


def comparison_view(db: RunsDB, cfg: ExtractConfig, run: dict, report: SubspaceReport) -> None:
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
        st.plotly_chart(figures.comparison(summary, metric or "score"), width="stretch")
        st.dataframe(summary.drop(columns=["setting", "budget"]), hide_index=True, width="stretch")
        found = comparison_verdicts(table)
        if found:
            st.markdown(
                "**Verdicts** — intrinsic vs full and vs random subspace, random subspace vs "
                "frozen, outliers zeroed vs random weights zeroed (runs of the same budget):"
            )
            verdicts.show(found, metric or "score", "subspace_verdicts")
            verdicts.explain()
        st.download_button(
            "Download the comparison runs (CSV)",
            table.drop(columns=["result_json"]).to_csv(index=False),
            f"subspace-comparison-{run_id}.csv",
            "text/csv",
        )
    if run["data"] != cfg.data.name:
        st.caption(
            f"Transfer: the subspace was found on {run['data']}; these runs fine-tune on "
            f"{cfg.data.name} (the paper's inductive setting)."
        )
    n_zero = sum(lo.n_outliers for lo in report.outliers)
    with st.form("subspace_compare"):
        c1, c2 = st.columns(2)
        seeds = c1.number_input("seeds", 1, 10, 3)
        steps = c2.number_input("steps per run", 2, 100_000, int(run["config"].get("steps", 200)))
        st.caption(
            f"Per seed: full, intrinsic subspace, random subspace, frozen; full with the "
            f"{n_zero:,} outlier weights zeroed, and with as many random weights zeroed."
        )
        if st.form_submit_button("Queue the comparison runs"):
            seed_list = list(range(int(seeds)))
            _write_disable_files(report, run_id, seed_list)
            base = FinetuneConfig(
                model=cfg.model, data=cfg.data, method="full", steps=int(steps),
                max_length=cfg.max_length, pooling=cfg.pooling,
            )  # fmt: skip
            configs = comparison_configs(
                base, run_id, seed_list, outlier_file(run_id), lambda s: random_file(run_id, s)
            )
            if n_zero == 0:
                configs = [(g, c) for g, c in configs if "zeroed" not in g]
            _queue(db, configs)
