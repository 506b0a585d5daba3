"""Logistic fits on row subsets of one matrix, side by side, against one `L2Logistic` fit each."""

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

from analysis.layers import logistic_batch
from analysis.layers.logistic import L2Logistic
from analysis.layers.logistic_batch import (
    SharedRows,
    SubsetFit,
    decisions,
    fit_subsets,
    torch_products,
    walk_paths,
)


def states(n_classes: int, n: int = 600, d: int = 48, seed: int = 0):
    """Rows with a large common offset (as BERT's outlier dimensions), scales over two decades,
    and a class signal."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    x = rng.standard_normal((n, d)) * np.logspace(-1, 1, d) + 30.0
    x += 0.5 * rng.standard_normal((n_classes, d))[y]
    return x, y


def subsets(x, y, count, size, seed=1, c=1.0):
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(count):
        rows = np.sort(rng.choice(len(x), size, replace=False))
        scaler = StandardScaler().fit(x[rows])
        fits.append(SubsetFit(rows, y[rows], scaler.mean_, scaler.scale_, L2Logistic(C=c)))
    return fits


def alone(x, fit: SubsetFit, start=None) -> L2Logistic:
    """The same fit by itself: `L2Logistic.fit` on the standardised float32 rows."""
    z = ((x[fit.rows] - fit.mean) / fit.scale).astype(np.float32)
    model = L2Logistic(C=fit.model.C, warm_start=start is not None)
    if start is not None:
        model.coef_, model.intercept_ = start
    return model.fit(z, fit.labels)


@pytest.fixture(params=["numpy", "torch"])
def products(request, monkeypatch):
    """Both backends of the products: numpy below the size threshold, torch above it."""
    monkeypatch.setattr(
        logistic_batch, "TORCH_MIN_NUMBERS", 0 if request.param == "torch" else 1 << 62
    )
    return request.param


@pytest.mark.parametrize("n_classes", [2, 4])
@pytest.mark.parametrize("c", [1e-2, 1.0, 100.0])
def test_side_by_side_fits_equal_single_fits(products, n_classes, c):
    x, y = states(n_classes)
    fits = subsets(x, y, count=6, size=400, c=c)
    shared = SharedRows(x)
    assert torch_products(shared) == (products == "torch")
    fit_subsets(shared, fits)
    for fit in fits:
        ref = alone(x, fit)
        got = fit.model
        assert got.coef_.shape == ref.coef_.shape == (1 if n_classes == 2 else n_classes, 48)
        scale = np.abs(ref.coef_).max()
        # The same iterates up to the rounding of a float32 product (≈ 1e-7 relative); at large
        # C, L-BFGS's many steps on a flat optimum let that grow, still far inside gtol's reach.
        assert np.abs(got.coef_ - ref.coef_).max() <= (1e-5 if c < 100 else 2e-3) * scale
        assert abs(int(got.n_iter_[0]) - int(ref.n_iter_[0])) <= (0 if c < 100 else 3)
        z = (x - fit.mean) / fit.scale
        assert np.mean(got.predict(z) == ref.predict(z)) >= 0.998
        np.testing.assert_array_equal(got.classes_, ref.classes_)


def test_warm_starts_duplicate_rows_and_text_labels(products):
    x, y = states(3, seed=2)
    names = np.array(["neg", "neu", "pos"])[y]
    rng = np.random.default_rng(3)
    rows = rng.choice(len(x), 500, replace=True)  # a bootstrap resample: copies count twice
    scaler = StandardScaler().fit(x[rows])
    first = SubsetFit(rows, names[rows], scaler.mean_, scaler.scale_, L2Logistic(C=0.1))
    shared = SharedRows(x)
    fit_subsets(shared, [first])
    ref = alone(x, first)
    assert np.abs(first.model.coef_ - ref.coef_).max() <= 1e-5 * np.abs(ref.coef_).max()
    assert list(first.model.classes_) == ["neg", "neu", "pos"]
    # A warm start from the last fit (the inner CV's walk up the C grid).
    start = (first.model.coef_.copy(), first.model.intercept_.copy())
    warm = SubsetFit(
        rows, names[rows], scaler.mean_, scaler.scale_, L2Logistic(C=1.0, warm_start=True)
    )
    warm.model.coef_, warm.model.intercept_ = start
    fit_subsets(shared, [warm])
    ref = alone(x, warm, start=(ref.coef_, ref.intercept_))
    assert np.abs(warm.model.coef_ - ref.coef_).max() <= 1e-4 * np.abs(ref.coef_).max()
    assert (
        warm.model.n_iter_[0]
        < L2Logistic(C=1.0)
        .fit(((x[rows] - scaler.mean_) / scaler.scale_).astype(np.float32), names[rows])
        .n_iter_[0]
    )


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to the rounding of the float32 products. Neither backend promises a column of a
    product the same bits whatever stands beside it: both pick their kernels by the product's
    width (MKL on AVX2 blocks the columns by fours and eights), so a fit's numbers move by
    rounding with its batch-mates. A given batch gives the same numbers every time (below)."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7 * np.abs(want).max())


def test_a_fits_numbers_do_not_depend_on_what_shares_its_rounds(products):
    """Alone or beside five others (which converge at other times, so its column moves in the
    products from round to round): the same coefficients up to rounding; and the same batch
    fitted again, on rows held anew, the same bits."""
    x, y = states(2, seed=4)
    fits = subsets(x, y, count=6, size=350, seed=5)
    shared = SharedRows(x)
    fit_subsets(shared, fits)
    solo = subsets(x, y, count=6, size=350, seed=5)[2]
    fit_subsets(shared, [solo])
    same(solo.model.coef_, fits[2].model.coef_)
    same(solo.model.intercept_, fits[2].model.intercept_)
    again = subsets(x, y, count=6, size=350, seed=5)
    fit_subsets(SharedRows(x), again)
    for fit, twin in zip(fits, again, strict=True):
        np.testing.assert_array_equal(twin.model.coef_, fit.model.coef_)
        np.testing.assert_array_equal(twin.model.intercept_, fit.model.intercept_)


def test_decisions_score_the_shared_rows_as_the_model_does(products):
    x, y = states(4, seed=6)
    fits = subsets(x, y, count=3, size=300, seed=7)
    shared = SharedRows(x)
    fit_subsets(shared, fits)
    coefs = [(fit.model.coef_, fit.model.intercept_) for fit in fits]
    for fit, raw in zip(fits, decisions(shared, fits, coefs), strict=True):
        z = (x - fit.mean) / fit.scale
        np.testing.assert_allclose(raw, fit.model.decision_function(z), rtol=1e-4, atol=1e-4)
        assert np.mean(fit.model.labels_of(raw) == fit.model.predict(z)) >= 0.998


def test_bad_batches_are_refused():
    x, y = states(2)
    shared = SharedRows(x)
    one_class = SubsetFit(np.arange(10), np.zeros(10), x.mean(0), x.std(0), L2Logistic())
    with pytest.raises(ValueError, match="two classes"):
        fit_subsets(shared, [one_class])
    fits = subsets(x, y, count=2, size=100)
    fits[1].model.set_params(max_iter=10)
    with pytest.raises(ValueError, match="share max_iter"):
        fit_subsets(shared, fits)
    rows = np.array([0, 0, 1, 2, 3, 4])
    twice = SubsetFit(rows, np.array([0, 1, 0, 1, 0, 1]), x.mean(0), x.std(0), L2Logistic())
    with pytest.raises(ValueError, match="listed twice"):
        fit_subsets(shared, [twice])
    fit_subsets(shared, [])  # nothing to do


def test_walking_the_c_grid_side_by_side_equals_one_c_at_a_time(products):
    """The probe's inner CV: each fit walks the C grid from its last C's coefficients. Whether a
    fit goes on to its next C at once (``walk_paths``) or waits for every fit to finish each C
    (`fit_subsets` per C), the coefficients are the same (`same`)."""
    x, y = states(2, seed=8)
    grid = [1e-3, 1e-1, 10.0]
    walked = subsets(x, y, count=5, size=300, seed=9, c=grid[0])
    for fit in walked:
        fit.model.set_params(warm_start=True)
    paths = walk_paths(SharedRows(x), walked, [grid] * 5)
    stepped = subsets(x, y, count=5, size=300, seed=9, c=grid[0])
    shared = SharedRows(x)
    for j, c in enumerate(grid):
        for fit in stepped:
            fit.model.set_params(C=c, warm_start=True)
        fit_subsets(shared, stepped)
        for path, fit in zip(paths, stepped, strict=True):
            same(path[j][0], fit.model.coef_)
            same(path[j][1], fit.model.intercept_)
    assert [fit.model.C for fit in walked] == [grid[-1]] * len(walked)
    assert walk_paths(shared, [], []) == []
