"""Bootstrap repeats of the layer metrics (SPEC.md, "Repeats"): deterministic for a seed, split by
distinct example, summaries and the verdict rules they feed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from analysis.layers import repeats as rp
from analysis.layers.probe import _group_folds, fit_probe


def synthetic_states(n_layers=3, n=90, d=8, seed=0):
    """Three classes whose means grow apart with depth: layer ℓ separates them by ℓ/L."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    means = rng.normal(0, 1, (3, d))
    states = np.stack(
        [
            means[labels] * (layer / n_layers) + rng.normal(0, 1, (n, d))
            for layer in range(n_layers + 1)
        ]
    ).astype(np.float32)  # (L+1, N, d)
    return states, labels


def test_repeats_are_deterministic_for_a_seed_and_independent_of_r():
    states, labels = synthetic_states()
    first = rp.layer_repeats(states, labels, seed=3, repeats=2)
    again = rp.layer_repeats(states, labels, seed=3, repeats=2)
    assert np.array_equal(first.values, again.values, equal_nan=True)
    assert first.values.shape == (2, 4, 5) and np.isfinite(first.values).all()
    shorter = rp.layer_repeats(states, labels, seed=3, repeats=1, which=("nu", "cca"))
    assert np.array_equal(shorter.values[0, :, :2], first.values[0, :, :2])  # repeat r is fixed
    other = rp.layer_repeats(states, labels, seed=4, repeats=2, which=("nu",))
    assert not np.array_equal(other.values[:, :, 0], first.values[:, :, 0])
    assert not np.array_equal(first.values[0], first.values[1], equal_nan=True)  # they differ


def test_bootstrap_keeps_class_counts_and_copies_stay_on_one_side():
    labels = np.repeat([0, 1, 2], [50, 30, 20])
    rows = rp.bootstrap_indices(labels, np.random.default_rng(0))
    assert np.bincount(labels[rows]).tolist() == [50, 30, 20]
    assert len(np.unique(rows)) < len(rows)  # copies, as a bootstrap has
    split, groups = rp.split_by_example(rows, labels, seed=1)
    assert sorted(np.concatenate([split.train, split.dev, split.test]).tolist()) == list(range(100))
    train, held = set(rows[split.train]), set(rows[np.r_[split.dev, split.test]])
    assert not train & held  # no example on both sides
    assert np.array_equal(np.unique(groups[split.train]).size, len(train))
    # The folds of the probe's CV split distinct examples too.
    y, g = labels[rows][split.train], groups[split.train]
    first = np.unique(np.unique(g, return_inverse=True)[1], return_index=True)[1]
    folds = _group_folds(
        StratifiedKFold(3, shuffle=True, random_state=0),
        y,
        np.unique(g, return_inverse=True)[1],
        first,
    )
    for fit_rows, scored in folds:
        assert not set(g[fit_rows]) & set(g[scored])
    assert math.isfinite(fit_probe(np.random.default_rng(0).normal(size=(len(y), 4)), y,
                                   "accuracy", groups=g).c)  # fmt: skip


def test_summary_standard_errors_and_shares():
    states, labels = synthetic_states()
    rep = rp.layer_repeats(states, labels, seed=0, repeats=3)
    se = rep.standard_errors()
    assert list(se.columns) == ["layer", "nu_se", "cca_se", "rank_se", "probe_se"]
    assert se.loc[1, "nu_se"] == pytest.approx(np.std(rep.values[:, 1, 0], ddof=1))
    summ = rp.summarise_repeats(rep)
    assert summ.repeats == 3 and len(summ.rho["nu"]) == 3
    lo, hi = summ.rho_interval["nu"]
    assert lo <= summ.rho_mean["nu"] <= hi
    assert (lo, hi) == pytest.approx(tuple(np.percentile(summ.rho["nu"], [5, 95])))
    assert sum(summ.l_star_share.values()) == pytest.approx(1.0)
    assert summ.modal_l_star == 3 and summ.stable  # the deepest layer separates best
    assert summ.l_star_sentence() == "ℓ* = 3 in 3 of 3 repeats"
    assert summ.rho_mean["nu"] < -0.5  # ν falls as the probe rises


def test_l_star_sentence_names_the_runners_up():
    summ = rp.RepeatSummary(5, {}, {}, {}, np.array([2, 2, 3, 2, 4]), {2: 0.6, 3: 0.2, 4: 0.2},
                            np.zeros(5))  # fmt: skip
    assert summ.l_star_sentence() == "ℓ* = 2 in 3 of 5 repeats (3 in 1, 4 in 1)"
    assert not summ.stable


@pytest.mark.parametrize(
    ("mean", "interval", "verdict"),
    [
        (-0.9, (-0.97, -0.8), "holds"),
        (-0.7, (-0.9, -0.55), "holds weakly"),
        (-0.4, (-0.9, 0.2), "inconclusive"),
        (0.3, (0.04, 0.65), "does not hold"),
        (math.nan, (math.nan, math.nan), "inconclusive"),
    ],
)
def test_rho_verdict(mean, interval, verdict):
    assert rp.rho_verdict(mean, interval) == verdict


@pytest.mark.parametrize(
    ("shares", "verdict"),
    [
        ({3: 0.8, 4: 0.2}, "holds"),
        ({6: 1.0}, "does not hold"),
        ({1: 0.4, 6: 0.4, 3: 0.2}, "does not hold"),
        ({3: 0.6, 6: 0.4}, "inconclusive"),
    ],
)
def test_mid_network_verdict(shares, verdict):
    assert rp.mid_network_verdict(shares, n_layers=6) == verdict


def test_add_repeats_keeps_one_repeat_as_is():
    states, labels = synthetic_states()
    base = {"layers": [{"layer": i, "nu": 1.0} for i in range(4)], "rho": {}}
    one = rp.layer_repeats(states, labels, repeats=1, which=("nu",))
    assert rp.add_repeats(base, one) is base
    two = rp.add_repeats(base, rp.layer_repeats(states, labels, repeats=2, which=("nu", "cca")))
    assert two["repeats"] == 2 and set(two["rho_interval"]) == {"nu", "cca", "rank"}
    assert {"nu_se", "cca_se", "rank_se", "probe_se"} <= set(two["layers"][0])
    assert all(isinstance(k, str) for k in two["l_star_share"])


def test_each_repeat_chooses_c_among_the_table_choice_and_its_neighbours():
    assert rp.neighbour_grid(1e-2) == (1e-3, 1e-2, 1e-1)
    assert rp.neighbour_grid(1e-4) == (1e-4, 1e-3)
    assert rp.neighbour_grid(None) == rp.PROBE_GRID == rp.neighbour_grid(float("nan"))
    states, labels = synthetic_states()
    rep = rp.layer_repeats(states, labels, repeats=2, probe_c=[1e-3] * 4)
    assert set(rep.values[:, :, 4].ravel()) <= {1e-4, 1e-3, 1e-2}
