"""Result tables (mean ± s.e. over seeds, Pareto frontier, compute saved) and their figures."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.finetune.stored import stored_layers
from analysis.runs import results
from analysis.runs.record import run_setting, setting_key
from ui.figures import finetune as figures


def stored(layers) -> dict:
    """The stored form of a layer triple."""
    return {"layers": list(layers[:2]), "classifier_layer": layers[2]} if layers else {}


def run_row(run_id, method, layers, seed, score, n_trainable, step_time, mem, family=None):
    forward = layers[2] if layers else 6
    return {
        "id": run_id, "status": "done", "model": "m", "data": "d", "method": method,
        "label": "(" + ", ".join(map(str, layers)) + ")" if method == "layers" else method,
        "family": family, "seed": seed, "sweep_id": None,
        "config_json": json.dumps({"method": method, **stored(layers)}),
        "score": score, "metric": "accuracy", "dev_score": score, "n_trainable": n_trainable,
        "n_params": 1000, "share": n_trainable / 1000, "layers_forward": forward,
        "layers_backward": 6 if method == "full" else 1, "wall_s": 10 * step_time,
        "step_time_s": step_time, "peak_mem_mb": mem,
    }  # fmt: skip


@pytest.fixture
def runs() -> pd.DataFrame:
    rows = [
        run_row("a0", "full", None, 0, 0.90, 1000, 1.0, 600),
        run_row("a1", "full", None, 1, 0.92, 1000, 1.0, 600),
        run_row("b0", "layers", (1, 3, 3), 0, 0.80, 300, 0.5, 300),
        run_row("b1", "layers", (1, 3, 3), 1, 0.84, 300, 0.5, 300),
        run_row("c0", "layers", (4, 6, 6), 0, 0.70, 300, 0.6, 400),
        run_row("d0", "lora", None, 0, 0.85, 50, 0.9, 500),
        run_row("e0", "layers", (3, 3, 6), 0, 0.60, 100, 0.8, 550, family="ℓ*-down"),
    ]
    frame = pd.DataFrame(rows)
    failed = run_row("x", "layers", (1, 3, 3), 2, np.nan, 300, np.nan, np.nan)
    failed["status"] = "failed"
    return pd.concat([frame, pd.DataFrame([failed])], ignore_index=True)


def test_results_table_families_and_tuned_layers(runs):
    table = results.results_table(runs, l_star=3)
    assert "x" not in set(table["id"])  # only completed runs
    by_id = table.set_index("id")
    assert by_id.loc["b0", "family"] == "ℓ*-down" and by_id.loc["b0", "n_tuned_layers"] == 3
    assert by_id.loc["c0", "family"] == "ℓ*-up"  # (ℓ*+1, L, L), L = 6 from layers_forward
    assert by_id.loc["a0", "family"] == "baseline" and by_id.loc["a0", "n_tuned_layers"] == 6
    assert by_id.loc["d0", "family"] == "baseline" and np.isnan(by_id.loc["d0", "n_tuned_layers"])
    assert by_id.loc["e0", "family"] == "ℓ*-down"  # the recorded family wins


def test_summary_mean_and_standard_error(runs):
    summary = results.summarise(results.results_table(runs, l_star=3)).set_index("label")
    assert summary.loc["(1, 3, 3)", "score"] == pytest.approx(0.82)
    # s.e. = std(ddof=1) / sqrt(n) = (0.04 / sqrt(2)) / sqrt(2) = 0.02
    assert summary.loc["(1, 3, 3)", "score_sem"] == pytest.approx(0.02)
    assert summary.loc["(1, 3, 3)", "n_seeds"] == 2
    assert np.isnan(summary.loc["(4, 6, 6)", "score_sem"])  # one seed


def test_pareto_front_known_answer():
    x = [10, 20, 20, 30, 40, np.nan]
    y = [0.5, 0.7, 0.6, 0.65, 0.9, 1.0]
    assert results.pareto_front(x, y).tolist() == [True, True, False, False, True, False]
    assert results.pareto_front([5, 5], [0.5, 0.5]).tolist() == [True, False]


def test_compute_saved_against_full(runs):
    summary = results.summarise(results.results_table(runs, l_star=3))
    saved = results.compute_saved(summary, n_layers=6)
    assert saved["label"].tolist() == ["(1, 3, 3)"]  # the only cut model (ℓ_cls < L)
    row = saved.iloc[0]
    assert row["layers_saved"] == pytest.approx(0.5)
    assert row["step_time_saved"] == pytest.approx(0.5)
    assert row["memory_saved"] == pytest.approx(0.5)
    assert results.compute_saved(summary[summary["method"] != "full"]).empty


def test_estimate_step_time_says_where_it_comes_from(runs):
    value, source = results.estimate_step_time(runs, "m", "layers", "(1, 3, 3)")
    assert value == pytest.approx(0.5) and "(1, 3, 3)" in source and "2" in source
    value, source = results.estimate_step_time(runs, "m", "bitfit")
    assert value is not None and "other methods" in source
    assert results.estimate_step_time(runs, "other-model", "full") == (
        None,
        "no earlier run of this model",
    )


def test_figures(runs):
    summary = results.summarise(results.results_table(runs, l_star=3))
    fig = figures.score_vs_layers(summary, "accuracy")
    names = {trace.name for trace in fig.data}
    assert {"ℓ*-down", "ℓ*-up", "baseline"} <= names
    down = next(t for t in fig.data if t.name == "ℓ*-down")
    assert list(down.y) == pytest.approx([0.82, 0.60]) and down.error_y.array[0] == pytest.approx(
        0.02
    )
    assert fig.layout.xaxis.title.text == "number of tuned layers"
    assert list(down.marker.symbol) == ["circle", "diamond"]  # (1, 3, 3) cut; (3, 3, 6) not

    fig = figures.score_vs_params(summary)
    assert fig.layout.xaxis.type == "log"
    front = next(t for t in fig.data if t.name == "Pareto frontier")
    assert list(front.x) == [50, 1000]  # lora (0.85) beats (1, 3, 3) (0.82) with fewer

    fig = figures.costs(summary)
    assert len(fig.data) == 2 and len(fig.data[0].x) == len(summary)

    saved = results.compute_saved(summary, n_layers=6)
    fig = figures.compute_saved(saved)
    assert fig.data[0].y[0] == pytest.approx(50.0)

    steps = pd.DataFrame(
        {
            "step": [1, 2, 2, 2],
            "kind": ["train", "train", "dev", "dev"],
            "key": ["loss", "loss", "dev", "train_loss"],
            "value": [0.7, 0.6, 0.8, 0.65],
        }
    )
    fig = figures.loss_curve(steps)
    assert [t.name for t in fig.data] == ["train loss", "dev score"]


def config_row(run_id, seed, score, dev=None, **config):
    row = run_row(run_id, config.get("method", "full"), stored_layers(config), seed, score, 1000,
                  1.0, 600)  # fmt: skip
    row["config_json"] = json.dumps({"method": "full", "seed": seed, **config})
    row["dev_score"] = score if dev is None else dev
    return row


def test_runs_that_differ_only_in_steps_are_never_pooled():
    # The example: three seed-0 full runs of 30, 100 and 150 steps are not "3 seeds".
    runs = pd.DataFrame(
        [
            config_row("s30", 0, 0.70, steps=30),
            config_row("s100", 0, 0.75, steps=100),
            config_row("s150", 0, 0.82, steps=150),
            config_row("s100b", 1, 0.77, steps=100),
        ]
    )
    table = results.results_table(runs)
    assert table.groupby("group")["id"].apply(set).map(len).sort_values().tolist() == [1, 1, 2]
    summary = results.summarise(table).set_index("label")
    assert sorted(summary.index) == ["full · steps 100", "full · steps 150", "full · steps 30"]
    assert summary.loc["full · steps 100", "n_seeds"] == 2
    assert summary.loc["full · steps 100", "score"] == pytest.approx(0.76)
    assert summary.loc["full · steps 30", "n_seeds"] == 1


def test_setting_key_ignores_only_seed_and_device():
    base = {"method": "layers", "layers": [1, 3], "classifier_layer": 3, "steps": 100}
    key = setting_key({**base, "seed": 0})
    assert setting_key({**base, "seed": 7, "device": "cuda:0"}) == key
    for change in ({"steps": 101}, {"lr": 1e-4}, {"classifier_lr": 1e-2}, {"batch_size": 8},
                   {"pooling": "first"}, {"max_length": 64}, {"zero_weights": "z.json"},
                   {"n_train": 100}, {"data": {"name": "trec6"}}, {"classifier_layer": 4}):  # fmt: skip
        assert setting_key({**base, **change}) != key, change
    # An explicit default equals a missing key, an option's too.
    assert setting_key({**base, "batch_size": 16, "classifier_lr": 1e-3}) == key
    lora = {**base, "method": "lora"}
    assert setting_key({**lora, "options": {"r": 8}}) == setting_key(lora)
    assert setting_key({**lora, "options": {"r": 4}}) != setting_key(lora)
    setting = run_setting({**lora, "options": {"r": 4, "layers_to_transform": [2, 3]}})
    assert setting["classifier_layer"] == 3 and setting["classifier_lr"] == 1e-3
    assert (setting["lora_r"], setting["lora_layers"]) == (
        4,
        [2, 3],
    ) and "lora_alpha" not in setting


def test_labels_tell_selectors_zero_files_and_subspaces_apart():
    heads = {"1": [0, 1], "2": [3]}
    runs = pd.DataFrame(
        [
            config_row("p0", 0, 0.8, method="heads", heads=heads,
                       heads_settings={"selector": "pagerank", "k": 2}),
            config_row("r0", 0, 0.7, method="heads", heads=heads,
                       heads_settings={"selector": "random", "k": 2}),
            config_row("z0", 0, 0.6, zero_weights="/c/zero-outliers.json"),
            config_row("z1", 0, 0.65, zero_weights="/c/zero-random-seed0.json"),
            config_row("i0", 0, 0.7, method="subspace", subspace_from="20260101-0000-abc123"),
            config_row("q0", 0, 0.6, method="subspace-random",
                       subspace_from="20260101-0000-abc123"),
        ]
    )  # fmt: skip
    labels = set(results.results_table(runs)["label"])
    assert labels == {
        "heads ×3 pagerank", "heads ×3 random", "full · zeroed zero-outliers",
        "full · zeroed zero-random-seed0", "subspace of abc123", "random subspace of abc123",
    }  # fmt: skip


def test_learning_rate_grid_is_chosen_on_dev_not_test():
    grid = {"method": "layers", "layers": [1, 3], "classifier_layer": 3, "classifier_lr": 1e-3}
    runs = pd.DataFrame(
        [
            config_row("a", 0, 0.90, dev=0.70, lr=2.5e-5, **grid),
            config_row("b", 0, 0.80, dev=0.85, lr=5e-5, **grid),
            config_row("c", 0, 0.85, dev=0.80, lr=1e-4, **grid),
            config_row("f", 0, 0.88, dev=0.88),
        ]
    )
    summary = results.summarise(results.results_table(runs, n_layers=6))
    choices = results.lr_choices(summary)
    assert choices["lr"].tolist() == [2.5e-5, 5e-5, 1e-4]
    assert choices.loc[choices["chosen"], "lr"].tolist() == [5e-5]  # best dev, not best test
    kept = results.without_unchosen_lrs(summary)
    assert sorted(kept["label"]) == ["(1, 3, 3) · lr 5e-05", "full"]


def test_group_arms_and_full_references(runs):
    table = results.results_table(runs, l_star=3)
    summary = results.summarise(table)
    refs = results.full_references(summary)
    assert refs["label"].tolist() == ["full"] and refs["n_seeds"].tolist() == [2]
    arms = results.group_arms(table, runs)
    full = arms[refs["group"].iloc[0]]
    assert sorted(full.scores) == [0.90, 0.92] and full.predictions == ()


def test_a_seed_trained_twice_counts_once():
    # The same setting and seed queued from two pages: one seed, its newest run (listed first).
    runs = pd.DataFrame(
        [
            config_row("new0", 0, 0.80, steps=100),
            config_row("old0", 0, 0.80, steps=100),
            config_row("s1", 1, 0.82, steps=100),
        ]
    )
    table = results.results_table(runs)
    assert list(table["id"]) == ["new0", "s1"]
    assert table.attrs["repeated_seeds"] == 1
    summary = results.summarise(table)
    assert summary["n_seeds"].tolist() == [2]
    # s.e. over the two distinct seeds, not shrunk by the repeated one
    assert summary["score_sem"].iloc[0] == pytest.approx(0.01)


def test_group_step_time_is_the_median_and_the_mean_is_kept_labelled(runs):
    """One seed slowed by a busy machine must not drag the group's step time (or the compute a
    cut model saves): the median stands, the mean stays beside it as step_time_s_mean."""
    slowed = [
        run_row("a2", "full", None, 2, 0.91, 1000, 1.0, 600),
        run_row("b2", "layers", (1, 3, 3), 2, 0.82, 300, 2.3, 300),  # 4.6× its seeds' time
    ]
    table = results.results_table(pd.concat([runs, pd.DataFrame(slowed)], ignore_index=True))
    summary = results.summarise(table).set_index("label")
    cut = summary.loc["(1, 3, 3)"]
    assert cut["step_time_s"] == pytest.approx(0.5)  # median of 0.5, 0.5, 2.3
    assert cut["step_time_s_mean"] == pytest.approx(1.1)
    assert cut["step_time_s_sem"] == pytest.approx(np.std([0.5, 0.5, 2.3], ddof=1) / np.sqrt(3))
    saved = results.compute_saved(summary.reset_index(), n_layers=6)
    assert saved.iloc[0]["step_time_saved"] == pytest.approx(0.5)  # by the mean: −0.1
