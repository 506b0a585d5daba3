"""Known answers for the layer metrics (docs/explanation/layer-metrics.md, "Layer metrics")."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
from threadpoolctl import threadpool_limits

from analysis.cache import DiskCache
from analysis.layers import metrics, table, teaching, whatif
from analysis.layers.probe import PROBE_GRID


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    # On a shared, loaded machine two spin-waiting BLAS threads run d × d work far slower.
    with threadpool_limits(1):
        yield


def cross_classes(means: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Each class y is the 2d points means[y] ± sigma e_k: its sample mean is exactly means[y]
    and its within-class covariance exactly (sigma² / d) I, so ν has a closed form."""
    n_classes, d = means.shape
    plus_minus = sigma * np.concatenate([np.eye(d), -np.eye(d)])  # (2d, d)
    x = np.concatenate([m + plus_minus for m in means])
    return x, np.repeat(np.arange(n_classes), 2 * d)


def rotation(d: int, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return q


# ----------------------------------------------------------------------------------- ν


def test_nu_closed_form_two_classes_d1024():
    # Means ±m e_1 plus a shared offset: Σ_b = m² e_1 e_1ᵀ, Σ_w = (σ²/d) I, ν = (1/2)(σ²/d)/m².
    d, m, sigma = 1024, 1.0, np.sqrt(0.007 * 1024)
    offset = np.random.default_rng(1).standard_normal(d) * 5
    means = np.stack([offset + m * np.eye(d)[0], offset - m * np.eye(d)[0]])
    x, y = cross_classes(means, sigma)
    assert metrics.nu(x, y) == pytest.approx(0.5 * 0.007, rel=1e-10)


def test_nu_closed_form_many_classes():
    # Means m e_y (C = 6): Σ_b has C−1 eigenvalues m²/C, so ν = (C−1) (σ²/d) / m².
    d, n_classes, m, sigma = 40, 6, 2.0, 3.0
    means = m * np.eye(d)[:n_classes] + 7.0
    x, y = cross_classes(means, sigma)
    expected = (n_classes - 1) * (sigma**2 / d) / m**2
    assert metrics.nu(x, y) == pytest.approx(expected, rel=1e-10)


def test_nu_gaussian_d1024_float32_where_naive_pinv_fails():
    # Population ν = (1/2) σ² / m² for two isotropic Gaussians at ±m u; states stored as float32.
    rng = np.random.default_rng(0)
    d, n, m, sigma2 = 1024, 1000, 1.0, 0.007
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    offset = 3 * rng.standard_normal(d)
    noise = np.sqrt(sigma2) * rng.standard_normal((2 * n, d), dtype=np.float32)
    y = np.repeat([0, 1], n)
    x = (offset + np.where(y[:, None] == 0, m, -m) * u + noise).astype(np.float32)
    ours = metrics.nu(x, y)
    assert ours == pytest.approx(0.5 * sigma2 / m**2, rel=0.03)
    # The textbook route in float32 with numpy's default pinv cut-off is wildly off here.
    means = np.stack([x[y == c].mean(0) for c in (0, 1)])
    sigma_w = sum((x[y == c] - means[c]).T @ (x[y == c] - means[c]) / n for c in (0, 1)) / 2
    centred = means - means.mean(0)
    naive = np.trace(sigma_w @ np.linalg.pinv(centred.T @ centred / 2, hermitian=True)) / 2
    assert abs(naive - ours) > 10 * ours


def test_nu_zero_for_collapsed_classes():
    rng = np.random.default_rng(0)
    means = rng.standard_normal((4, 30))
    y = rng.integers(0, 4, 400)
    assert metrics.nu(means[y], y) == pytest.approx(0.0, abs=1e-20)


def test_nu_invariant_to_scale_and_rotation():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    x = rng.standard_normal((600, 20)) + 1.5 * np.eye(20)[y] + 4.0
    ref = metrics.nu(x, y)
    assert metrics.nu(123.0 * x, y) == pytest.approx(ref, rel=1e-10)
    assert metrics.nu(x @ rotation(20), y) == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("n_classes", [2, 3, 7])
def test_nu_matches_textbook_float64(n_classes):
    rng = np.random.default_rng(n_classes)
    y = rng.integers(0, n_classes, 500)
    x = (
        rng.standard_normal((500, 16)) @ rng.standard_normal((16, 16))
        + rng.standard_normal((n_classes, 16))[y]
    )
    assert metrics.nu(x, y) == pytest.approx(metrics.nu_textbook(x, y), rel=1e-9)


def test_nu_accepts_torch_and_any_labels():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    x = rng.standard_normal((200, 8)) + y[:, None]
    ref = metrics.nu(x, y)
    assert metrics.nu(torch.tensor(x, dtype=torch.float32), torch.tensor(y)) == pytest.approx(
        ref, rel=1e-6
    )
    assert metrics.nu(x, np.array(["neg", "pos"])[y]) == pytest.approx(ref, rel=1e-12)


def test_nu_refuses_one_class_and_bad_shapes():
    with pytest.raises(ValueError, match="two classes"):
        metrics.nu(np.ones((5, 3)), np.zeros(5))
    with pytest.raises(ValueError, match=r"\(N, d\)"):
        metrics.nu(np.ones(5), np.arange(5) % 2)
    assert metrics.nu(np.ones((6, 3)), np.arange(6) % 2) == float("inf")  # coinciding class means


# ----------------------------------------------------------------------------------- ϱ


@pytest.mark.parametrize("k", [1, 3, 8])
def test_rank_metric_equal_singular_values_gives_k(k):
    rng = np.random.default_rng(k)
    mats, labels = [], []
    for y in range(2):
        left, _ = np.linalg.qr(rng.standard_normal((50, k)))
        right, _ = np.linalg.qr(rng.standard_normal((30, k)))
        mats.append(4.0 * left @ right.T)  # rank k, k equal singular values
        labels.append(np.full(50, y))
    assert metrics.rank_metric(np.concatenate(mats), np.concatenate(labels)) == pytest.approx(
        k, rel=1e-10
    )


def test_rank_metric_between_one_and_rank():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 5)) @ rng.standard_normal((5, 30))  # rank 5, unequal values
    value = metrics.rank_metric(x, np.arange(200) % 2)
    assert 1.0 < value < 5.0


