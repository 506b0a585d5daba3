"""The comparison rule (docs/explanation/statistics.md, "Comparing two settings") on hand-made
score tables, the paired bootstrap, and the compact per-example predictions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.compare import (
    Arm,
    _resampled_scores,
    compare,
    comparisons_frame,
    mean_se,
    paired_bootstrap_p,
)
from analysis.predictions import decode_predictions, encode_predictions, fingerprint_of_part
from analysis.scores import task_score


def test_mean_and_standard_error_known_answer():
    mean, se, n = mean_se([0.80, 0.82, 0.84])
    assert mean == pytest.approx(0.82) and n == 3
    assert se == pytest.approx(0.02 / math.sqrt(3))  # sd(ddof=1) = 0.02
    assert math.isnan(mean_se([0.8])[1])


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        # diff 0.10, se = √2 · 0.02/√3 = 0.0163: 0.10 > 0.033
        ([0.80, 0.82, 0.84], [0.70, 0.72, 0.74], "A better"),
        ([0.70, 0.72, 0.74], [0.80, 0.82, 0.84], "B better"),
        # diff 0.01 < t · se
        ([0.80, 0.82, 0.84], [0.79, 0.81, 0.83], "no difference shown (n seeds = 3, 3)"),
        # diff 0.04: above 2 se = 0.0327 but below t · se = 2.776 · 0.0163 = 0.0453 (Welch df 4)
        ([0.80, 0.82, 0.84], [0.76, 0.78, 0.80], "no difference shown (n seeds = 3, 3)"),
        ([0.80, 0.82, 0.84], [0.75, 0.77, 0.79], "A better"),  # 0.05 > 0.0453
        ([0.80, 0.82, 0.84, 0.74], [0.76, 0.78, 0.80], "no difference shown (n seeds = 4, 3)"),
        # one seed: no standard error, no verdict whatever the gap
        ([0.95], [0.50, 0.52, 0.54], "no difference shown (n seeds = 1, 3)"),
    ],
)
def test_verdict_rule_on_hand_made_tables(a, b, verdict):
    result = compare(a, b)
    assert result.verdict == verdict
    assert result.diff == pytest.approx(np.mean(a) - np.mean(b))
    assert result.n_seeds_a == len(a) and result.n_seeds_b == len(b)
    assert result.paired_p is None  # no predictions: no paired bootstrap
    if len(a) > 1:
        se = math.hypot(
            np.std(a, ddof=1) / math.sqrt(len(a)), np.std(b, ddof=1) / math.sqrt(len(b))
        )
        assert result.se == pytest.approx(se)


def test_names_appear_in_the_verdict_and_the_json():
    result = compare(Arm("PageRank", (0.9, 0.91, 0.92)), Arm("random", (0.8, 0.81, 0.82)))
    assert result.verdict == "PageRank better" and result.winner == "A"
    payload = result.to_dict()
    assert list(payload)[:6] == ["diff", "se", "verdict", "n_seeds_a", "n_seeds_b", "paired_p"]
    one = compare([0.9], [0.8]).to_dict()
    assert one["se"] is None and one["verdict"].startswith("no difference shown")
    frame = comparisons_frame([result])
    assert frame.loc[0, "lo"] == pytest.approx(result.diff - result.margin)


def test_predictions_round_trip_compactly():
    preds = np.array([0, 1, 5, 2] * 250)
    labels = np.array([0, 1, 1, 2] * 250)
    record = encode_predictions(preds, labels, "abc", regression=False)
    assert len(record["predictions"]) < 3 * len(preds)
    back, gold, fingerprint = decode_predictions(record)
    assert back.tolist() == preds.tolist() and gold.tolist() == labels.tolist()
    assert fingerprint == "abc"
    floats = encode_predictions(np.array([0.25, 1.5]), np.array([0.0, 2.0]), "x", regression=True)
    assert decode_predictions(floats)[0].tolist() == [0.25, 1.5]
    assert decode_predictions(None) is None and decode_predictions({"format": "other"}) is None
    assert fingerprint_of_part(["a", "b"], [0, 1]) != fingerprint_of_part(["a", "b"], [1, 0])


@pytest.mark.parametrize(
    ("metric", "n_classes"), [("accuracy", 2), ("accuracy", 4), ("f1", 2), ("mcc", 2), ("mcc", 4)]
)
def test_resampled_scores_match_the_task_score(metric, n_classes):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, n_classes, 300).astype(float)
    preds = np.where(rng.random(300) < 0.7, labels, rng.integers(0, n_classes, 300)).astype(float)
    counts = rng.multinomial(300, np.full(300, 1 / 300), size=5).astype(float)
    fast = _resampled_scores(preds, labels, metric, counts)
    for b in range(5):
        rows = np.repeat(np.arange(300), counts[b].astype(int))
        assert fast[b] == pytest.approx(task_score(metric, labels[rows], preds[rows]), abs=1e-12)


def test_paired_bootstrap_p():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 400).astype(float)
    right = labels.copy()
    coin = np.where(rng.random(400) < 0.5, labels, 1 - labels)
    assert paired_bootstrap_p([right], [coin], labels, "accuracy", n_boot=500) < 0.01
    assert paired_bootstrap_p([coin], [coin], labels, "accuracy", n_boot=500) == 1.0
    # Almost the same predictions: a tiny difference the test sample cannot pin down
    close = coin.copy()
    close[:2] = labels[:2]
    assert paired_bootstrap_p([close], [coin], labels, "accuracy", n_boot=500) > 0.05
    # Deterministic for a seed
    a = paired_bootstrap_p([close], [coin], labels, "mcc", n_boot=300, seed=3)
    assert a == paired_bootstrap_p([close], [coin], labels, "mcc", n_boot=300, seed=3)


def test_arms_from_results_pair_only_on_one_test_part():
    labels = np.array([0, 1] * 50)
    good = np.where(np.arange(100) < 95, labels, 1 - labels)
    bad = np.where(np.arange(100) < 60, labels, 1 - labels)

    def result(preds, fingerprint="t1"):
        rec = encode_predictions(preds, labels, fingerprint, False)
        return {"score": float(np.mean(preds == labels)), "metric": "accuracy",
                "test_predictions": rec}  # fmt: skip

    a = Arm.from_results("A", [result(good), result(good)])
    b = Arm.from_results("B", [result(bad), result(bad)])
    paired = compare(a, b)
    assert paired.paired_p is not None and paired.paired_p < 0.01
    other_part = Arm.from_results("B", [result(bad, "t2"), result(bad, "t2")])
    assert compare(a, other_part).paired_p is None
    legacy = Arm.from_results("B", [{"score": 0.6, "metric": "accuracy"}, result(bad)])
    assert legacy.n_seeds == 2 and compare(a, legacy).paired_p is None


def test_welch_margin_known_answer():
    """Equal spreads, 3 seeds a side: df = 4, t = 2.776 (scipy), margin = t · se; unequal
    spreads give the Welch–Satterthwaite df."""
    c = compare([0.80, 0.82, 0.84], [0.70, 0.72, 0.74])
    assert c.df == pytest.approx(4.0)
    assert c.margin == pytest.approx(2.7764451 * c.se, rel=1e-6)
    lo, hi = c.interval()
    assert hi - lo == pytest.approx(2 * c.margin)
    u = compare([0.80, 0.82, 0.84], [0.70, 0.80, 0.90])
    se_a, se_b = 0.02 / math.sqrt(3), 0.1 / math.sqrt(3)
    assert u.df == pytest.approx((se_a**2 + se_b**2) ** 2 / (se_a**4 / 2 + se_b**4 / 2))
    assert c.to_dict()["df"] == pytest.approx(4.0)


def test_paired_t_over_seeds_known_answer():
    """d = A − B per seed = (0.02, 0.03, 0.02): d̄ = 0.0233, se = sd(d)/√3 = 0.00333, df 2,
    margin t_{0.975, 2} · se = 4.303 · 0.00333 = 0.0143 < d̄: A better. Welch on the same scores
    (se 0.0167, margin ≈ 0.046) shows no difference: the seeds' common part cancels in d."""
    a, b = [0.80, 0.82, 0.84], [0.78, 0.79, 0.82]
    paired = compare(a, b, test="paired")
    d = np.subtract(a, b)
    assert paired.test == "paired" and paired.n_pairs == 3 and paired.df == 2
    assert paired.diff == pytest.approx(d.mean())
    assert paired.se == pytest.approx(d.std(ddof=1) / math.sqrt(3))
    assert paired.margin == pytest.approx(4.3026527 * paired.se, rel=1e-6)
    assert paired.verdict == "paired t (3 pairs): A better" and paired.winner == "A"
    welch = compare(a, b)
    assert welch.test == "welch" and welch.n_pairs is None
    assert welch.verdict == "no difference shown (n seeds = 3, 3)"
    payload = paired.to_dict()
    assert payload["test"] == "paired" and payload["n_pairs"] == 3
    assert welch.to_dict()["test"] == "welch" and welch.to_dict()["n_pairs"] is None
    frame = comparisons_frame([paired, welch])
    assert frame["test"].tolist() == ["paired", "welch"]
    assert frame.loc[0, "lo"] == pytest.approx(paired.diff - paired.margin)
    with pytest.raises(ValueError, match="Unknown test"):
        compare(a, b, test="z")


