"""The Recommend page's parts: the candidates with their cost and evidence, "Test these" (the
comparison's runs queued through the one launch path), the comparison table and figure with the
sentence (a fragment that refreshes while runs train), and taking the answer home (the chosen
candidate's recipe, the HTML report)."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import streamlit as st

from analysis.rates import duration
from analysis.recommend.outcome import comparison_frame
from analysis.recommend.recommendation import Recommendation, queue, take_home
from analysis.runs.launch import new_sweep_id
from analysis.runs.planner import next_steps, standings
from analysis.runs.worker import parallel_runs
from analysis.words import counted
from ui.figures.recommend import comparison_figure, cost_figure
from ui.finetune.executor import chosen_executor
from ui.finetune.live import running_card
from ui.finetune.state import get_db
from ui.loaders import get_model, show_error
from ui.recommend.runs import cancel_rest_view
from ui.tables import MISSING

REFRESH_S = 5
# How each number of the two tables is written (a missing one reads "–").
FORMATS = {"score": "{:.4f}", "se": "{:.4f}", "diff vs full (points)": "{:+.1f}",
           "margin c·se (points)": "{:.1f}", "lo (points)": "{:+.1f}", "hi (points)": "{:+.1f}",
           "step time ×full": "{:.2f}", "step time ×full (runs)": "{:.2f}",
           "trainable %": "{:.2f}", "peak MB": "{:.0f}"}  # fmt: skip


def formatted(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the numbers of `FORMATS` written out, "–" where one is missing."""
    out = frame.copy()
    for column, pattern in FORMATS.items():
        if column in out:
            out[column] = [
                MISSING if v is None or v != v else pattern.format(v) for v in out[column]
            ]
    return out


def candidates_view(rec: Recommendation) -> None:
    """Every choice: what it trains, its measured cost and the evidence it rests on."""
    st.subheader("Candidates, and the alternatives at the same budget")
    st.caption(
        f"{rec.evidence.l_star_words()} · budget: {rec.cfg.budget.text()} · step time: median "
        f"of {rec.cfg.timed_steps} timed steps on one batch, as a share of full fine-tuning's"
    )
    rows = []
    for choice in rec.proposal.choices:
        cost = rec.costs.get(choice.name)
        rows.append({
            "choice": choice.name, "role": choice.role, "trains": choice.trains,
            "trainable %": None if cost is None else 100 * cost.share,
            "step time ×full": None if cost is None else cost.step_time_ratio,
            "evidence": choice.evidence, "budget match": "" if cost is None else cost.match,
        })  # fmt: skip
    st.table(formatted(pd.DataFrame(rows)), hide_index=True)  # (a table wraps its long texts)
    for note in rec.proposal.notes:
        st.caption(note)
    costs = [rec.costs.get(c.name) for c in rec.proposal.choices]
    st.plotly_chart(
        cost_figure([c.name for c in rec.proposal.choices], [k.share for k in costs],
                    [k.step_time_ratio for k in costs], [c.role for c in rec.proposal.choices]),
        width="stretch", key="rec_costs",
    )  # fmt: skip


@st.fragment(run_every=REFRESH_S)
def comparison_view(rec: Recommendation) -> None:
    """Test these, the comparison and the sentence; refreshes while the runs train."""
    db = get_db()
    db.reap_dead()
    runs = db.list_runs(model=rec.cfg.model.name, data=rec.cfg.data.name)
    st.subheader("Test these: the comparison at equal budget")
    experiment = rec.experiment()
    st.markdown(design_words(rec))
    stands = standings(experiment, runs)
    cancel_rest_view(db, stands)
    to_queue = next_steps(experiment, runs).queue
    label, help_ = test_words(rec, to_queue, runs) if to_queue else ("", "")
    if to_queue and st.button(label, type="primary", key="rec_test", help=help_):
        try:
            launched = queue(db, rec, runs, chosen_executor(), new_sweep_id("recommend"))
        except ValueError as exc:
            show_error(exc)
        else:
            st.success(f"Queued {counted(len(launched.ids), 'run')}; they train {launched.how}.")
            runs = db.list_runs(model=rec.cfg.model.name, data=rec.cfg.data.name)
    state = rec.progress(runs)
    if state.planned:
        st.progress(state.counts["done"] / state.planned, text=state.text())
    running = {s.run_id for by_seed in stands.values() for s in by_seed.values()
               if s.status == "running"}  # fmt: skip
    for _, run in runs[runs["id"].isin(running)].iterrows():
        running_card(db, run, "rec")
    arms, decision = rec.outcome(runs)
    (st.success if decision.branch == "recommend" else st.info)(decision.sentence)
    if any(a.n_seeds for a in arms):
        st.table(formatted(comparison_frame(arms)), hide_index=True)
        st.plotly_chart(comparison_figure(arms, rec.cfg.delta, rec.evidence.metric),
                        width="stretch", key="rec_figure")  # fmt: skip
    take_home_view(rec, runs, decision.candidate)


