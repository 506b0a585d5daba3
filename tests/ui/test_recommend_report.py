"""The recommendation's HTML report: one self-contained file (plotly.js inline, nothing fetched from
elsewhere) holding the question, the settings, the candidates, the comparison, the verdicts, the
figures and the sentence; and the comparison figure's parts."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from analysis.config import DataSpec, ModelSpec
from analysis.recommend.budget import Cost, Costs
from analysis.recommend.choices import Choice, Proposal
from analysis.recommend.config import RecommendConfig
from analysis.recommend.evidence import Evidence
from analysis.recommend.outcome import arm_outcomes, planned_runs
from analysis.recommend.recommendation import Recommendation
from analysis.runs.db import RunsDB
from analysis.runs.planner import standings
from ui.figures.recommend import comparison_figure
from ui.recommend.report import report_html


def recommendation() -> Recommendation:
    cfg = RecommendConfig(model=ModelSpec("tiny-model"), data=DataSpec("movie-snippets"), steps=2)
    evidence = Evidence(
        n_layers=2, n_heads=2, d_model=8, family="bert", metric="accuracy", n_outputs=2,
        table=pd.DataFrame(), l_star=1, repeats=5, l_star_counts={1: 4, 2: 1},
    )  # fmt: skip
    proposal = Proposal([
        Choice("full fine-tuning", "reference", "full", "everything"),
        Choice("layer 1 (ℓ*)", "candidate", "layers", "layer 1 <and> the classifier",
               "ν is lowest at layer 1", layers=(1, 1, 1)),
        Choice("BitFit", "alternative", "bitfit", "every bias", "a small budget"),
    ], notes=["The last 1 layer is layer 1 (ℓ*) itself."])  # fmt: skip
    costs = Costs({"full fine-tuning": Cost(100, 100, 1.0, 1.0),
                   "layer 1 (ℓ*)": Cost(30, 100, 0.4, 0.4),
                   "BitFit": Cost(3, 100, 0.7, 0.7, "not matched: 90 % fewer trainable "
                                  "parameters than layer 1 (ℓ*)", "layer 1 (ℓ*)")}, 0.0)  # fmt: skip
    return Recommendation(cfg, evidence, proposal, costs)


def finished_runs(rec: Recommendation) -> pd.DataFrame:
    db = RunsDB()
    score = {"full fine-tuning": 0.805, "layer 1 (ℓ*)": 0.80, "BitFit": 0.60}
    for name, config in planned_runs(rec.cfg, rec.proposal):
        run_id = db.enqueue(config, running_pid=os.getpid())
        db.finish(run_id, {"score": score[name] + 0.001 * config.seed, "metric": "accuracy",
                           "peak_mem_mb": 50.0})  # fmt: skip
    return db.list_runs()


def test_the_report_is_one_self_contained_file_with_the_whole_answer():
    rec = recommendation()
    runs = finished_runs(rec)
    page = report_html(rec, runs)
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, flags=re.S)
    plotly_js = max(scripts, key=len)
    assert len(plotly_js) > 1_000_000 and page.count(plotly_js) == 1  # inline, once
    rest = page.replace(plotly_js, "")
    assert not re.search(r"https?://", rest), re.findall(r".{40}https?://.{40}", rest)[:3]
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", rest)  # nothing loads
    assert rest.count("Plotly.newPlot") == 2  # the costs and the comparison, embedded
    for text in ("The question", "Settings", "Candidates and alternatives",
                 "The comparison at equal budget", "shown worse", "held up", "paired t",
                 "Tune layer 1 &lt;and&gt; the classifier (layer 1 (ℓ*))",
                 "ℓ* = 1, chosen in 4 of 5 repeats (2 in 1)",
                 "The last 1 layer is layer 1 (ℓ*) itself.", "3 seeds to start",
                 "not matched: 90 % fewer"):  # fmt: skip
        assert text in rest, text


def test_the_report_before_any_run_says_so():
    rec = recommendation()
    page = report_html(rec, RunsDB().list_runs())
    assert "Not compared yet" in page and "Not tested yet" in page
    assert page.count("Plotly.newPlot") == 1  # the costs only


def test_the_comparison_figure_draws_every_interval_and_the_minus_delta_line():
    rec = recommendation()
    stands = standings(rec.experiment(), finished_runs(rec))
    arms = arm_outcomes(rec.cfg, rec.proposal, rec.costs, stands)
    fig = comparison_figure(arms, 1.0, "accuracy")
    forest = fig.data[0]
    assert list(forest.y) == ["layer 1 (ℓ*)", "BitFit"]  # full is the reference, not a row
    assert np.allclose(forest.x, [100 * a.diff for a in arms[1:]])
    assert np.allclose(forest.error_x.array, [100 * a.margin for a in arms[1:]])
    lines = [s.x0 for s in fig.layout.shapes if s.type == "line"]
    assert -1.0 in lines and 0 in lines
    scatter = [t for t in fig.data if t.name in ("reference", "candidate", "alternative")]
    assert {t.name for t in scatter} == {"reference", "candidate", "alternative"}
    front = next(t for t in fig.data if t.name == "frontier")
    assert list(front.x) == [0.4, 1.0]  # layer 1 costs less, full scores more: both on it
    assert list(fig.layout.yaxis2.range) == [0.0, 1.0]  # accuracy's range


def test_an_arm_without_an_interval_gets_no_bar_rather_than_a_zero_wide_one():
    from analysis.recommend.outcome import ArmOutcome

    arms = [
        ArmOutcome("full fine-tuning", "reference", "full", 1, mean=0.8, step_time_ratio=1.0),
        ArmOutcome("layer 1", "candidate", "layers", 1, mean=0.79, diff=-0.01,
                   verdict="no difference shown (n seeds = 1, 1)", step_time_ratio=0.4),
    ]  # fmt: skip
    fig = comparison_figure(arms, 1.0, "accuracy")
    assert list(fig.data[0].error_x.array) == [None]  # one seed a side: no margin
    assert all(list(t.error_y.array) == [None] for t in fig.data[1:] if t.error_y.array)