def test_paired_t_pairs_only_the_seeds_both_arms_have():
    a = Arm("A", (0.80, 0.82, 0.84, 0.70), seeds=(0, 1, 2, 9))
    b = Arm("B", (0.90, 0.81, 0.83, 0.82), seeds=(5, 1, 2, 0))
    c = compare(a, b, test="paired")
    assert c.n_pairs == 3 and (c.n_seeds_a, c.n_seeds_b) == (4, 4)
    assert c.diff == pytest.approx(np.mean([0.80 - 0.82, 0.82 - 0.81, 0.84 - 0.83]))
    assert c.mean_a == pytest.approx(0.82) and c.mean_b == pytest.approx(
        np.mean([0.82, 0.81, 0.83])
    )
    assert c.verdict == "paired t (3 pairs): no difference shown (n seeds = 4, 4)"
    one = compare(Arm("A", (0.8,), seeds=(0,)), Arm("B", (0.7,), seeds=(0,)), test="paired")
    assert one.n_pairs == 1 and math.isnan(one.se) and not one.decided


def test_arms_carry_their_seeds():
    results = [{"score": 0.8, "metric": "accuracy", "seed": 2},
               {"score": None, "seed": 5}, {"score": 0.9, "metric": "accuracy", "seed": 0}]  # fmt: skip
    arm = Arm.from_results("A", results)
    assert arm.seeds == (2, 0) and arm.by_seed() == {2: 0.8, 0: 0.9}
    unknown = Arm.from_results("B", [{"score": 0.8}, {"score": 0.7, "seed": 1}])
    assert unknown.seeds == () and unknown.n_seeds == 2
    twice = Arm.from_results("C", [{"score": 0.8, "seed": 1}, {"score": 0.7, "seed": 1}])
    assert twice.seeds == ()
    with pytest.raises(ValueError, match="needs each score's seed"):
        compare(arm, unknown, test="paired")
    assert compare(arm, unknown).test == "welch"  # Welch needs no seeds
    with pytest.raises(ValueError, match="2 seeds for 3 scores"):
        Arm("D", (0.1, 0.2, 0.3), seeds=(0, 1))
    with pytest.raises(ValueError, match="appears twice"):
        Arm("D", (0.1, 0.2), seeds=(1, 1))
