"""Per-layer task-specialty: ν, CCA and rank ϱ, and the curves' ζ and ρ
(docs/explanation/layer-metrics.md, "Layer metrics").

Every metric takes the pooled states of one layer, ``states: (N, d)``, and the labels ``(N,)``
(numpy or torch; any label values), and returns a float. The probe lives in `probe`; every layer
of one extraction at once in `table`.

All linear algebra is float64. No d × d matrix is formed for ν; CCA forms one d × d covariance per
layer and reuses its eigendecomposition across the regularisation grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np
import scipy.linalg
import scipy.stats

if TYPE_CHECKING:
    import torch

# States or labels as numpy arrays or torch tensors (any device, any dtype).
ArrayLike = Union[np.ndarray, "torch.Tensor", Sequence[float]]

METRICS = ("nu", "cca", "rank", "probe")
CCA_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # λ / (mean eigenvalue of Σ_xx)
# Regression scores are cut at the median by default: with more bins the class means of an
# ordinal score lie almost on a line, Σ_b gets tiny extra eigenvalues and ν = tr(Σ_w Σ_b⁺)/C
# blows up for reasons that have nothing to do with the layer.
DEFAULT_BINS = 2


def as_float64(x: ArrayLike) -> np.ndarray:
    """A float64 numpy array of a numpy array or torch tensor (any device / dtype)."""
    if hasattr(x, "detach"):  # a torch tensor; avoid importing torch here
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def as_states(x: ArrayLike) -> np.ndarray:
    """A numpy array of states kept in float32 or float64 (anything else becomes float64)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        x = x.numpy() if str(x.dtype) in ("torch.float32", "torch.float64") else x.double().numpy()
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


def as_labels(y: ArrayLike) -> np.ndarray:
    """A 1-D numpy array of labels (a torch tensor is moved to the CPU)."""
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    return np.asarray(y).reshape(-1)


def encode_classes(labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
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


# --- ν ------------------------------------------------------------------------------------------


def nu(states: ArrayLike, labels: ArrayLike) -> float:
    """Task-specialty ν = (1/C) · trace(Σ_w Σ_b⁺) of one layer (lower = more
    specialised; docs/explanation/layer-metrics.md, "Task-specialty ν").

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
    n_classes = len(counts)
    means = np.stack(  # (C, d); pairwise float64 sums
        [h[codes == y].sum(axis=0, dtype=np.float64) / counts[y] for y in range(n_classes)]
    )
    _require_finite(means, "ν")
    directions = between_class_directions(means)
    if directions is None:
        return float("inf")
    s, u = directions
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


def between_class_directions(means: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The singular values s (r,) and directions u (d, r) of the centred class means (C, d), cut
    at the numerical rank (`nu`'s docstring); None when all class means coincide."""
    n_classes, d = means.shape
    centred = (means - means.mean(axis=0)).T  # (d, C)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    rank = min(n_classes - 1, d)
    s, u = s[:rank], u[:, :rank]
    if s.size == 0 or s[0] == 0.0:
        return None
    keep = s > max(d, n_classes) * np.finfo(np.float64).eps * s[0]
    return s[keep], u[:, keep]


def _project(h: np.ndarray, u: np.ndarray, block: int = 256) -> np.ndarray:
    """h @ u in float64, (N, d) @ (d, r), converting ``block`` rows at a time so the float64
    copy stays in cache (faster than converting all of a float32 h first)."""
    if h.dtype == np.float64:
        return h @ u
    out = np.empty((len(h), u.shape[1]))
    for start in range(0, len(h), block):
        np.dot(h[start : start + block].astype(np.float64), u, out=out[start : start + block])
    return out


def nu_textbook(states: ArrayLike, labels: ArrayLike, rtol: float | None = None) -> float:
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


# --- splits -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """Index arrays of a stratified train / dev / test split of N examples."""

    train: np.ndarray
    dev: np.ndarray
    test: np.ndarray


def split_indices(
    labels: ArrayLike, seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
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


# --- CCA ----------------------------------------------------------------------------------------


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
    states: ArrayLike,
    labels: ArrayLike,
    seed: int = 0,
    split: Split | None = None,
    grid: Sequence[float] = CCA_GRID,
) -> float:
    """Held-out mean of the J = C − 1 regularised canonical correlations between the states and
    the one-hot labels (docs/explanation/layer-metrics.md, "CCA score").

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


# --- rank ϱ -------------------------------------------------------------------------------------


def rank_metric(states: ArrayLike, labels: ArrayLike) -> float:
    """Rank metric ϱ = (1/C) Σ_y ‖H_y‖_*² / ‖H_y‖_F² (Zhou et al. 2022;
    docs/explanation/layer-metrics.md, "Rank metric ϱ").

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


# --- curves over layers -------------------------------------------------------------------------


def zeta(curve: ArrayLike) -> float:
    """Smoothness ζ of a ν curve over ℓ = 1..L (docs/explanation/layer-metrics.md, "Smoothness ζ"):
    z-score the curve (population std), then the mean over interior ℓ of the squared second
    difference ν̃_{ℓ+1} − 2 ν̃_ℓ + ν̃_{ℓ−1}.

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


def is_flat(curve: np.ndarray) -> bool:
    """All values equal up to rounding (a relative 1e-12): its correlation is undefined, where
    np.corrcoef would return rounding noise such as 8e-17."""
    return bool(np.ptp(curve) <= 1e-12 * np.abs(curve).max())


def rho(metric_curve: ArrayLike, probe_curve: ArrayLike) -> float:
    """Pearson correlation across layers between a metric curve and the probe curve
    (docs/explanation/layer-metrics.md, "Correlation with the probe ρ").

    Pass the curves over ℓ = 1..L. NaN when either is constant (all values equal up to rounding:
    a flat probe curve once gave ρ = 8e-17), non-finite or shorter than 2.
    """
    a, b = as_float64(metric_curve).reshape(-1), as_float64(probe_curve).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"ρ needs two curves of the same length (got {a.size} and {b.size}).")
    if a.size < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    if is_flat(a) or is_flat(b):
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


# --- regression ---------------------------------------------------------------------------------


def bin_scores(y: ArrayLike, n_bins: int = DEFAULT_BINS) -> np.ndarray:
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
