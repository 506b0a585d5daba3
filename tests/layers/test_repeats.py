"""Bootstrap repeats of the layer metrics
(docs/explanation/statistics.md, "Repeats and bootstrap intervals"):
deterministic for a seed, intervals around the full-sample value (each contains its estimate; BCa
covers near its level on problems with a known answer), ℓ* as counts, rules in integers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.layers import repeats as rp
from analysis.layers import table
from analysis.layers.metrics import nu


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
    np.testing.assert_array_equal(first.values, again.values)
    np.testing.assert_array_equal(first.jackknife, again.jackknife)
    longer = rp.layer_repeats(states, labels, seed=3, repeats=4, which=("nu", "cca"))
    np.testing.assert_array_equal(longer.values[:2, :, :2], first.values[:, :, :2])
    assert np.isnan(longer.values[:, :, 2:]).all()  # rank and probe left out
    other = rp.layer_repeats(states, labels, seed=4, repeats=2, which=("nu",))
    assert not np.allclose(other.values[:, :, 0], first.values[:, :, 0])


def test_a_repeat_is_the_metrics_of_its_resample_with_the_probe_predictions_kept():
    """ν of a repeat is ν of the resampled rows; its probe score is the accuracy of the table's
    out-of-fold predictions on those rows (the probe is not refit)."""
    states, labels = synthetic_states(n=120)
    df = table.layer_metrics(states, labels, seed=1)
    rep = rp.layer_repeats(states, labels, seed=1, repeats=3, table=df)
    np.testing.assert_allclose(rep.full, df[["nu", "cca", "rank", "probe"]].to_numpy())
    rng = np.random.default_rng([1, 2])
    rows = rp.bootstrap_indices(labels, rng)
    assert rep.values[2, 3, 0] == pytest.approx(nu(states[3][rows], labels[rows]), rel=1e-12)
    pred = df.attrs["probe_predictions"][3]
    assert rep.values[2, 3, 3] == pytest.approx(np.mean(pred[rows] == labels[rows]))
    assert np.bincount(labels[rows]).tolist() == np.bincount(labels).tolist()  # stratified


def test_cv_probe_predicts_every_example_once_with_folds_shared_by_layers():
    states, labels = synthetic_states(n=150)
    df = table.layer_metrics(states, labels, seed=0)
    pred = df.attrs["probe_predictions"]
    assert pred.shape == (4, 150) and np.isfinite(pred).all()
    for layer in range(4):
        assert df.loc[layer, "probe"] == pytest.approx(np.mean(pred[layer] == labels))
    assert df["probe"].iloc[3] > df["probe"].iloc[0] + 0.2  # the deep layer separates
    assert len(df.attrs["probe_c_folds"][1]) == 5 and df.attrs["probe_folds"] == 5
    assert (df["probe_se"] > 0).all() and (df["probe_se"] < 0.1).all()


def test_summary_intervals_contain_their_estimates_and_l_star_counts():
    states, labels = synthetic_states(n=150)
    rep = rp.layer_repeats(states, labels, seed=0, repeats=50)
    summ = rp.summarise_repeats(rep)
    assert summ.repeats == 50 and sum(summ.l_star_counts.values()) == 50
    assert summ.l_star == 3 and summ.modal_l_star == 3 and summ.stable
    assert summ.l_star_sentence().startswith("ℓ* = 3 in ")
    est = summ.rho["nu"]
    assert est.value == pytest.approx(rp.curve_summary(rep.full)["rho"]["nu"])
    assert est.value < -0.5  # ν falls as the probe rises
    shown = [*summ.rho.values(), *summ.abs_rho.values(), summ.zeta]
    for e in shown:
        if e.interval is not None:
            assert e.lo <= e.value <= e.hi, e
    bounds = rep.intervals()
    for j, m in enumerate(("nu", "cca", "rank", "probe")):
        lo, hi = bounds[f"{m}_lo"].to_numpy(), bounds[f"{m}_hi"].to_numpy()
        ok = np.isfinite(lo)
        assert ok.sum() >= 2 or m == "rank", m  # rank: a resample's copies bias it (no interval)
        assert (lo[ok] <= rep.full[ok, j]).all() and (rep.full[ok, j] <= hi[ok]).all(), m
    se = rep.standard_errors()
    assert se.loc[1, "nu_se"] == pytest.approx(np.std(rep.values[:, 1, 0], ddof=1))


def test_fewer_than_fifty_repeats_give_standard_errors_not_intervals():
    states, labels = synthetic_states()
    summ = rp.summarise_repeats(rp.layer_repeats(states, labels, repeats=5, which=("nu", "probe")))
    est = summ.rho["nu"]
    assert est.interval is None and math.isfinite(est.se)
    assert "s.e." in est.text() and "R ≥ 50" in est.text()
    assert est.to_dict()["interval"] is None and est.to_dict()["estimate"] == est.value


def test_bca_refuses_an_estimate_outside_its_replicates():
    lo, hi, method, note = rp.bca_interval(1.0, np.linspace(1.2, 2.7, 50))
    assert math.isnan(lo) and "above" in note
    lo, hi, method, _ = rp.bca_interval(0.0, np.random.default_rng(0).normal(size=200))
    assert lo < 0 < hi and method == "BC"


@pytest.mark.parametrize("stat", ["mean_exponential", "nu_gaussian"])
def test_bca_interval_covers_near_its_level_on_a_known_answer(stat):
    """90 % BCa intervals over 200 synthetic problems whose true value is known: the share that
    cover it lies within ±3 binomial s.e. (±0.064) of 0.90 — a test that fails for the plain
    percentile interval of R = 5, or for intervals that miss their estimate."""
    rng = np.random.default_rng(11)
    trials, covered = 200, 0
    for _ in range(trials):
        if stat == "mean_exponential":
            x = rng.exponential(1.0, 60)
            truth, value = 1.0, x.mean()
            boots = rng.choice(x, size=(100, len(x))).mean(axis=1)
            jack = np.array([np.delete(x, np.arange(g, 60, 20)).mean() for g in range(20)])
        else:
            # two classes, means ±μ e₁, identity within-class covariance: ν = 1 / (2 μ²)
            mu, n, d = 1.0, 300, 3
            labels = np.repeat([0, 1], n // 2)
            h = rng.normal(size=(n, d))
            h[:, 0] += np.where(labels == 1, mu, -mu)
            truth = 1 / (2 * mu**2) * 4 / 4  # Σ_b = μ² e₁e₁ᵀ (centred means ±μ)
            value = nu(h, labels)
            boots = np.array([
                nu(h[r], labels[r])
                for r in (rp.bootstrap_indices(labels, np.random.default_rng(int(s)))
                          for s in rng.integers(2**31, size=100))
            ])  # fmt: skip
            groups = rp.jackknife_groups(labels, 0)
            jack = np.array([nu(h[groups != g], labels[groups != g]) for g in range(20)])
        lo, hi, _, _ = rp.bca_interval(value, boots, jack, 0.9)
        if math.isfinite(lo):
            assert lo <= value <= hi
        covered += bool(lo <= truth <= hi)
    assert abs(covered / trials - 0.9) <= 0.064, covered


def test_difference_of_zeta_uses_the_same_resamples():
    states, labels = synthetic_states(n=120)
    mean = rp.layer_repeats(states, labels, seed=0, repeats=50, which=("nu",))
    rough = states.copy()
    rough[2] += np.random.default_rng(1).normal(0, 3, rough[2].shape).astype(np.float32)
    first = rp.layer_repeats(rough, labels, seed=0, repeats=50, which=("nu",))
    diff = rp.difference_estimate(first, mean)
    z = rp.curve_summary
    assert diff.value == pytest.approx(z(first.full)["zeta"] - z(mean.full)["zeta"])
    if diff.interval is not None:
        assert diff.lo <= diff.value <= diff.hi


def test_l_star_sentence_names_the_runners_up():
    summ = rp.RepeatSummary(
        repeats=5, rho={}, abs_rho={}, zeta=rp.Estimate(math.nan, math.nan),
        rho_replicates={}, zeta_replicates=np.array([]), l_star=2,
        l_star_replicates=np.array([2, 2, 3, 2, 4]), l_star_counts={2: 3, 3: 1, 4: 1},
    )  # fmt: skip
    assert summ.l_star_sentence() == "ℓ* = 2 in 3 of 5 repeats (3 in 1, 4 in 1)"
    assert not summ.stable


@pytest.mark.parametrize(
    "value, interval, verdict",
    [
        (-0.9, (-0.97, -0.6), "holds"),
        (-0.7, (-0.9, -0.55), "holds weakly"),
        (-0.4, (-0.8, 0.1), "inconclusive"),
        (0.3, (-0.6, 0.6), "inconclusive"),
        (0.3, (-0.45, 0.6), "does not hold"),
        (-0.9, None, "inconclusive"),
    ],
)
def test_rho_verdict(value, interval, verdict):
    lo, hi = interval or (math.nan, math.nan)
    assert rp.rho_verdict(rp.Estimate(value, 0.1, lo, hi, "BCa")) == verdict


@pytest.mark.parametrize(
    "repeats, middle, verdict",
    [(5, 4, "holds"), (5, 3, "inconclusive"), (10, 8, "holds"), (10, 7, "inconclusive"),
     (20, 16, "holds"), (20, 15, "inconclusive")],
)  # fmt: skip
def test_mid_network_rule_in_counts_at_the_boundaries(repeats, middle, verdict):
    """k of R ≥ ⌈0.8 R⌉ exactly: 4 of 5, 8 of 10 (0.1 + 0.7 summed as floats is 0.7999…), 16 of
    20; one fewer is not enough. The rest of the repeats pick an edge layer."""
    counts = {3: middle - 1, 4: 1, 6: repeats - middle} if middle > 1 else {6: repeats}
    assert rp.mid_network_verdict(counts, repeats, n_layers=6) == verdict
    edges = {1: 1, 6: middle - 1, 3: repeats - middle}  # the mirror: edges win
    flip = {"holds": "does not hold", "inconclusive": "inconclusive"}[verdict]
    assert rp.mid_network_verdict(edges, repeats, n_layers=6) == flip


def test_at_least_share_is_exact():
    assert rp.at_least_share(4, 5) and not rp.at_least_share(3, 5)
    assert rp.at_least_share(8, 10) and rp.at_least_share(40, 50) and not rp.at_least_share(39, 50)


def test_add_repeats_keeps_one_repeat_as_is_and_replaces_bare_numbers():
    states, labels = synthetic_states(n=150)
    base = {"layers": [{"layer": i} for i in range(4)], "rho": {}, "zeta": 0.1, "l_star": 3}
    one = rp.layer_repeats(states, labels, repeats=1, which=("nu",))
    assert rp.add_repeats(base, one) is base
    out = rp.add_repeats(base, rp.layer_repeats(states, labels, repeats=50))
    assert out["repeats"] == 50 and set(out["rho"]) == {"nu", "cca", "rank"}
    assert set(out["rho"]["nu"]) >= {"estimate", "se", "interval", "method", "level"}
    assert isinstance(out["zeta"], dict) and isinstance(out["l_star"], dict)
    assert out["l_star"]["estimate"] == 3 and sum(out["l_star"]["counts"].values()) == 50
    assert {"nu_se", "nu_lo", "nu_hi", "probe_se", "probe_lo"} <= set(out["layers"][0])
    assert all(isinstance(k, str) for k in out["l_star"]["counts"])
