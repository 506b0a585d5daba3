"""The probe's regularisation is chosen by cross-validation
(docs/explanation/layer-metrics.md, "The probe and its cross-validation")."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from analysis.layers.probe import FALLBACK_C, PROBE_GRID, fit_probe, probe_score


def gaussian_task(seed: int, n: int, d: int = 384, signal: float = 0.05):
    """Two Gaussian classes whose means differ by 2·signal per coordinate."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=d) * signal

    def draw(m: int):
        y = rng.integers(0, 2, m)
        return (2 * y - 1)[:, None] * mu + rng.normal(size=(m, d)), y

    return draw(n), draw(4000)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tuned_probe_is_near_the_best_c_in_hindsight_where_c_1_is_not(seed):
    """A few hundred examples in d = 384: C = 1 overfits by several points; CV finds a C whose
    test accuracy is within two points of the best C chosen on the test part itself."""
    (x_tr, y_tr), (x_te, y_te) = gaussian_task(seed, n=600)
    scaler = StandardScaler().fit(x_tr)
    hindsight = {
        c: np.mean(
            LogisticRegression(C=c, max_iter=1000)
            .fit(scaler.transform(x_tr), y_tr)
            .predict(scaler.transform(x_te))
            == y_te
        )
        for c in PROBE_GRID
    }
    best = max(hindsight.values())
    fit = fit_probe(x_tr, y_tr, "accuracy", seed=seed)
    tuned = np.mean(fit.predict(x_te) == y_te)
    assert best - tuned <= 0.02, (hindsight, fit.c, tuned)
    assert best - hindsight[1.0] >= 0.025, hindsight
    assert fit.c in PROBE_GRID and len(fit.cv_scores) == len(PROBE_GRID)
    assert fit.cv_score == max(fit.cv_scores)
    assert probe_score(x_tr, y_tr, x_te, y_te, "accuracy", seed=seed) == pytest.approx(tuned)


def test_probe_is_deterministic_and_handles_odd_inputs():
    (x_tr, y_tr), (x_te, _) = gaussian_task(0, n=200, d=16, signal=0.5)
    a, b = fit_probe(x_tr, y_tr, "accuracy", seed=3), fit_probe(x_tr, y_tr, "accuracy", seed=3)
    assert a.c == b.c and np.array_equal(a.predict(x_te), b.predict(x_te))
    names = np.where(y_tr == 1, "pos", "neg")  # any label values
    assert set(fit_probe(x_tr, names, "accuracy").predict(x_te)) <= {"pos", "neg"}
    tiny = fit_probe(x_tr[:3], np.array([0, 1, 1]), "accuracy")  # one example of class 0
    assert tiny.c == FALLBACK_C and np.isnan(tiny.cv_score)
    with pytest.raises(ValueError, match="two classes"):
        fit_probe(x_tr, np.zeros(len(x_tr)), "accuracy")


def test_regression_probe_chooses_its_ridge_strength_by_cv():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 50))
    y = x[:, 0] * 2.0 + rng.normal(size=300) * 0.5
    fit = fit_probe(x[:200], y[:200], "spearman")
    assert fit.regression and fit.c in PROBE_GRID and fit.cv_score > 0.8
    assert probe_score(x[:200], y[:200], x[200:], y[200:], "spearman") > 0.8
    with pytest.raises(ValueError, match="no class probabilities"):
        fit.probabilities(x)


def test_cv_predictions_predict_each_example_by_the_probe_fit_without_its_fold():
    """The probe score: 5 stratified outer folds fixed by the seed; example n is predicted
    by `fit_probe` (inner 3-fold CV for C) on the other folds; the score is over all N."""
    from analysis.layers.probe import cv_predictions, outer_folds

    (x, y), (x_te, y_te) = gaussian_task(0, n=500, d=50, signal=0.15)
    folds = outer_folds(y, seed=4)
    assert sorted(np.unique(folds)) == [0, 1, 2, 3, 4]
    for k in range(5):  # stratified: every fold keeps the class shares within one example
        assert abs(np.mean(y[folds == k]) - np.mean(y)) < 0.02
    np.testing.assert_array_equal(folds, outer_folds(y, seed=4))  # fixed by the seed
    cv = cv_predictions(x, y, "accuracy", folds, seed=4)
    for k in (0, 3):
        held = folds == k
        fit = fit_probe(x[~held], y[~held], "accuracy", seed=4)
        np.testing.assert_array_equal(cv.predictions[held], fit.predict(x[held]))
        assert cv.c_folds[k] == fit.c
    assert cv.score == pytest.approx(np.mean(cv.predictions == y))
    truth = np.mean(fit_probe(x, y, "accuracy").predict(x_te) == y_te)  # ≈ the probe's accuracy
    assert abs(cv.score - truth) < 3 * cv.se + 0.02 and 0 < cv.se < 0.05
    assert outer_folds(np.array([0, 0, 1])) is None  # a class of one: no stratified folds
