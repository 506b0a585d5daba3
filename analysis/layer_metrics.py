"""Per-layer task-specialty: ν, CCA, rank ϱ and linear probes (SPEC.md, "Layer metrics"; paper 000).

Every metric takes the pooled states of one layer, ``states: (N, d)``, and the labels ``(N,)``
(numpy or torch; any label values), and returns a float. `layer_metrics` runs all four over every
layer of one extraction, ``(L+1, N, d)`` with layer 0 = embeddings, and `summary` gives ℓ*, ζ and ρ.

All linear algebra is float64. No d × d matrix is formed for ν; CCA forms one d × d covariance per
layer and reuses its eigendecomposition across the regularisation grid.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg
import scipy.stats

from analysis.progress import Progress, scaled

METRICS = ("nu", "cca", "rank", "probe")
CCA_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # λ / (mean eigenvalue of Σ_xx)
PROBE_C = 1.0  # inverse L2 strength of the logistic probe, on standardised states
RIDGE_ALPHA = 1.0  # L2 strength of the ridge probe (regression tasks), on standardised states
# Regression scores are cut at the median by default: with more bins the class means of an
# ordinal score lie almost on a line, Σ_b gets tiny extra eigenvalues and ν = tr(Σ_w Σ_b⁺)/C
# blows up for reasons that have nothing to do with the layer.
DEFAULT_BINS = 2


# ----------------------------------------------------------------------------------- inputs


def as_float64(x: Any) -> np.ndarray:
    """A float64 numpy array of a numpy array or torch tensor (any device / dtype)."""
    if hasattr(x, "detach"):  # a torch tensor; avoid importing torch here
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def as_states(x: Any) -> np.ndarray:
    """A numpy array of states kept in float32 or float64 (anything else becomes float64)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        x = x.numpy() if str(x.dtype) in ("torch.float32", "torch.float64") else x.double().numpy()
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


def as_labels(y: Any) -> np.ndarray:
    """A 1-D numpy array of labels (a torch tensor is moved to the CPU)."""
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    return np.asarray(y).reshape(-1)


