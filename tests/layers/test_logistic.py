"""The probe's L-BFGS logistic regression against scikit-learn's ``LogisticRegression``: the same
objective and optimiser, so the same fits to the solver's tolerance."""

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from analysis.layers.logistic import L2Logistic


def blobs(n_classes: int, n: int = 400, d: int = 40, seed: int = 0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    x = rng.standard_normal((n, d)) + 0.4 * rng.standard_normal((n_classes, d))[y]
    return x.astype(dtype), y


@pytest.mark.parametrize("n_classes", [2, 5])
@pytest.mark.parametrize("c", [1e-3, 0.1, 10.0])
def test_fit_equals_scikit_learn(n_classes, c):
    x, y = blobs(n_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a max_iter warning at large C is scikit-learn's
        ref = LogisticRegression(C=c, max_iter=300).fit(x, y)
    ours = L2Logistic(C=c).fit(x, y)
    assert ours.coef_.shape == ref.coef_.shape and ours.intercept_.shape == ref.intercept_.shape
    scale = np.abs(ref.coef_).max()
    assert np.abs(ours.coef_ - ref.coef_).max() <= 1e-3 * scale
    assert np.array_equal(ours.predict(x), ref.predict(x))
    assert np.abs(ours.predict_proba(x) - ref.predict_proba(x)).max() < 1e-3
    assert np.allclose(ours.predict_proba(x).sum(axis=1), 1.0)
    assert abs(int(ours.n_iter_[0]) - int(ref.n_iter_[0])) <= 2


def test_warm_start_follows_the_path_and_ends_where_a_cold_start_ends():
    x, y = blobs(3, seed=1)
    warm, ref = L2Logistic(C=1e-3, warm_start=True), LogisticRegression(C=1e-3, warm_start=True)
    for c in (1e-3, 1e-2, 1e-1, 1.0):
        warm.set_params(C=c).fit(x, y)
        ref.set_params(C=c).fit(x, y)
        assert np.abs(warm.coef_ - ref.coef_).max() <= 1e-3 * np.abs(ref.coef_).max()
    cold = L2Logistic(C=1.0).fit(x, y)
    # Both stop at gtol = 1e-4 on the gradient; with l2 = 1 / (C n) = 0.0025 that leaves the
    # coefficients up to ≈ 1e-4 / 0.0025 apart in the flattest direction, predictions alike.
    assert np.abs(warm.coef_ - cold.coef_).max() <= 2e-2 * np.abs(cold.coef_).max()
    assert np.mean(warm.predict(x) == cold.predict(x)) >= 0.99
    # A start set by hand (the probe's refit from the folds' mean coefficients) is used.
    started = L2Logistic(C=1.0, warm_start=True)
    started.coef_, started.intercept_ = cold.coef_.copy(), cold.intercept_.copy()
    assert started.fit(x, y).n_iter_[0] < cold.n_iter_[0]


def test_labels_of_any_kind_and_float64_input():
    x, y = blobs(2, dtype=np.float64)
    names = np.array(["neg", "pos"])[y]
    fit = L2Logistic(C=1.0).fit(x, names)
    assert list(fit.classes_) == ["neg", "pos"]
    assert set(fit.predict(x)) <= {"neg", "pos"}
    ref = LogisticRegression(C=1.0, max_iter=300).fit(x, names)
    assert np.array_equal(fit.predict(x), ref.predict(x))
    with pytest.raises(ValueError, match="two classes"):
        L2Logistic().fit(x, np.zeros(len(x)))


def test_clone_and_pipelines_work():
    x, y = blobs(3, seed=2)
    folds = StratifiedKFold(3, shuffle=True, random_state=0)
    ours = cross_val_predict(
        make_pipeline(StandardScaler(), clone(L2Logistic(C=0.1))), x, y, cv=folds
    )
    ref = cross_val_predict(
        make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=300)), x, y, cv=folds
    )
    assert np.mean(ours == ref) >= 0.99
    assert clone(L2Logistic(C=0.5)).get_params()["C"] == 0.5