def design_words(rec: Recommendation) -> str:
    """What the comparison trains, in one paragraph (the design, the seeds, the runs' budget)."""
    cfg, n_arms = rec.cfg, len(rec.proposal.choices)
    runs = f"of {cfg.steps} steps (batch {cfg.batch_size}); finished runs with the same settings are reused."
    if cfg.design == "fixed":
        return f"{n_arms} arms × {len(cfg.seeds)} seeds = **{n_arms * len(cfg.seeds)} runs** {runs}"
    if cfg.design == "whole-table":
        return f"{n_arms} arms × {cfg.max_seeds} seeds = **{n_arms * cfg.max_seeds} runs** {runs}"
    return (
        f"**Sequential rounds**, cheapest arm first: every arm starts with {len(cfg.seeds)} seeds; "
        f"each round adds one seed to full fine-tuning and to every arm still undecided, up to "
        f"{cfg.max_seeds}; once an arm holds up, costlier arms get no more. At most "
        f"{n_arms * cfg.max_seeds} runs {runs}"
    )


def test_words(rec: Recommendation, to_queue: list, runs: pd.DataFrame) -> tuple[str, str]:
    """The button that starts the comparison and its help: what it queues now and about how long
    that takes here (`Recommendation.queue_seconds`), and where the figure comes from."""
    parallel = _parallel(rec)
    seconds, source = rec.queue_seconds(to_queue, runs, parallel)
    first = "" if rec.cfg.design != "sequential" else " (the first round)"
    took = f", about {duration(seconds)}" if seconds > 0 else ""
    label = f"Test these: {counted(len(to_queue), 'run')} to queue{first}{took}"
    help_ = (f"The time is an estimate for this machine, {counted(parallel, 'run')} at a time: "
             f"{source}. Later rounds, if the data need them, add runs.")  # fmt: skip
    return label, help_


def _parallel(rec: Recommendation) -> int:
    return parallel_runs(chosen_executor(), get_model(rec.cfg.model).n_params)


def take_home_view(rec: Recommendation, runs: pd.DataFrame, chosen: str | None) -> None:
    """The chosen candidate's recipe (zip) and the HTML report, prepared only when clicked."""
    st.subheader("Take it home")
    names = [c.name for c in rec.proposal.choices if c.role != "reference"]
    index = names.index(chosen) if chosen in names else 0
    left, right = st.columns(2)
    # keyed by the recommendation: the picker moves to the recommended candidate when one is named
    name = left.selectbox("Recipe of", names, index=index, key=f"rec_recipe_of:{chosen}",
                          help="The recommended candidate once the comparison names one.")  # fmt: skip
    left.download_button(
        "Recipe (zip)", lambda: recipe_zip(rec, name), "tunescope-recipe.zip", "application/zip",
        key="rec_recipe", on_click="ignore",
    )  # fmt: skip
    right.download_button(
        "Report (one HTML file)", lambda: report_bytes(rec, runs), "tunescope-recommendation.html",
        "text/html", key="rec_report", on_click="ignore",
        help="The question, the settings, the candidates, the comparison and the verdicts, with "
        "the figures; it opens offline.",
    )  # fmt: skip
    right.download_button(
        "Recommendation (JSON)", json.dumps(rec.to_json(runs), indent=1), "recommendation.json",
        "application/json", key="rec_json", on_click="ignore",
    )  # fmt: skip


def recipe_zip(rec: Recommendation, name: str) -> bytes:
    """`take_home` into a temporary folder, zipped; a text file saying why when it cannot be."""
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(buffer, "w") as archive:
        try:
            files = take_home(rec, name, Path(tmp) / "recipe", get_model(rec.cfg.model))
        except ValueError as exc:
            archive.writestr("recipe/WHY-NO-RECIPE.txt", f"{exc}\n")
        else:
            for file in files:
                archive.write(file, f"recipe/{file.name}")
    return buffer.getvalue()


def report_bytes(rec: Recommendation, runs: pd.DataFrame) -> bytes:
    from ui.recommend.report import report_html

    return report_html(rec, runs).encode("utf-8")