def encode_classes(labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes (N,) in 0..C−1, counts (C,)) for any label values; classes in sorted order."""
    _, codes = np.unique(as_labels(labels), return_inverse=True)
    codes = codes.reshape(-1)
    return codes, np.bincount(codes)


def _check(states: np.ndarray, codes: np.ndarray, counts: np.ndarray, what: str) -> None:
    if states.ndim != 2:
        raise ValueError(f"{what} needs states of shape (N, d); got shape {states.shape}.")
    if len(codes) != len(states):
        raise ValueError(f"{what}: {len(states)} states but {len(codes)} labels.")
    if len(counts) < 2:
        raise ValueError(f"{what} needs at least two classes; the labels hold {len(counts)}.")


def _require_finite(derived: np.ndarray, what: str) -> None:
    """Non-finite states make every sum over them non-finite: checking a small derived array
    (class means, a covariance) catches them without another pass over the states."""
    if not np.isfinite(derived).all():
        raise ValueError(f"{what}: the states contain NaN or infinite values.")


def _one_hot(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """(C, N) float64 indicator matrix: class sums are one matrix product away."""
    onehot = np.zeros((n_classes, len(codes)))
    onehot[codes, np.arange(len(codes))] = 1.0
    return onehot


# ----------------------------------------------------------------------------------- ν


def nu(states: Any, labels: Any) -> float:
    """Task-specialty ν = (1/C) · trace(Σ_w Σ_b⁺) of one layer (SPEC.md; lower = more specialised).

    states: (N, d); labels: (N,). Σ_b = (1/C) M Mᵀ with M (d × C) the centred class means, so
    with the thin SVD M = U S Vᵀ, Σ_b⁺ = Σ_{i≤r} u_i u_iᵀ / λ_i, λ_i = s_i² / C, and

        ν = (1/C) Σ_{i≤r} u_iᵀ Σ_w u_i / λ_i,   u_iᵀ Σ_w u_i = (1/C) Σ_y (1/N_y) ‖(H_y − h̄_y) u_i‖².

    Two passes over the states, O(N d C), float64 throughout (float32 states are converted block
    by block, never copied whole); nothing d × d is formed or inverted. Numerical rank r: the
    centred means sum to zero, so r ≤ min(C − 1, d); of those, singular values
    s_i ≤ max(d, C) · eps · s_max count as zero (the usual matrix-rank cut-off, applied to s, not
    to s², so it resolves far smaller between-class directions than any pinv of the d × d Σ_b).
    Returns inf when all class means coincide (no between-class signal at all).
    """
    h = as_states(states)
    codes, counts = encode_classes(labels)
    _check(h, codes, counts, "ν")
    n_classes, d = len(counts), h.shape[1]
    means = np.stack(  # (C, d); pairwise float64 sums
        [h[codes == y].sum(axis=0, dtype=np.float64) / counts[y] for y in range(n_classes)]
    )
    _require_finite(means, "ν")
    centred = (means - means.mean(axis=0)).T  # (d, C)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    rank = min(n_classes - 1, d)
    s, u = s[:rank], u[:, :rank]
    if s.size == 0 or s[0] == 0.0:
        return float("inf")
    keep = s > max(d, n_classes) * np.finfo(np.float64).eps * s[0]
    s, u = s[keep], u[:, keep]
    z = _project(h, u)  # (N, r): coordinates along the between-class directions
    resid2 = (z - (means @ u)[codes]) ** 2  # (N, r)
    within = (
        np.stack(  # (C, r): (1/N_y) Σ_{n∈y} ((h_n − h̄_y)·u_i)²
            [np.bincount(codes, weights=resid2[:, i], minlength=n_classes) for i in range(len(s))],
            axis=1,
        )
        / counts[:, None]
    )
    w_dir = within.mean(axis=0)  # u_iᵀ Σ_w u_i, (r,)
    lam = s**2 / n_classes
    return float(np.sum(w_dir / lam) / n_classes)


def _project(h: np.ndarray, u: np.ndarray, block: int = 256) -> np.ndarray:
    """h @ u in float64, (N, d) @ (d, r), converting ``block`` rows at a time so the float64
    copy stays in cache (3× faster than converting all of a float32 h first)."""
    if h.dtype == np.float64:
        return h @ u
    out = np.empty((len(h), u.shape[1]))
    for start in range(0, len(h), block):
        np.dot(h[start : start + block].astype(np.float64), u, out=out[start : start + block])
    return out


def nu_textbook(states: Any, labels: Any, rtol: float | None = None) -> float:
    """Reference only (tests, bench): ν by forming Σ_w and Σ_b (d × d), float64 pinv and trace.

    ``rtol=None`` uses the array-API pinv cut-off max(d, d) · eps; numpy's own default (1e-15)
    keeps rounding noise of Σ_b's null space and can be far off. O(N d² + d³).
    """
    h = as_float64(states)
    codes, counts = encode_classes(labels)
    _check(h, codes, counts, "ν")
    n_classes, d = len(counts), h.shape[1]
    sigma_w = np.zeros((d, d))
    means = np.zeros((n_classes, d))
    for y in range(n_classes):
        h_y = h[codes == y]
        means[y] = h_y.mean(axis=0)
        diff = h_y - means[y]
        sigma_w += diff.T @ diff / len(h_y)
    sigma_w /= n_classes
    centred = means - means.mean(axis=0)
    sigma_b = centred.T @ centred / n_classes
    pinv = np.linalg.pinv(sigma_b, rtol=rtol)
    return float(np.trace(sigma_w @ pinv) / n_classes)


# ----------------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class Split:
    """Index arrays of a stratified train / dev / test split of N examples."""

    train: np.ndarray
    dev: np.ndarray
    test: np.ndarray


def split_indices(
    labels: Any, seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Split:
    """A stratified, seeded split: within each class, a random fraction goes to each part.

    A class with at least 3 examples puts at least one in dev and one in test; smaller classes stay
    in train. The same labels and seed always give the same split.
    """
    if len(fractions) != 3 or min(fractions) < 0 or not np.isclose(sum(fractions), 1.0):
        raise ValueError(
            f"Split fractions must be three non-negative numbers summing to 1 (got {fractions})."
        )
    codes, counts = encode_classes(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for y, n_y in enumerate(counts):
        members = rng.permutation(np.flatnonzero(codes == y))
        if n_y >= 3:
            n_dev = max(1, round(fractions[1] * n_y))
            n_test = max(1, round(fractions[2] * n_y))
        else:
            n_dev = n_test = 0
        n_train = n_y - n_dev - n_test
        parts[0].append(members[:n_train])
        parts[1].append(members[n_train : n_train + n_dev])
        parts[2].append(members[n_train + n_dev :])
    train, dev, test = (np.sort(np.concatenate(p)).astype(np.int64) for p in parts)
    return Split(train=train, dev=dev, test=test)


# ----------------------------------------------------------------------------------- CCA


def _column_corr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of matching columns of a and b, (n, J) each; 0 where one is constant."""
    a = a - a.mean(axis=0)
    b = b - b.mean(axis=0)
    denom = np.sqrt((a**2).sum(axis=0) * (b**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (a * b).sum(axis=0) / denom
    return np.where(denom > 0, corr, 0.0)


def _indicators(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """(N, C−1) class indicators with the last class dropped: the same span as the centred
    one-hot matrix, but with a non-singular covariance."""
    return _one_hot(codes, n_classes)[:-1].T


def _inv_sqrt_psd(s: np.ndarray) -> np.ndarray:
    e, q = np.linalg.eigh(s)
    e = np.clip(e, np.finfo(np.float64).eps * max(e.max(), 0.0) * len(e), None)
    return (q / np.sqrt(e)) @ q.T


def cca_score(
    states: Any,
    labels: Any,
    seed: int = 0,
    split: Split | None = None,
    grid: Sequence[float] = CCA_GRID,
) -> float:
    """Held-out mean of the J = C − 1 regularised canonical correlations between the states and
    the one-hot labels (SPEC.md, "CCA score").

    states: (N, d); labels: (N,). On the train part (centred): Σ_xx = Q diag(e) Qᵀ (one eigh), and
    for each λ in the grid the regularised CCA is the SVD of

        T_λ = (Σ_xx + λ I)^{-1/2} Σ_xy Σ_yy^{-1/2} = Q diag((e + λ)^{-1/2}) · [Qᵀ Σ_xy Σ_yy^{-1/2}],

    a d × J matrix; the bracket is computed once. Directions a_j = Q diag((e+λ)^{-1/2}) u_j and
    b_j = Σ_yy^{-1/2} v_j are scored by corr(X a_j, Y b_j) on the dev part to choose λ
    (λ = grid value × mean eigenvalue of Σ_xx, so the score is scale invariant), then on the test
    part for the result. The labels side uses the C − 1 indicators of all classes but the last
    (the same span as the centred one-hot matrix). ``split`` defaults to `split_indices(labels, seed)`.
    """
    h = as_float64(states)
    codes, counts = encode_classes(labels)
    _check(h, codes, counts, "CCA")
    if split is None:
        split = split_indices(codes, seed)
    if len(split.dev) < 2 or len(split.test) < 2:
        raise ValueError("CCA needs at least two examples in each of the dev and test parts.")
    n_classes = len(counts)
    y = _indicators(codes, n_classes)  # (N, J)
    x_mean, y_mean = h[split.train].mean(axis=0), y[split.train].mean(axis=0)
    x_tr, y_tr = h[split.train] - x_mean, y[split.train] - y_mean
    n_tr = len(x_tr)
    sxx = x_tr.T @ x_tr / n_tr  # (d, d)
    _require_finite(sxx, "CCA")
    e, q = np.linalg.eigh(sxx)  # (d,), (d, d)
    e = np.clip(e, 0.0, None)
    syy_isqrt = _inv_sqrt_psd(y_tr.T @ y_tr / n_tr)  # (J, J)
    g = q.T @ (x_tr.T @ y_tr / n_tr) @ syy_isqrt  # (d, J)
    scale = float(e.mean()) or 1.0

    def directions(lam: float) -> tuple[np.ndarray, np.ndarray]:
        w = 1.0 / np.sqrt(e + lam)  # (d,)
        u, _, vt = np.linalg.svd(w[:, None] * g, full_matrices=False)
        return w[:, None] * u, syy_isqrt @ vt.T  # a in Q's coordinates (d, J), b (J, J)

    def score(part: np.ndarray, a: np.ndarray, b: np.ndarray, xq: np.ndarray) -> float:
        return float(_column_corr(xq @ a, (y[part] - y_mean) @ b).mean())

    xq_dev = (h[split.dev] - x_mean) @ q
    best = max(grid, key=lambda r: score(split.dev, *directions(r * scale), xq_dev))
    a, b = directions(best * scale)
    return score(split.test, a, b, (h[split.test] - x_mean) @ q)


# ----------------------------------------------------------------------------------- rank ϱ


def rank_metric(states: Any, labels: Any) -> float:
    """Rank metric ϱ = (1/C) Σ_y ‖H_y‖_*² / ‖H_y‖_F² (SPEC.md; Zhou et al. 2022).

    states: (N, d); labels: (N,). H_y holds the (uncentred) states of class y; ‖·‖_* is the sum of
    its singular values. ϱ_y lies in [1, rank(H_y)] and equals k for k equal singular values.
    """
    h = as_float64(states)
    codes, counts = encode_classes(labels)
    _check(h, codes, counts, "ϱ")
    ratios = []
    for y in range(len(counts)):
        h_y = h[codes == y]
        _require_finite(h_y.sum(axis=0), "ϱ")
        s = scipy.linalg.svdvals(h_y, check_finite=False)
        frob2 = float(np.sum(s**2))
        ratios.append(float(np.sum(s)) ** 2 / frob2 if frob2 > 0 else 0.0)
    return float(np.mean(ratios))


# ----------------------------------------------------------------------------------- probes


def _task_score(metric: str, y_true: np.ndarray, y_pred: np.ndarray) -> float:
    from analysis.scores import task_score

    return float(task_score(metric, y_true, y_pred))


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = train.mean(axis=0), train.std(axis=0)
    std[std == 0] = 1.0
    return (train - mean) / std, (test - mean) / std


def probe_score(
    train_states: Any,
    train_labels: Any,
    test_states: Any,
    test_labels: Any,
    metric: str,
    model: Any = None,
) -> float:
    """Held-out task score of a linear probe (SPEC.md, "Probe score").

    states: (N_train, d) and (N_test, d). Classification: multinomial logistic regression
    (C = PROBE_C; solver per `new_probe`) on states standardised with the train part's mean and std. Regression
    (metric ``spearman``): ridge regression (α = RIDGE_ALPHA) on the same standardised states.
    ``model``: a `new_probe(n_classes, warm_start=True)` reused across layers, so the previous
    layer's weights start the next fit; built fresh when None.
    """
    x_tr, x_te = _standardise(as_float64(train_states), as_float64(test_states))
    y_tr, y_te = as_labels(train_labels), as_labels(test_labels)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Ridge

    if metric == "spearman":
        pred = Ridge(alpha=RIDGE_ALPHA).fit(x_tr, y_tr.astype(np.float64)).predict(x_te)
        return _task_score(metric, y_te, pred)
    if len(np.unique(y_tr)) < 2:
        raise ValueError("The probe needs at least two classes in its train part.")
    if model is None:
        model = new_probe(len(np.unique(y_tr)))
    if getattr(model, "coef_", None) is not None and model.coef_.shape[1] != x_tr.shape[1]:
        model.coef_ = None  # another width: no warm start possible
    with warnings.catch_warnings():
        # Hitting max_iter on near-separable layers is expected; the held-out score stands.
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x_tr, y_tr)
    return _task_score(metric, y_te, model.predict(x_te))


def new_probe(n_classes: int = 2, warm_start: bool = False) -> Any:
    """The logistic probe, C = PROBE_C. Two classes: Newton–Cholesky (a d × d Hessian, converges in
    a handful of steps; 3–5× faster than L-BFGS here); more classes: L-BFGS, since the multinomial
    Hessian is (d·C)² and Newton would be far slower."""
    from sklearn.linear_model import LogisticRegression

    solver = "newton-cholesky" if n_classes == 2 else "lbfgs"
    return LogisticRegression(C=PROBE_C, solver=solver, max_iter=300, warm_start=warm_start)


# ----------------------------------------------------------------------------------- curves


def zeta(curve: Any) -> float:
    """Smoothness ζ of a ν curve over ℓ = 1..L (SPEC.md): z-score the curve (population std),
    then the mean over interior ℓ of the squared second difference ν̃_{ℓ+1} − 2 ν̃_ℓ + ν̃_{ℓ−1}.

    0 for a straight line (and for a constant curve); NaN for fewer than 3 layers.
    """
    v = as_float64(curve).reshape(-1)
    if v.size < 3 or not np.isfinite(v).all():
        return float("nan")
    std = v.std()
    if std == 0:
        return 0.0
    z = (v - v.mean()) / std
    return float(np.mean((z[2:] - 2 * z[1:-1] + z[:-2]) ** 2))


def rho(metric_curve: Any, probe_curve: Any) -> float:
    """Pearson correlation across layers between a metric curve and the probe curve (SPEC.md).

    Pass the curves over ℓ = 1..L. NaN when either is constant, non-finite or shorter than 2.
    """
    a, b = as_float64(metric_curve).reshape(-1), as_float64(probe_curve).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"ρ needs two curves of the same length (got {a.size} and {b.size}).")
    if a.size < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


# ----------------------------------------------------------------------------------- regression


def bin_scores(y: Any, n_bins: int = DEFAULT_BINS) -> np.ndarray:
    """Quantile bins of real-valued scores as classes 0..B−1 (for ν, CCA and ϱ on regression tasks).

    bin = ⌊n_bins · (r − 1) / N⌋ with r the average rank of the score (1..N): equal-count bins
    of the sorted scores, and tied scores share a rank, hence a bin. Empty bins are dropped, so
    B ≤ n_bins (many ties give fewer bins).
    """
    if n_bins < 2:
        raise ValueError(f"Binning needs at least 2 bins (got {n_bins}).")
    v = as_float64(y).reshape(-1)
    ranks = scipy.stats.rankdata(v, method="average")
    bins = np.minimum(np.floor(n_bins * (ranks - 1) / len(v)).astype(np.int64), n_bins - 1)
    return np.unique(bins, return_inverse=True)[1].reshape(-1)


# ----------------------------------------------------------------------------------- all layers


def blas_threads() -> Any:
    """Limit BLAS to TUNESCOPE_BLAS_THREADS threads (default 1) for the per-layer fits.

    Each fit is small (d ≤ ~1,024); on a shared CPU, or beside torch's own OpenMP threads,
    two spin-waiting BLAS threads ran the four metrics 13× slower than one (27 s vs 2.1 s for
    MiniLM, N = 2,000, on this project's 2-core machine).
    """
    from threadpoolctl import threadpool_limits

    return threadpool_limits(
        limits=int(os.environ.get("TUNESCOPE_BLAS_THREADS", "1")), user_api="blas"
    )


def _reporting(layers: range, report: Progress) -> Any:
    for layer in layers:
        report(layer / len(layers), f"layer {layer} of {len(layers) - 1}")
        yield layer
    report(1.0, "all layers done")


def _layer_row(
    layer: int,
    h: np.ndarray,
    classes: np.ndarray,
    raw: np.ndarray,
    split: Split,
    metric: str,
    which: Sequence[str],
    probe: Any,
) -> dict[str, float]:
    """One layer's metrics; h: (N, d) float64. Metrics not in ``which`` are NaN, and so are CCA
    and the probe when the sample is too small for their held-out parts (a few examples)."""
    held_out = np.concatenate([split.dev, split.test])  # the probe selects nothing on dev
    cca_ok = len(split.dev) >= 2 and len(split.test) >= 2
    probe_ok = len(held_out) >= 1 and len(np.unique(raw[split.train])) >= 2
    return {
        "layer": layer,
        "nu": nu(h, classes) if "nu" in which else np.nan,
        "cca": cca_score(h, classes, split=split) if "cca" in which and cca_ok else np.nan,
        "rank": rank_metric(h, classes) if "rank" in which else np.nan,
        "probe": (
            probe_score(h[split.train], raw[split.train], h[held_out], raw[held_out], metric, probe)
            if "probe" in which and probe_ok
            else np.nan
        ),
    }


def layer_metrics(
    states: Any,
    labels: Any,
    metric: str = "accuracy",
    seed: int = 0,
    which: Sequence[str] = METRICS,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Every metric for every layer: a DataFrame with columns layer, nu, cca, rank, probe.

    states: (L+1, N, d), layer 0 = embeddings; labels: (N,); metric: the task's score
    (``spearman`` marks a regression task). One seeded stratified 80/10/10 split of the N examples
    serves CCA (fit on train, λ chosen on dev, scored on test) and the probes (fit on train, scored
    on dev ∪ test: the probe has fixed settings and selects nothing on dev, so both parts are
    held out, and twice the examples halve the score's noise variance).
    Regression: the probe is ridge regression scored by Spearman on the raw scores, while ν, CCA
    and ϱ use `bin_scores(labels, n_bins)`; ``df.attrs["label_note"]`` says so.
    Metrics left out of ``which`` are NaN. ``df.attrs`` also holds task_type, metric, n, seed.
    """
    unknown = set(which) - set(METRICS)
    if unknown:
        raise ValueError(f"Unknown metrics {sorted(unknown)}: choose from {', '.join(METRICS)}.")
    if len(states) < 2:
        raise ValueError("layer_metrics needs states of shape (L+1, N, d) with L ≥ 1.")
    raw = as_labels(labels)
    regression = metric == "spearman"
    classes = bin_scores(raw, n_bins) if regression else encode_classes(raw)[0]
    split = split_indices(classes, seed)
    report = progress or (lambda f, m="": None)
    probe = new_probe(int(classes.max()) + 1, warm_start=True)
    n_layers = len(states)
    with blas_threads():
        rows = [
            _layer_row(layer, as_float64(states[layer]), classes, raw, split, metric, which, probe)
            for layer in _reporting(range(n_layers), report)
        ]
    df = pd.DataFrame(rows, columns=["layer", *METRICS])
    df["layer"] = df["layer"].astype(int)
    df.attrs.update(
        task_type="regression" if regression else "classification",
        metric=metric,
        n=len(raw),
        seed=seed,
        n_classes=int(classes.max()) + 1,
        label_note=(
            f"Regression task: ν, CCA and ϱ use the scores cut into {int(classes.max()) + 1} "
            "quantile bins; the probe is ridge regression scored by Spearman."
            if regression
            else ""
        ),
    )
    return df


def summary(df: pd.DataFrame) -> dict[str, Any]:
    """ℓ* = argmin ν over ℓ = 1..L, ζ of the ν curve, and ρ(metric, probe) for nu, cca, rank."""
    body = df[df["layer"] >= 1].sort_values("layer")
    nu_curve = body["nu"].to_numpy(dtype=float)
    finite = np.isfinite(nu_curve)
    l_star = (
        int(body["layer"].to_numpy()[finite][np.argmin(nu_curve[finite])]) if finite.any() else None
    )
    return {
        "l_star": l_star,
        "zeta": zeta(nu_curve),
        "rho": {m: rho(body[m], body["probe"]) for m in ("nu", "cca", "rank")},
    }


def strategies(l_star: int, n_layers: int) -> dict[str, list[tuple[int, int, int]]]:
    """The (ℓ_bottom, ℓ_top, ℓ_head) strategies ℓ* implies (SPEC.md, "Strategies"), from the one
    home of the paper's generators, `analysis.runs.strategies`. ℓ*-up is empty when ℓ* = L."""
    from analysis.runs import strategies as gen

    if not 1 <= l_star <= n_layers:
        raise ValueError(f"ℓ* must lie in 1..{n_layers} (got {l_star}).")
    return {
        "l_star_down": sorted(gen.l_star_down(l_star, n_layers)),
        "l_star_up": gen.l_star_up(l_star, n_layers),
        "baselines": gen.baselines(n_layers),
    }


# ----------------------------------------------------------------------------------- what-ifs


def whatif_curves(
    settings: Mapping[str, tuple[Any, Any]],
    metric: str = "accuracy",
    seed: int = 0,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ν and probe curves for several samples of one model (pooling, imbalance, scarcity, seeds).

    settings: name → (states (L+1, N, d), labels (N,)). Returns (curves, table):
    curves has columns setting, layer, nu, probe (tidy, one row per setting and layer);
    table has setting, n, l_star, zeta, rho, abs_rho (ρ(ν, s) over ℓ = 1..L), one row per setting.
    """
    frames = {}
    items = list(settings.items())
    for i, (name, (states, labels)) in enumerate(items):
        sub = scaled(progress, i / len(items), (i + 1) / len(items))
        frames[name] = layer_metrics(states, labels, metric, seed, ("nu", "probe"), n_bins, sub)
    return compare_settings(frames)


def compare_settings(frames: Mapping[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy what-if results from per-setting `layer_metrics` frames (name → frame).

    Returns (curves: setting, layer, nu, probe; table: setting, n, l_star, zeta, rho, abs_rho),
    with ρ = ρ(ν, s) over ℓ = 1..L.
    """
    if not frames:
        raise ValueError("Nothing to compare: give at least one setting.")
    curves, table = [], []
    for name, df in frames.items():
        s = summary(df)
        curves.append(df[["layer", "nu", "probe"]].assign(setting=name))
        r = s["rho"]["nu"]
        table.append(
            {"setting": name, "n": df.attrs.get("n"), "l_star": s["l_star"], "zeta": s["zeta"],
             "rho": r, "abs_rho": abs(r)}
        )  # fmt: skip
    curves_df = pd.concat(curves, ignore_index=True)[["setting", "layer", "nu", "probe"]]
    return curves_df, pd.DataFrame(table)


def seed_band(curves: pd.DataFrame, value: str = "nu") -> pd.DataFrame:
    """Mean and spread over settings (e.g. seeds) per layer: columns layer, mean, std, lo, hi.

    curves: the tidy frame of `whatif_curves`; std is the sample std (0 for a single setting);
    lo / hi are the min and max.
    """
    grouped = curves.groupby("layer")[value]
    out = pd.DataFrame(
        {
            "mean": grouped.mean(),
            "std": grouped.std(ddof=1).fillna(0.0),
            "lo": grouped.min(),
            "hi": grouped.max(),
        }
    )
    return out.reset_index()


# ----------------------------------------------------------------------------------- teaching


def synthetic_classes(
    n_classes: int = 3,
    dim: int = 2,
    separation: float = 3.0,
    spread: float = 1.0,
    n_per_class: int = 100,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes for the teaching view: X (n_classes · n_per_class, dim), y.

    Class means sit on a circle (dim 2) or a Fibonacci sphere (dim 3) of radius ``separation``;
    each class is isotropic Gaussian noise of std ``spread`` around its mean.
    """
    if dim not in (2, 3):
        raise ValueError(f"The teaching view draws 2-D or 3-D classes (got dim={dim}).")
    if n_classes < 2 or n_per_class < 2:
        raise ValueError("Draw at least 2 classes of at least 2 points each.")
    if separation < 0 or spread < 0:
        raise ValueError("Separation and spread must be non-negative.")
    k = np.arange(n_classes)
    if dim == 2:
        angle = 2 * np.pi * k / n_classes
        centres = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    else:
        z = 1 - 2 * (k + 0.5) / n_classes
        phi = np.pi * (3 - np.sqrt(5)) * k
        r = np.sqrt(1 - z**2)
        centres = np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)
    rng = np.random.default_rng(seed)
    y = np.repeat(k, n_per_class)
    x = separation * centres[y] + spread * rng.standard_normal((len(y), dim))
    return x, y


def teaching_metrics(x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, float]:
    """ν, CCA and ϱ of one synthetic draw (the teaching view's live numbers)."""
    return {"nu": nu(x, y), "cca": cca_score(x, y, seed=seed), "rank": rank_metric(x, y)}


# ----------------------------------------------------------------------------------- cached runs

# Bump when a change to this module changes the numbers; it is part of every metrics cache key.
METRICS_VERSION = "2"


def states_key(layer_states: Any) -> str:
    """The disk-cache key of an extraction (analysis.extract.LayerStates): the SHA-256 of its
    recipe (model weights, data, sample, pooling, max length), so equal keys mean equal states."""
    from pathlib import Path

    return Path(layer_states.meta["cache_path"]).name


def metrics_recipe(layer_states: Any, seed: int, n_bins: int = DEFAULT_BINS) -> dict[str, Any]:
    """What decides the metric numbers: the states and the metric settings."""
    return {
        "states": states_key(layer_states),
        "metric": layer_states.metric,
        "seed": seed,
        "n_bins": n_bins,
        "split": [0.8, 0.1, 0.1],
        "cca_grid": list(CCA_GRID),
        "probe_c": PROBE_C,
        "ridge_alpha": RIDGE_ALPHA,
        "version": METRICS_VERSION,
    }


def cached_layer_metrics(
    layer_states: Any,
    seed: int = 0,
    n_bins: int = DEFAULT_BINS,
    cache: Any = None,
    progress: Progress | None = None,
) -> tuple[pd.DataFrame, bool]:
    """`layer_metrics` of one extraction, served from the disk cache when already computed.

    layer_states: analysis.extract.LayerStates. Returns (df, hit); df.attrs as in `layer_metrics`
    plus ``seconds`` (compute time of the first run).
    """
    import time

    import torch

    from analysis.cache import DiskCache

    cache = cache or DiskCache()
    recipe = metrics_recipe(layer_states, seed, n_bins)

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        df = layer_metrics(
            layer_states.states, layer_states.labels, layer_states.metric, seed, METRICS, n_bins,
            progress,
        )  # fmt: skip
        values = torch.tensor(df[list(METRICS)].to_numpy(dtype=np.float64))  # (L+1, 4)
        return {"values": values}, {**df.attrs, "seconds": time.perf_counter() - start}

    tensors, meta, hit = cache.get_or_compute("layer_metrics", recipe, compute)
    values = tensors["values"].numpy()
    df = pd.DataFrame(values, columns=list(METRICS))
    df.insert(0, "layer", np.arange(len(df)))
    df.attrs.update(meta)
    return df, hit


def finite(value: Any) -> Any:
    """NaN / ±inf become null: strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def report(cfg: Any, df: pd.DataFrame, hit: bool = False) -> dict[str, Any]:
    """The JSON of the CLI and the page's download: model, data, n, pooling, layers (layer, nu,
    cca, rank, probe each), l_star, zeta, rho {nu, cca, rank}, plus context. cfg: the
    ExtractConfig of the states; df: a `layer_metrics` frame. NaN / inf become null."""
    from analysis.config import to_dict

    summ = summary(df)
    n_layers = int(df["layer"].max())
    rows = [
        {"layer": int(r["layer"]), **{m: finite(float(r[m])) for m in METRICS}}
        for r in df.to_dict("records")
    ]
    rho = {k: finite(v) for k, v in summ["rho"].items()}
    return {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "n": cfg.sample.n,
        "pooling": cfg.pooling,
        "seed": cfg.sample.seed,
        "sample": to_dict(cfg.sample),
        "max_length": cfg.max_length,
        "task_type": df.attrs.get("task_type"),
        "metric": df.attrs.get("metric"),
        "label_note": df.attrs.get("label_note", ""),
        "n_layers": n_layers,
        "layers": rows,
        "l_star": summ["l_star"],
        "zeta": finite(summ["zeta"]),
        "rho": rho,
        "abs_rho": {k: None if v is None else abs(v) for k, v in rho.items()},
        "strategies": (
            {k: [list(s) for s in v] for k, v in strategies(summ["l_star"], n_layers).items()}
            if summ["l_star"] is not None
            else None
        ),
        "cache_hit": hit,
        "seconds": df.attrs.get("seconds"),
    }


def project_2d(states: Any, method: str = "pca", seed: int = 0) -> np.ndarray:
    """A 2-D picture of one layer's states (N, d) → (N, 2), for the layer view.

    ``pca``: the top two principal components (centred, via SVD; deterministic signs: the largest
    loading of each component is positive). ``umap``: umap-learn with ``random_state=seed``
    (single-threaded, hence reproducible), n_neighbors = min(15, N − 1), on standardised states.
    """
    h = as_float64(states)
    if h.ndim != 2 or len(h) < 3:
        raise ValueError("A 2-D picture needs states of shape (N, d) with N ≥ 3.")
    if method == "pca":
        centred = h - h.mean(axis=0)
        vt = np.linalg.svd(centred, full_matrices=False)[2][:2]  # (k ≤ 2, d)
        signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])
        xy = centred @ (vt * signs[:, None]).T
        return np.pad(xy, ((0, 0), (0, 2 - xy.shape[1])))
    if method == "umap":
        import umap

        std = h.std(axis=0)
        std[std == 0] = 1.0
        reducer = umap.UMAP(
            n_components=2, n_neighbors=min(15, len(h) - 1), random_state=seed, n_jobs=1
        )
        return np.asarray(reducer.fit_transform((h - h.mean(axis=0)) / std), dtype=np.float64)
    raise ValueError(f"Unknown projection {method!r}: choose pca or umap.")
