"""Score figures (issue 20): axes bounded to the metric's range, a second metric on its own axis,
the majority-class and chance lines, short bar labels."""

from __future__ import annotations

import pandas as pd

from analysis.runs.chance import Baseline
from ui.figures import finetune, runs, subspace

BASE = Baseline(metric="accuracy", majority=0.54, chance=0.5, n_classes=2, predicted_classes=1)


def summary(scores) -> pd.DataFrame:
    n = len(scores)
    return pd.DataFrame({
        "group": [f"g{i}" for i in range(n)], "family": ["baseline"] * n, "method": ["full"] * n,
        "label": [f"full · steps {i}" for i in range(n)], "n_seeds": [1] * n, "score": scores,
        "score_sem": [0.4] * n, "n_tuned_layers": list(range(1, n + 1)),
        "layers_forward": [6] * n, "n_trainable": [10 ** (i + 3) for i in range(n)],
    })  # fmt: skip


def lines_at(fig) -> list[float]:
    return sorted(round(s.y0, 6) for s in fig.layout.shapes if s.y0 == s.y1)


def test_score_axes_are_bounded_and_carry_the_majority_and_chance_lines():
    chance_runs = summary([0.451, 0.455, 0.46])  # the zoom the issue saw: 0.450–0.460
    for fig in (finetune.score_vs_layers(chance_runs, "accuracy", 6, BASE),
                finetune.score_vs_params(chance_runs, "accuracy", BASE)):  # fmt: skip
        assert list(fig.layout.yaxis.range) == [0, 1]
        assert lines_at(fig) == [0.5, 0.54]
        assert any("majority class 0.540" in a.text for a in fig.layout.annotations)
    mcc = finetune.score_vs_layers(summary([0.1, -0.2]), "mcc", 6)
    assert list(mcc.layout.yaxis.range) == [-1, 1]


def test_loss_and_dev_score_have_their_own_axes():
    steps = pd.DataFrame({"step": [1, 2, 3, 3], "kind": ["train", "train", "train", "dev"],
                          "key": ["loss", "loss", "loss", "dev"],
                          "value": [2.5, 1.8, 1.2, 0.91]})  # fmt: skip
    fig = finetune.loss_curve(steps, "one run", "accuracy")
    assert fig.data[1].yaxis == "y2" and list(fig.layout.yaxis2.range) == [0, 1]
    assert fig.layout.yaxis.range is None  # the loss keeps its own, free axis
    live = finetune.loss_curve(steps)  # a running run: no metric yet, still bounded
    assert list(live.layout.yaxis2.range) == [0, 1]


def test_the_overlay_bounds_its_dev_panel_and_draws_the_majority_line():
    steps = pd.DataFrame({"step": [1, 2], "kind": ["train", "dev"], "key": ["loss", "dev"],
                          "value": [0.7, 0.62]})  # fmt: skip
    fig = runs.overlay_curves({"a": steps, "b": steps}, "accuracy", BASE)
    assert list(fig.layout.yaxis2.range) == [0, 1] and fig.layout.yaxis.range is None
    assert 0.54 in lines_at(fig)


def test_subspace_bars_are_bounded_with_short_labels():
    rows = pd.DataFrame({
        "group": ["full", "frozen"], "n_seeds": [2, 2], "score": [0.9, 0.55],
        "score_sem": [0.01, 0.02],
        "label": ["full · n_eval 1000 · n_train 2000 · + 3 more", "frozen"],
    })  # fmt: skip
    fig = subspace.comparison(rows, "accuracy", BASE)
    assert list(fig.layout.yaxis.range) == [0, 1] and 0.54 in lines_at(fig)
    assert all(len(line) <= 24 for x in fig.data[0].x for line in x.split("<br>"))
    assert fig.layout.height >= 400


# ---------------------------------------------------------------- issue 31: the walk's defects


def test_full_fine_tuning_is_a_red_baseline_with_a_legend_even_alone():
    runs = summary([0.8, 0.82]).assign(family="ℓ*-down")  # as a sweep before the fix queued it
    fig = finetune.score_vs_layers(runs, "accuracy", 6, BASE)
    assert fig.layout.showlegend is True  # one family still says which one it is
    assert [t.name for t in fig.data] == ["baseline"]
    assert fig.data[0].marker.color == finetune.STRATEGY_COLOURS["baseline"]


def test_the_log_axis_of_trainable_parameters_is_labelled_in_full():
    runs = summary([0.8, 0.81, 0.82]).assign(n_trainable=[1_800_000, 4_500_000, 22_700_000])
    axis = finetune.score_vs_params(runs, "accuracy", BASE).layout.xaxis
    assert axis.type == "log" and axis.tickmode == "array"
    assert list(axis.ticktext) == ["1M", "2M", "5M", "10M", "20M", "50M"]  # not "2 3 4 … 9 10M 2"
    assert list(axis.tickvals) == [1e6, 2e6, 5e6, 1e7, 2e7, 5e7]
    wide = finetune.score_vs_params(runs.assign(n_trainable=[3_000, 400_000, 22_700_000]))
    assert list(wide.layout.xaxis.ticktext) == ["10k", "100k", "1M", "10M"]  # decades only


def test_a_single_runs_dev_axis_ticks_at_round_values():
    steps = pd.DataFrame({"step": [1, 2, 50, 100], "kind": ["train", "train", "dev", "dev"],
                          "key": ["loss", "loss", "dev", "dev"],
                          "value": [0.7, 0.6, 0.71, 0.8]})  # fmt: skip
    dev = finetune.loss_curve(steps, "one run", "accuracy").layout.yaxis2
    assert (dev.tickmode, dev.tick0, dev.dtick) == ("linear", 0, 0.2)  # 0, 0.2, … 1
    mcc = finetune.loss_curve(steps, "one run", "mcc").layout.yaxis2
    assert (mcc.tick0, mcc.dtick) == (-1, 0.5)
    assert runs.overlay_curves({"a": steps}, "accuracy").layout.yaxis2.dtick == 0.2
