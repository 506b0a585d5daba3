"""The recommendation's HTML report: one self-contained file (plotly.js inline, nothing fetched from
elsewhere) holding the question, the settings, the candidates, the comparison, the verdicts, the
figures and the sentence; and the comparison figure's parts."""

from __future__ import annotations

import itertools
import re

import numpy as np
from recommend_examples import CROWDED, crowded_cost_figure, finished_runs, recommendation

from analysis.recommend.outcome import arm_outcomes
from analysis.runs.db import RunsDB
from analysis.runs.planner import standings
from ui.figures.recommend import comparison_figure
from ui.recommend.report import report_html


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


def test_the_cost_figure_gives_every_label_a_row_of_its_own_and_ticks_only_powers_of_ten():
    from ui.figures.labels import LABEL_ROW_PX
    from ui.figures.recommend import MARGIN

    fig = crowded_cost_figure()
    labels = {a.text: a for a in fig.layout.annotations}
    assert set(labels) == set(CROWDED)  # every point labelled, once
    assert all(t.mode == "markers" for t in fig.data)  # (no text printed at the markers)
    low, high = fig.layout.yaxis.range
    px_per_unit = (fig.layout.height - MARGIN["t"] - MARGIN["b"]) / (high - low)
    rows = sorted(a.ay * px_per_unit for a in labels.values())
    assert min(b - a for a, b in itertools.pairwise(rows)) >= LABEL_ROW_PX - 1e-6
    assert low * px_per_unit <= rows[0] and rows[-1] <= high * px_per_unit
    for name, (_, share, ratio) in CROWDED.items():  # each line ends at its own point
        assert np.isclose(labels[name].x, np.log10(100 * share)) and labels[name].y == ratio
    assert list(fig.layout.xaxis.ticktext) == ["0.1", "1", "10", "100"]  # no 2 … 9 between
    assert list(fig.layout.xaxis.tickvals) == [0.1, 1.0, 10.0, 100.0]


def test_the_comparison_without_runs_of_an_arm_says_what_will_appear_there():
    from analysis.recommend.outcome import ArmOutcome

    only_full = [
        ArmOutcome("full fine-tuning", "reference", "full", 3, mean=0.8, se=0.01,
                   step_time_ratio=1.0),
        ArmOutcome("BitFit", "alternative", "bitfit", 0),
    ]  # fmt: skip
    fig = comparison_figure(only_full, 1.0, "accuracy")
    assert not fig.layout.shapes  # no bare −δ line, no zero line
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
    (note,) = [a.text for a in fig.layout.annotations if "appears here" in a.text]
    assert note.startswith("Each arm's difference to full fine-tuning")
    assert "once runs of an arm other than full fine-tuning finish" in note.replace("<br>", " ")
    nothing = comparison_figure([only_full[1]], 1.0, "accuracy")
    notes = [a.text for a in nothing.layout.annotations if "appears here" in a.text]
    assert len(notes) == 2 and not nothing.data  # both panels say it