# ----------------------------------------------------------------------------------- CCA


def test_cca_one_for_one_hot_linear_data():
    rng = np.random.default_rng(0)
    for n_classes in (2, 4):
        y = rng.integers(0, n_classes, 1000)
        x = np.eye(n_classes)[y] @ rng.standard_normal((n_classes, 30))
        assert metrics.cca_score(x, y) == pytest.approx(1.0, abs=1e-6 if n_classes == 2 else 1e-3)


def test_cca_near_zero_for_random_labels():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 50))
    assert abs(metrics.cca_score(x, rng.integers(0, 3, 2000), seed=1)) < 0.15


def test_cca_scale_and_rotation_invariant_and_seeded():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 800)
    x = rng.standard_normal((800, 25)) + 1.0 * np.eye(25)[y]
    ref = metrics.cca_score(x, y, seed=3)
    assert 0.2 < ref < 1.0
    assert metrics.cca_score(1e3 * x, y, seed=3) == pytest.approx(ref, rel=1e-8)
    assert metrics.cca_score(x @ rotation(25), y, seed=3) == pytest.approx(ref, rel=1e-8)
    assert metrics.cca_score(x, y, seed=3) == ref


def test_split_is_stratified_disjoint_and_seeded():
    y = np.repeat([0, 1, 2], [100, 50, 2])
    s = metrics.split_indices(y, seed=0)
    every = np.concatenate([s.train, s.dev, s.test])
    assert sorted(every) == list(range(len(y)))
    assert np.bincount(y[s.test], minlength=3).tolist() == [10, 5, 0]
    assert np.array_equal(metrics.split_indices(y, seed=0).test, s.test)
    assert not np.array_equal(metrics.split_indices(y, seed=1).test, s.test)


# ----------------------------------------------------------------------------------- curves


def test_zeta_zero_for_linear_and_positive_for_zigzag():
    assert metrics.zeta(np.linspace(3.0, 9.0, 12)) == pytest.approx(0.0, abs=1e-24)
    assert metrics.zeta([1.0, 5.0, 1.0, 5.0, 1.0]) > 1.0
    assert np.isnan(metrics.zeta([1.0, 2.0]))
    # z-scoring makes ζ scale and shift invariant
    curve = np.array([3.0, 1.0, 2.0, 8.0, 4.0])
    assert metrics.zeta(10 * curve + 5) == pytest.approx(metrics.zeta(curve))


