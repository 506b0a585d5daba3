"""Figure builders of issue 11 (inspected through fig.data / fig.layout): comparisons' forest
plot, claims' figures, bars with error bars and n_seeds, bootstrap bands, ℓ* shares."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.claims import ClaimResult
from analysis.compare import compare, comparisons_frame
from ui.figures import claims as claim_figures
from ui.figures import finetune, layers
from ui.figures.compare import VERDICT_COLOURS, forest


def test_forest_colours_winners_and_draws_the_welch_margin():
    found = [
        compare([0.9, 0.91, 0.92], [0.8, 0.81, 0.82], "A1", "B1"),
        compare([0.8, 0.81, 0.82], [0.9, 0.91, 0.92], "A2", "B2"),
        compare([0.8, 0.85, 0.9], [0.8, 0.84, 0.88], "A3", "B3"),
    ]
    fig = forest(comparisons_frame(found), "accuracy")
    trace = fig.data[0]
    assert list(trace.y) == ["A1 − B1", "A2 − B2", "A3 − B3"]
    assert list(trace.marker.color) == [VERDICT_COLOURS[w] for w in ("A", "B", None)]
    assert trace.error_x.array[0] == pytest.approx(found[0].margin)  # t · se, t(0.975, df 4)
    assert found[0].margin == pytest.approx(2.7764451 * found[0].se, rel=1e-6)
    assert "accuracy" in fig.layout.xaxis.title.text


def test_claim_figures_dispatch_on_the_claim():
    samples = [
        {"label": "seed 0", "verdict": "holds", "ours": -0.9, "interval": [-0.95, -0.8]},
        {"label": "seed 1", "verdict": "holds weakly", "ours": -0.7, "interval": None},
    ]
    x1 = ClaimResult("X1", "holds weakly", ours=-0.9, interval=(-0.95, -0.8), repeats=50,
                     values={"samples": samples})  # fmt: skip
    fig = claim_figures.claim_figure(x1)
    points = [t for t in fig.data if t.x[0] is not None]  # not the thresholds' legend entries
    assert [t.x[0] for t in points] == [-0.9, -0.7]  # one point per sample
    assert [t.name for t in fig.data if t not in points]  # the thresholds' legend entries
    assert fig.data[0].error_x.array[0] == pytest.approx(0.1) and fig.data[1].error_x.array is None
    assert fig.data[0].marker.color == claim_figures.VERDICT_COLOURS["holds"]
    x2 = ClaimResult("X2", "holds", ours=3.0, repeats=5,
                     values={"l_star_counts": {"3": 4, "4": 1}, "n_layers": 6})  # fmt: skip
    bars = claim_figures.claim_figure(x2).data[0]
    assert list(bars.y) == [0, 0, 0.8, 0.2, 0, 0] and list(bars.text)[2] == "4/5"
    x3 = ClaimResult("X3", "unstable", values={"samples": [
        {"label": "a", "verdict": "holds", "ours": 1.0, "interval": [0.2, 2.0]},
        {"label": "b", "verdict": "inconclusive", "ours": 0.1, "interval": [-0.5, 0.9]}]})  # fmt: skip
    x3_points = [t for t in claim_figures.claim_figure(x3).data if t.x[0] is not None]
    assert len(x3_points) == 2  # one per sample, beside the threshold's legend entry
    run = ClaimResult("H1", "holds", comparisons=[compare([0.9, 0.92], [0.7, 0.71])])
    assert claim_figures.claim_figure(run).data[0].y[0] == "A − B"
    assert claim_figures.claim_figure(ClaimResult("H1", "not measured yet")) is None


def test_cost_bars_show_means_error_bars_and_n_seeds():
    summary = pd.DataFrame(
        {"group": ["g1", "g2"], "family": ["baseline", "baseline"], "method": ["full", "heads"],
         "label": ["full", "heads ×6 pagerank"], "n_seeds": [3, 1], "score": [0.9, 0.8],
         "score_sem": [0.01, np.nan], "wall_s": [10.0, 5.0], "wall_s_sem": [1.0, np.nan],
         "peak_mem_mb": [600.0, 300.0], "peak_mem_mb_sem": [20.0, np.nan]}
    )  # fmt: skip
    fig = finetune.costs(summary)
    wall = fig.data[0]
    assert list(wall.x) == ["heads ×6 pagerank", "full"]  # sorted by wall-clock
    assert list(wall.error_y.array) == [0.0, 1.0] and list(wall.text) == ["n=1", "n=3"]
    assert wall.marker.color[0] == finetune.FAMILY_COLOURS["heads"]  # each family its colour
    assert wall.marker.color[1] == finetune.FAMILY_COLOURS["baseline"]


def test_metric_bands_and_shares():
    df = pd.DataFrame({"layer": [0, 1, 2], "nu": [2.0, 1.0, 1.5], "cca": [0.1, 0.5, 0.4],
                       "rank": [5.0, 4.0, 4.5], "probe": [0.6, 0.8, 0.7]})  # fmt: skip
    se = pd.DataFrame({"layer": [0, 1, 2], "nu_se": [0.1, 0.1, 0.1], "cca_se": [0.02] * 3,
                       "rank_se": [0.1] * 3, "probe_se": [0.01] * 3})  # fmt: skip
    fig = layers.metrics_figure(df, 1, "accuracy", se)
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 4
    assert list(bands[0].y) == pytest.approx([2.1, 1.1, 1.6, 1.4, 0.9, 1.9])  # hi, then lo back
    assert len([t for t in layers.metrics_figure(df, 1).data if t.fill == "toself"]) == 0
    shares = layers.l_star_shares({2: 4, 3: 1}, 3, 5).data[0]
    assert list(shares.marker.color) == ["#1f77b4", "#ff7f0e", "#1f77b4"]  # stable in orange


def test_the_stable_line_is_labelled_beside_the_bars_not_on_them():
    fig = layers.l_star_shares({10: 40, 12: 10}, 12, 50)
    (label,) = fig.layout.annotations
    assert label.text.startswith("stable") and "(40 of 50)" in label.text
    assert label.xref == "x domain" and label.x == 1 and label.xanchor == "left"  # right of them
    assert fig.layout.margin.r >= 100  # room for it