def test_zeta_known_value():
    # z = (−1, 1, −1) · c with c = 1/std: second difference of the middle point = 4c.
    curve = np.array([0.0, 1.0, 0.0])
    c = 1 / curve.std()
    z = (curve - curve.mean()) * c
    assert metrics.zeta(curve) == pytest.approx((z[2] - 2 * z[1] + z[0]) ** 2)


def test_rho_is_pearson():
    a, b = [1.0, 3.0, 2.0, 5.0], [2.0, 1.0, 4.0, 3.0]
    assert metrics.rho(a, b) == pytest.approx(scipy.stats.pearsonr(a, b).statistic)
    assert metrics.rho([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(metrics.rho([1, 1, 1], [1, 2, 3]))


def test_bin_scores_quantiles():
    y = np.arange(100) / 20.0  # 0 .. 4.95
    bins = metrics.bin_scores(y, 5)
    assert np.bincount(bins).tolist() == [20] * 5
    assert (np.diff(bins) >= 0).all()
    assert metrics.bin_scores(np.r_[np.zeros(90), np.ones(10)], 5).max() == 1  # ties merge bins


# ----------------------------------------------------------------------------------- all layers


def layered_states(n_layers: int = 4, n: int = 400, d: int = 12, seed: int = 0):
    """Classes separate most at layer 2 of 0..n_layers."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    strength = [0.2, 1.0, 3.0, 1.5, 0.6][: n_layers + 1]
    states = np.stack([rng.standard_normal((n, d)) + s * np.eye(d)[y] for s in strength])
    return states.astype(np.float32), y


def test_layer_metrics_frame_and_summary():
    states, y = layered_states()
    df = table.layer_metrics(torch.from_numpy(states), torch.from_numpy(y), "accuracy", seed=0)
    assert list(df.columns) == ["layer", "nu", "cca", "rank", "probe", "probe_c", "probe_se"]
    assert df.loc[1:, "probe_c"].isin(PROBE_GRID).all()
    assert df["layer"].tolist() == [0, 1, 2, 3, 4]
    assert df["nu"].iloc[0] > df["nu"].iloc[2]
    s = table.summary(df)
    assert s["l_star"] == 2
    assert s["rho"]["nu"] < 0 < s["rho"]["cca"]
    assert np.isfinite(s["zeta"])
    assert df.attrs["task_type"] == "classification"
    assert df.equals(table.layer_metrics(states, y, "accuracy", seed=0))  # same seed, same numbers


def test_layer_zero_is_never_l_star():
    states, y = layered_states()
    states[0] = states[2] * 2  # layer 0 as specialised as layer 2
    states[0, y == 0] += 5.0
    df = table.layer_metrics(states, y, "accuracy", which=("nu",))
    assert df["nu"].iloc[0] < df["nu"].iloc[1:].min()
    assert table.summary(df)["l_star"] == 2
    assert df["probe"].isna().all()


def test_layer_metrics_regression_bins_and_ridge():
    rng = np.random.default_rng(0)
    score = rng.uniform(0, 5, 500)
    states = np.stack(
        [rng.standard_normal((500, 6)) + k * score[:, None] * np.eye(6)[0] for k in (0.0, 3.0)]
    )
    df = table.layer_metrics(states, score, "spearman", seed=0)
    assert df.attrs["task_type"] == "regression"
    assert "quantile bins" in df.attrs["label_note"]
    assert df["probe"].iloc[1] > 0.9 > abs(df["probe"].iloc[0])
    assert df["nu"].iloc[1] < df["nu"].iloc[0]


def test_strategies_follow_spec():
    s = table.strategies(3, 6)
    assert s["l_star_down"] == [(1, 3, 3), (1, 3, 6), (2, 3, 3), (2, 3, 6), (3, 3, 3), (3, 3, 6)]
    assert s["l_star_up"] == [(4, 6, 6)]
    assert s["baselines"] == [(1, 6, 6), (4, 6, 6), (5, 6, 6), (6, 6, 6)]
    assert table.strategies(6, 6)["l_star_up"] == []


def test_whatif_curves_and_band():
    settings = {f"seed {k}": layered_states(seed=k) for k in range(3)}
    curves, table = whatif.whatif_curves(settings, "accuracy")
    assert list(curves.columns) == ["setting", "layer", "nu", "probe"]
    assert len(curves) == 3 * 5
    assert list(table["setting"]) == list(settings)
    assert (table["abs_rho"] == table["rho"].abs()).all()
    band = whatif.seed_band(curves)
    assert list(band.columns) == ["layer", "mean", "std", "lo", "hi"]
    assert (band["lo"] <= band["mean"]).all() and (band["mean"] <= band["hi"]).all()


def test_synthetic_classes_teach_separation():
    tight = teaching.synthetic_classes(3, 2, separation=5.0, spread=0.3, n_per_class=80, seed=0)
    loose = teaching.synthetic_classes(3, 2, separation=1.0, spread=1.5, n_per_class=80, seed=0)
    assert tight[0].shape == (240, 2)
    assert teaching.synthetic_classes(4, 3, 2.0, 1.0, 10, 0)[0].shape == (40, 3)
    assert metrics.nu(*tight) < metrics.nu(*loose)
    assert teaching.teaching_metrics(*tight)["cca"] > teaching.teaching_metrics(*loose)["cca"]
    with pytest.raises(ValueError, match="2-D or 3-D"):
        teaching.synthetic_classes(3, 4)


def test_non_finite_states_are_refused():
    x = np.random.default_rng(0).standard_normal((60, 4))
    x[3, 1] = np.nan
    y = np.arange(60) % 2
    for metric in (metrics.nu, metrics.cca_score, metrics.rank_metric):
        with pytest.raises(ValueError, match="NaN or infinite"):
            metric(x, y)


def test_tiny_samples_give_nan_where_a_held_out_part_is_missing():
    rng = np.random.default_rng(0)
    states = rng.standard_normal((3, 4, 5))
    df = table.layer_metrics(states, np.array([0, 0, 1, 1]), "accuracy")
    assert df["nu"].notna().all() and df["rank"].notna().all()
    assert df["cca"].isna().all()  # no dev / test part of ≥ 2
    assert df["probe"].notna().all() and df.attrs["probe_folds"] == 2  # 2-fold CV predictions
    one = table.layer_metrics(states[:, :3], np.array([0, 0, 1]), "accuracy")
    assert one["probe"].isna().all()  # a class of one: no stratified folds


def test_rho_of_a_flat_curve_is_undefined_not_rounding_noise():
    flat = np.array([0.1 + 0.2] * 3 + [0.3] * 3)  # equal up to rounding: std ≈ 5e-17, not 0
    assert np.isnan(metrics.rho(np.arange(6.0), flat))
    assert np.isnan(metrics.rho(np.arange(3.0), np.zeros(3)))
    assert metrics.rho([1.0, 2.0, 3.0], [1e-9, 2e-9, 4e-9]) > 0.9  # tiny but not flat


def test_the_layer_table_refuses_too_few_examples_per_class(tmp_path):
    from analysis.config import ExtractConfig
    from analysis.extract import LayerStates

    def states_of(labels):
        n = len(labels)
        return LayerStates(
            states=torch.randn(3, n, 4), labels=torch.tensor(labels), rows=torch.arange(n),
            label_names=("neg", "pos"), task_type="classification", metric="accuracy",
            config=ExtractConfig(), meta={"cache_path": str(tmp_path / "states" / f"k{n}")},
        )  # fmt: skip

    cache = DiskCache(tmp_path)
    with pytest.raises(ValueError, match=r"at least 5 examples of every class.*'pos' has 2"):
        table.cached_layer_metrics(states_of([0, 1, 0, 1, 0]), cache=cache)
    with pytest.raises(ValueError, match="at least two classes"):
        table.cached_layer_metrics(states_of([0] * 12), cache=cache)
    df, _ = table.cached_layer_metrics(states_of([0, 1] * 5), cache=cache)  # 5 of each: fine
    assert df["cca"].notna().all() and df["probe"].notna().all()  # nothing undefined
    with pytest.raises(ValueError, match="every score bin"):
        table.check_sample_size(np.arange(8.0), "spearman", n_bins=2)  # 4 per bin
