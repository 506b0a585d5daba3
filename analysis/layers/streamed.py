"""Layer metrics of an extraction too large to load: every metric from streamed statistics.

`streamed_layer_metrics` returns the frame `analysis.layers.table.layer_metrics` returns — the same
seeded 80/10/10 split, the same formulas (docs/explanation/layer-metrics.md, "Large samples: the
streamed route"), the same columns — but reads each layer once, ``CHUNK_ROWS`` rows at a time,
and keeps only statistics whose size does not depend on N. Per layer, in one pass over its rows
(float32 read, float64 arithmetic):

- for every *cell* (class y, part ∈ {train, dev, test}): the count, the sum and the Gram matrix of
  (h − c), c a per-layer shift (the first chunk's mean), accumulated chunk by chunk (`CellMoments`).
  The shift keeps the second moments well conditioned: a covariance taken as Gram/n − m mᵀ loses
  about log10(‖m‖² / variance) digits, and c brings ‖m‖ down to the spread of the class means;
- the probe's rows: all N examples, capped at ``probe_cap`` by a seeded stratified subsample
  (`RowGather`). The default cap, `probe_rows`, is 10,000 examples and at most 3.84 M numbers
  (examples × d): 3,750 at d = 1,024.

From those, with no second pass:

- ν: class means and counts give Σ_b's thin SVD exactly as in `metrics.nu`; along each
  between-class direction u, uᵀ Σ_w u = (1/C) Σ_y (uᵀ G_y u − (uᵀ s_y)² / N_y) / N_y.
- ϱ: the uncentred class Gram G_y = Σ_{n∈y} h_n h_nᵀ (rebuilt from the shifted moments);
  ‖H_y‖_*² / ‖H_y‖_F² = (Σ_i √λ_i(G_y))² / tr G_y, eigenvalues ≤ d · ε · λ_max counted as 0
  (rounding noise of a rank-deficient Gram; `metrics.rank_metric` takes singular values directly).
- CCA: the train part's Σ_xx, Σ_xy, Σ_yy give the closed form of `metrics.cca_score` (through a
  Cholesky factorisation per λ rather than one eigendecomposition: `cca_from_moments`); the dev and
  test correlations of each canonical pair come from the dev / test cells' moments
  (corr(Xa, Yb) = aᵀ C_xy b / √(aᵀ C_xx a · bᵀ C_yy b)), so no row is read twice.
- probe: the in-memory route's estimator on the gathered rows: cross-validated predictions
  (`analysis.layers.probe.cv_predictions`: stratified 5-fold, C by an inner 3-fold CV per fold),
  the outer folds drawn over the gathered rows with the seed, scored with the task's metric.

**Agreement with the in-memory route** (tests/layers/test_streamed.py, on data that fits): ν to
1e-8 relative (both routes are float64 and differ only in summation order and in taking the
within-class variance from second moments, whose relative rounding is ≈ ε · (uᵀ G_y u / N_y) /
(uᵀ Σ_{w,y} u) — far below 1e-8 once shifted); CCA to 1e-8 absolute (Σ_xx's entries differ by
≈ ε ‖Σ_xx‖ and the smallest regularisation, 10⁻⁴ of the mean eigenvalue, amplifies that by at most
‖Σ_xx‖ / λ); ϱ to 1e-8 relative (an eigenvalue of G_y moves by ≈ d ε λ_max, so √λ_i moves by
≈ d ε λ_max / (2 √λ_i), negligible unless a class's states are nearly rank-deficient); the probe
exactly as long as the sample does not exceed the cap (the same rows, in the same order, the same
folds and fits).

**Cost** per layer: N d² / 2 multiply-adds for the Gram matrices (staged rows, one BLAS ``dsyrk``
per full stage, in place: `CellMoments`) plus C eigenvalue decompositions and 5 Cholesky
factorisations of d × d matrices, plus the probe's 5 fits on 0.8 × ``probe_cap`` rows each. Each
layer is one task of an executor (`analysis.compute`): the task reads its layer (from the cache
file, for stored states) and makes every metric of it, so the layers run side by side in as many
processes as the executor has, with the same numbers as in one. Memory per task: 3C Gram
matrices (3C · d² · 8 bytes: 48 MiB for C = 2, d = 1,024), their row stages (``STAGE_BYTES``,
64 MiB), two chunks and the probe's gathered rows (probe_cap · d · 4 bytes, ≤ 15 MB at the
default cap) — none of it grows with N.

**Repeats and subsets.** ``index`` (M,) lists the positions of the sample's examples among the N
stored rows, repeats allowed: the result equals `layer_metrics(states[:, index], labels[index])`
(the split is drawn over the M positions). Internally each stored row gets one integer weight per
cell (how often it occurs there) and the moments are weighted, so a subset costs no copy of the
states. It is not a bootstrap: with repeats in ``index`` the copies of one example can fall on
both sides of the split, which is why the layer repeats stay in memory
(`analysis.layers.repeats.cached_layer_repeats`). `CellMoments` and `RowGather` are the reusable pieces.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import scipy.linalg
import scipy.linalg.blas

from analysis.cache import StoredTensor
from analysis.compute import run_all
from analysis.layers.metrics import (
    DEFAULT_BINS,
    METRICS,
    ArrayLike,
    _inv_sqrt_psd,
    as_float64,
    as_labels,
    as_states,
    between_class_directions,
    bin_scores,
    encode_classes,
    split_indices,
)
from analysis.layers.probe import cv_predictions, outer_folds
from analysis.layers.rows import States, n_states
from analysis.progress import Progress, no_progress

if TYPE_CHECKING:
    from analysis.extract import LayerStates

PROBE_CAP = 10_000  # examples the cross-validated probe predicts, at most
PROBE_BUDGET = 10_000 * 384  # … and at most this many numbers (examples × d_model): see probe_rows
CHUNK_ROWS = 4096  # rows read and accumulated at a time
STAGE_BYTES = 64 * 2**20  # float64 rows staged for the Gram updates, all cells together
COLUMNS = ("nu", "cca", "rank", "probe", "probe_c", "probe_se")
# The table takes the streamed route when one layer's states, as float64, exceed this (MB).
STREAM_ABOVE_MB = 256


# --- which route --------------------------------------------------------------------------------


def use_streamed(n: int, d_model: int) -> bool:
    """Whether the layer table streams (this module) rather than loads each layer.

    The in-memory route converts a whole layer to float64 and makes several copies of it (the
    train part for CCA, each class for ϱ; about 4 × N · d · 8 bytes at its peak) and fits the probe
    on every train example. Above ``$TUNESCOPE_STREAM_METRICS_MB`` (default 256) MB for one
    float64 layer (N · d ≥ 33.5 M: MiniLM from N ≈ 87,000, BERT-base from 43,700, BERT-large from
    32,800) the table streams instead: bounded memory, the probe on a capped subsample.
    """
    return n * d_model * 8 > stream_limit_mb() * 2**20


def stream_limit_mb() -> float:
    """MB of one float64 layer above which the layer table streams (`use_streamed`)."""
    return float(os.environ.get("TUNESCOPE_STREAM_METRICS_MB", STREAM_ABOVE_MB))


def route_recipe(layer_states: LayerStates) -> dict[str, Any]:
    """What the streamed route adds to the metrics' cache key: {} on the in-memory route (whose
    keys stay those of earlier versions), else the route and the probe cap."""
    if not use_streamed(layer_states.n, layer_states.d_model):
        return {}
    return {"route": "streamed", "probe_cap": PROBE_CAP, "probe_budget": PROBE_BUDGET}


def probe_rows(d_model: int, cap: int = PROBE_CAP, budget: int = PROBE_BUDGET) -> int:
    """Examples the streamed probe predicts by CV: ``min(cap, budget // d_model)``.

    10,000 up to d = 384 (MiniLM), 5,000 at d = 768 (BERT-base), 3,750 at d = 1,024
    (BERT-large). Why the budget: an L-BFGS iteration of the probe reads the examples × d matrix
    twice, and the 3-fold CV over 7 C values takes several hundred iterations on a hard layer, so
    the probe's time grows with examples × d. The CV probe fits 5 times on 80 % of its rows, and
    every row is scored once: a score over 3,750 examples still has a standard error under 0.8
    points.
    """
    return max(2, min(cap, budget // max(d_model, 1)))


def streamed_metrics_of(
    layer_states: LayerStates,
    seed: int,
    n_bins: int,
    progress: Progress | None,
    executor: Executor | None = None,
) -> pd.DataFrame:
    """`streamed_layer_metrics` of one extraction: from its file when it has one (chunked reads
    that leave the resident set alone), else from the states in memory."""
    source = layer_states.stored if layer_states.stored is not None else layer_states.states
    return streamed_layer_metrics(
        source, layer_states.labels, layer_states.metric, seed, METRICS, n_bins, progress,
        executor=executor,
    )  # fmt: skip


# --- reading a layer in chunks -------------------------------------------------------------------


def layer_chunks(
    states: States, layer: int, chunk_rows: int = CHUNK_ROWS
) -> Iterator[tuple[int, np.ndarray]]:
    """(start, rows start..start+B−1 of ``states[layer]``) as float32 / float64 arrays.

    Stored states are read with plain file reads into two reused buffers, the next chunk while the
    caller works on this one: the resident set stays at two chunks. A yielded buffer is valid
    until the next one is requested.
    """
    _, n, d = n_states(states)
    bounds = [(s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)]
    if not isinstance(states, StoredTensor):
        layer_rows = as_states(states[layer])  # a view for float32 / float64 CPU data
        for start, stop in bounds:
            yield start, layer_rows[start:stop]
        return
    buffers = [np.empty((chunk_rows, d), dtype=states.numpy_dtype) for _ in range(2)]

    def read(k: int) -> np.ndarray:
        start, stop = bounds[k]
        return states.read_rows(layer, start, stop, out=buffers[k % 2][: stop - start])

    with ThreadPoolExecutor(1) as reader:
        pending = reader.submit(read, 0) if bounds else None
        for k, (start, _) in enumerate(bounds):
            chunk = pending.result()
            if k + 1 < len(bounds):  # buffer (k+1) % 2 was last handed out for chunk k−1
                pending = reader.submit(read, k + 1)
            yield start, chunk


# --- streamed statistics -------------------------------------------------------------------------


@dataclass
class CellMoments:
    """Weighted count, sum and Gram matrix of (h − shift) for each cell of the examples, float64.

    ``weights``: (K, N) non-negative integers, how often stored row n counts in cell k (0: not at
    all; a bootstrap resample puts repeats here). ``count`` (K,), ``sums`` (K, d) = Σ_n w h̃_n,
    ``grams`` (K, d, d) = Σ_n w h̃_n h̃_nᵀ with h̃ = h − shift. ``shift`` (d,) is the first chunk's
    mean unless given.

    How the Grams run near the machine's ``xᵀ @ x`` speed: each cell's shifted float64 rows are
    staged (``stage_rows`` at a time, written straight from the float32 chunk: one conversion, no
    other copy), and a full stage goes to BLAS ``dsyrk`` (a symmetric rank-k update, half the
    multiply-adds of a full product) that adds into one triangle of the cell's Gram in place — no
    d × d temporary, no second triangle per call. Reading ``grams`` flushes the stages and mirrors
    the triangle (further adds stay correct: dsyrk keeps adding to the same triangle).
    """

    weights: np.ndarray
    shift: np.ndarray | None = None
    grams_wanted: bool = True
    stage_rows: int | None = None  # default: STAGE_BYTES of staging in all, 256..2,048 rows a cell

    def __post_init__(self) -> None:
        self.weights = np.asarray(self.weights)
        self.count = self.weights.sum(axis=1).astype(np.float64)
        self.sums: np.ndarray | None = None
        self._grams: np.ndarray | None = None
        self._stage: np.ndarray | None = None  # (K, S, d) float64
        self._fill: list[int] = []
        self._mirrored = True
        self.rows_staged = 0  # rows sent to the Gram updates: rows_staged · d² flops in all

    def add(self, start: int, chunk: np.ndarray) -> None:
        """Add rows start..start+B−1 (chunk (B, d), any float dtype)."""
        b, d = chunk.shape
        if self.sums is None:
            if self.shift is None:
                self.shift = chunk.mean(axis=0, dtype=np.float64)
            k = len(self.weights)
            self.sums = np.zeros((k, d))
            if self.grams_wanted:
                self._grams = np.zeros((k, d, d))
                rows = self.stage_rows or min(2048, max(256, STAGE_BYTES // (k * d * 8)))
                self._stage = np.empty((k, rows, d))
                self._fill = [0] * k
        for k, w in enumerate(self.weights[:, start : start + b]):
            rows = np.flatnonzero(w)
            if len(rows):
                self._add_rows(k, chunk, rows, w[rows])

    def _add_rows(self, k: int, chunk: np.ndarray, rows: np.ndarray, w: np.ndarray) -> None:
        if self._stage is None:  # sums only
            self.sums[k] += w.astype(np.float64) @ (chunk[rows] - self.shift)
            return
        capacity = self._stage.shape[1]
        for lo in range(0, len(rows), capacity):
            take = rows[lo : lo + capacity]
            if self._fill[k] + len(take) > capacity:
                self._flush(k)
            at = self._fill[k]
            x = np.subtract(chunk[take], self.shift, out=self._stage[k, at : at + len(take)])
            ws = w[lo : lo + capacity].astype(np.float64)
            self.sums[k] += ws @ x
            if (ws != 1.0).any():
                x *= np.sqrt(ws)[:, None]
            self._fill[k] += len(take)
            self.rows_staged += len(take)
        self._mirrored = False

    def _flush(self, k: int) -> None:
        """Add cell k's staged rows into the lower triangle of its Gram (dsyrk, in place)."""
        n = self._fill[k]
        if n:
            gram = self._grams[k]
            # gram.T is the Fortran-ordered view dsyrk updates in place; its upper triangle is
            # gram's lower one. stage[:n].T (d, n) is Fortran-ordered too: no copy either way.
            out = scipy.linalg.blas.dsyrk(
                1.0, self._stage[k, :n].T, beta=1.0, c=gram.T, trans=0, lower=0, overwrite_c=1
            )
            if not np.shares_memory(out, gram):  # pragma: no cover - BLAS wrappers copy
                np.copyto(gram, np.tril(out.T))
            self._fill[k] = 0

    @property
    def grams(self) -> np.ndarray | None:
        """(K, d, d) Gram matrices of every row added so far (flushed and made symmetric)."""
        if self._grams is not None and not self._mirrored:
            for k in range(len(self._grams)):
                self._flush(k)
            upper = np.triu(np.ones(self._grams.shape[1:], dtype=bool), 1)
            for gram in self._grams:
                np.copyto(gram, gram.T, where=upper)  # upper := lower (read-only source)
            self._mirrored = True
        return self._grams

    def check_finite(self, what: str) -> None:
        """Non-finite states make their sums non-finite (`metrics._require_finite`)."""
        if self.sums is not None and not np.isfinite(self.sums).all():
            raise ValueError(f"{what}: the states contain NaN or infinite values.")


class RowGather:
    """Copies chosen rows out of a stream of chunks: ``rows`` (P,) stored-row ids, repeats
    allowed; after the pass, ``values[p]`` holds stored row ``rows[p]`` (float32 as stored)."""

    def __init__(self, rows: np.ndarray, d: int, dtype: np.dtype = np.float32) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        self.order = np.argsort(rows, kind="stable")
        self.sorted_rows = rows[self.order]
        self.values = np.empty((len(rows), d), dtype=dtype)

    def add(self, start: int, chunk: np.ndarray) -> None:
        lo, hi = np.searchsorted(self.sorted_rows, [start, start + len(chunk)])
        if hi > lo:
            self.values[self.order[lo:hi]] = chunk[self.sorted_rows[lo:hi] - start]


def stratified_subset(
    positions: np.ndarray, classes: np.ndarray, cap: int, seed: int
) -> np.ndarray:
    """``positions`` itself when it holds ≤ ``cap`` entries; else a seeded subsample of ``cap``
    of them that keeps each class's share (largest remainders) and at least one example of every
    class, sorted. classes: (len(positions),)."""
    positions = np.asarray(positions)
    if len(positions) <= cap:
        return positions
    rng = np.random.default_rng(seed)
    labels, counts = np.unique(classes, return_counts=True)
    quota = counts * cap / len(positions)
    take = np.maximum(np.floor(quota).astype(int), 1)
    short = cap - int(take.sum())
    if short > 0:  # hand out what is left by the largest remainders
        take[np.argsort(-(quota - np.floor(quota)), kind="stable")[:short]] += 1
    for _ in range(-short):  # a rare class's minimum of one pushed it over: trim the largest
        take[np.argmax(take)] -= 1
    chosen = [
        rng.choice(positions[classes == y], size=k, replace=False)
        for y, k in zip(labels, take, strict=True)
    ]
    return np.sort(np.concatenate(chosen))


# --- the metrics from the statistics ------------------------------------------------------------


@dataclass
class _Layout:
    """How the sample maps onto cells: cell (y, part) is number part · C + y (part 0 train,
    1 dev, 2 test)."""

    n_classes: int
    weights: np.ndarray  # (3C, N)

    def cells(self, part: int) -> slice:
        return slice(part * self.n_classes, (part + 1) * self.n_classes)


def _class_moments(m: CellMoments, lay: _Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class over all parts: counts (C,), shifted sums (C, d), shifted Grams (C, d, d)."""
    c = lay.n_classes
    counts = m.count.reshape(3, c).sum(axis=0)
    sums = m.sums.reshape(3, c, -1).sum(axis=0)
    grams = m.grams.reshape(3, c, *m.grams.shape[1:]).sum(axis=0)
    return counts, sums, grams


def nu_from_moments(
    counts: np.ndarray, sums: np.ndarray, grams: np.ndarray, shift: np.ndarray
) -> float:
    """ν of one layer from per-class counts (C,), sums (C, d) and Grams (C, d, d) of h − shift
    (`metrics.nu`'s thin-SVD route, with uᵀ Σ_w u from the second moments)."""
    n_classes = len(counts)
    means = shift + sums / counts[:, None]  # (C, d)
    directions = between_class_directions(means)
    if directions is None:
        return float("inf")
    s, u = directions
    # (C, r): uᵀ G̃_y u − (uᵀ s̃_y)² / N_y, the within-class scatter of class y along u
    scatter = np.einsum("ydr,dr->yr", grams @ u, u) - (sums @ u) ** 2 / counts[:, None]
    w_dir = (scatter / counts[:, None]).mean(axis=0)  # u_iᵀ Σ_w u_i, (r,)
    lam = s**2 / n_classes
    return float(np.sum(w_dir / lam) / n_classes)


def rank_from_moments(
    counts: np.ndarray, sums: np.ndarray, grams: np.ndarray, shift: np.ndarray
) -> float:
    """ϱ = (1/C) Σ_y (Σ_i √λ_i(G_y))² / tr G_y with G_y the uncentred class Gram (module doc)."""
    ratios = []
    for n_y, s_y, g_y in zip(counts, sums, grams, strict=True):
        outer = np.outer(s_y, shift)
        gram = g_y + outer + outer.T + n_y * np.outer(shift, shift)  # Σ h hᵀ over the class
        lam = np.linalg.eigvalsh(gram)
        lam = np.where(lam > len(lam) * np.finfo(np.float64).eps * max(lam[-1], 0.0), lam, 0.0)
        frob2 = float(np.trace(gram))
        ratios.append(float(np.sum(np.sqrt(lam))) ** 2 / frob2 if frob2 > 0 else 0.0)
    return float(np.mean(ratios))


def _part_covariances(
    m: CellMoments, lay: _Layout, part: int
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(n, mean of h − shift (d,), C_xx (d, d), C_xy (d, J), class shares (C,)) of one part,
    population covariances, with y the indicators of classes 0..C−2."""
    cells = lay.cells(part)
    n_k = m.count[cells]  # (C,)
    n = float(n_k.sum())
    mean = m.sums[cells].sum(axis=0) / n
    cxx = m.grams[cells].sum(axis=0) / n - np.outer(mean, mean)
    cxy = (m.sums[cells][:-1] - n_k[:-1, None] * mean).T / n  # (d, J)
    return n, mean, cxx, cxy, n_k / n


def cca_from_moments(m: CellMoments, lay: _Layout, grid: Sequence[float]) -> float:
    """`metrics.cca_score` from the cells' moments (module docstring).

    The same canonical pairs as `metrics.cca_score`'s SVD of T_λ = (Σ_xx + λI)^{-1/2} Σ_xy Σ_yy^{-1/2},
    taken through the J × J matrix T_λᵀ T_λ = Kᵀ (Σ_xx + λI)⁻¹ K with K = Σ_xy Σ_yy^{-1/2}: its
    eigenvectors v_j give b_j = Σ_yy^{-1/2} v_j and a_j ∝ (Σ_xx + λI)⁻¹ K v_j (a correlation does
    not see the scale of a_j). One Cholesky factorisation per λ (d³/3 multiply-adds) instead of
    an eigendecomposition of Σ_xx, several times cheaper at d = 1,024.
    """
    _, _, sxx, sxy, share = _part_covariances(m, lay, 0)
    p = share[:-1]
    syy_isqrt = _inv_sqrt_psd(np.diag(p) - np.outer(p, p))  # indicators' covariance^{-1/2}, (J, J)
    k = sxy @ syy_isqrt  # (d, J)
    scale = float(np.trace(sxx)) / len(sxx) or 1.0  # the mean eigenvalue of Σ_xx

    def directions(lam: float) -> tuple[np.ndarray, np.ndarray]:
        z = scipy.linalg.cho_solve(  # (Σ_xx + λI)⁻¹ K, (d, J)
            scipy.linalg.cho_factor(sxx + lam * np.eye(len(sxx)), check_finite=False),
            k,
            check_finite=False,
        )
        _, v = np.linalg.eigh(k.T @ z)  # (J, J)
        return z @ v, syy_isqrt @ v  # a in the states' coordinates (d, J), b (J, J)

    def score(part: int, a: np.ndarray, b: np.ndarray) -> float:
        _, _, cxx, cxy, pi = _part_covariances(m, lay, part)
        pj = pi[:-1]
        cyy = np.diag(pj) - np.outer(pj, pj)
        var_x = np.einsum("dj,dj->j", cxx @ a, a)
        var_y = np.einsum("kj,kj->j", cyy @ b, b)
        cov = np.einsum("dj,dj->j", cxy @ b, a)
        denom = np.sqrt(np.clip(var_x, 0.0, None) * np.clip(var_y, 0.0, None))
        with np.errstate(invalid="ignore", divide="ignore"):
            corr = np.where(denom > 0, cov / denom, 0.0)
        return float(corr.mean())

    pairs = {r: directions(r * scale) for r in grid}  # one factorisation per λ
    best = max(grid, key=lambda r: score(1, *pairs[r]))
    return score(2, *pairs[best])


# --- one layer --------------------------------------------------------------------------------


def _layer_pass(
    states: States, layer: int, weights: np.ndarray, gather: np.ndarray | None, chunk_rows: int
) -> tuple[CellMoments, np.ndarray | None]:
    """One pass over ``states[layer]``: the cells' moments (Grams flushed) and, when ``gather``
    (P,) lists stored rows, those rows' states (P, d) float32 for the probe."""
    d = n_states(states)[2]
    moments = CellMoments(weights)
    rows = RowGather(gather, d) if gather is not None else None
    for start, chunk in layer_chunks(states, layer, chunk_rows):
        moments.add(start, chunk)
        if rows is not None:
            rows.add(start, chunk)
    moments.check_finite("ν")
    moments.grams  # noqa: B018  (flushes the last stages: their time is the Grams')
    return moments, None if rows is None else rows.values


def _moment_row(
    layer: int, moments: CellMoments, lay: _Layout, which: Sequence[str], cca_ok: bool
) -> dict[str, float]:
    """The layer's row of ν, CCA and ϱ from its moments (probe columns NaN, filled later)."""
    from analysis.layers.metrics import CCA_GRID

    counts, sums, grams = _class_moments(moments, lay)
    return {
        "layer": layer,
        "nu": nu_from_moments(counts, sums, grams, moments.shift) if "nu" in which else np.nan,
        "cca": cca_from_moments(moments, lay, CCA_GRID) if cca_ok else np.nan,
        "rank": rank_from_moments(counts, sums, grams, moments.shift)
        if "rank" in which
        else np.nan,
        "probe": np.nan,
        "probe_c": np.nan,
        "probe_se": np.nan,
    }


@dataclass(frozen=True)
class _Pass:
    """What every layer's pass needs: the cells' layout, the metrics asked, whether CCA has its
    dev and test parts, the probe's inputs — (stored rows to gather, their labels, metric, outer
    folds, seed), or None for no probe — and the rows read per chunk."""

    lay: _Layout
    which: Sequence[str]
    cca_ok: bool
    probe: tuple[np.ndarray, np.ndarray, str, np.ndarray, int] | None
    chunk_rows: int

    @property
    def gather(self) -> np.ndarray | None:
        return None if self.probe is None else self.probe[0]


def _layer_task(
    states: States, index: int, layer: int, job: _Pass
) -> tuple[dict[str, float], dict[str, float], int]:
    """Layer ``layer`` (``states[index]``: as sent, `_task_states`), in whichever process the
    executor runs it (one thread): (its row, its phases' seconds, rows sent to the Grams)."""
    timing = {}
    clock = time.perf_counter()
    moments, values = _layer_pass(states, index, job.lay.weights, job.gather, job.chunk_rows)
    timing["read_and_moments"] = time.perf_counter() - clock
    clock = time.perf_counter()
    row = _moment_row(layer, moments, job.lay, job.which, job.cca_ok)
    timing["nu_cca_rank"] = time.perf_counter() - clock
    staged = moments.rows_staged
    del moments
    clock = time.perf_counter()
    if job.probe is not None:
        _, labels, metric, folds, seed = job.probe
        fitted = cv_predictions(as_float64(values), labels, metric, folds, seed=seed)
        row.update(probe=fitted.score, probe_c=fitted.c, probe_se=fitted.se)
    timing["probe"] = time.perf_counter() - clock
    return row, timing, staged


def _task_states(states: States, layer: int) -> tuple[States, int]:
    """What a layer's task is sent, (states, index): stored states as they are (a path, absolute:
    a worker keeps the working folder it started in), else only that layer's array (index 0)."""
    if isinstance(states, StoredTensor):
        return dataclasses.replace(states, path=Path(states.path).resolve()), layer
    return as_states(states[layer])[None], 0


# --- every layer --------------------------------------------------------------------------------


def streamed_layer_metrics(
    states: States,
    labels: ArrayLike,
    metric: str = "accuracy",
    seed: int = 0,
    which: Sequence[str] = METRICS,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
    index: ArrayLike | None = None,
    probe_cap: int | None = None,
    chunk_rows: int = CHUNK_ROWS,
    executor: Executor | None = None,
) -> pd.DataFrame:
    """Every metric for every layer from streamed statistics (module docstring).

    states: (L+1, N, d) — an `analysis.cache.StoredTensor` (read in chunks, never loaded whole) or
    an array / tensor; labels: (N,); index: (M,) positions of the sample's examples among the N
    (repeats allowed; default all N once). Returns `layer_metrics`'s frame (columns layer, nu, cca,
    rank, probe, probe_c, probe_se) with attrs as there plus route = "streamed", probe_cap (default
    `probe_rows` of d: 10,000 examples up to d = 384, fewer above), probe_n (rows the
    cross-validated probe predicted), timing (each phase's seconds, summed over the layers) and
    gram_gflop. Each layer is one task of ``executor`` (default `analysis.compute.current`).
    """
    unknown = set(which) - set(METRICS)
    if unknown:
        raise ValueError(f"Unknown metrics {sorted(unknown)}: choose from {', '.join(METRICS)}.")
    n_layers, n_rows, d = n_states(states)
    if n_layers < 2:
        raise ValueError("layer_metrics needs states of shape (L+1, N, d) with L ≥ 1.")
    probe_cap = probe_rows(d) if probe_cap is None else probe_cap
    if probe_cap < 2:
        raise ValueError(f"The probe cap must be at least 2 examples (got {probe_cap}).")
    all_labels = as_labels(labels)
    if len(all_labels) != n_rows:
        raise ValueError(f"{n_rows} stored examples but {len(all_labels)} labels.")
    positions = np.arange(n_rows) if index is None else np.asarray(index, dtype=np.int64)
    if len(positions) and (positions.min() < 0 or positions.max() >= n_rows):
        raise ValueError(f"The index must point at stored examples 0..{n_rows - 1}.")
    raw = all_labels[positions]  # (M,)
    regression = metric == "spearman"
    classes = bin_scores(raw, n_bins) if regression else encode_classes(raw)[0]
    n_classes = int(classes.max()) + 1
    if n_classes < 2:
        raise ValueError(f"ν needs at least two classes; the labels hold {n_classes}.")
    split = split_indices(classes, seed)
    weights = np.zeros((3 * n_classes, n_rows), dtype=np.int32)  # 3C · N · 4 bytes
    for part, members in enumerate((split.train, split.dev, split.test)):
        np.add.at(weights, (part * n_classes + classes[members], positions[members]), 1)
    lay = _Layout(n_classes, weights)

    cca_ok = "cca" in which and len(split.dev) >= 2 and len(split.test) >= 2
    probe_rows_ = stratified_subset(np.arange(len(raw)), classes, probe_cap, seed)
    folds = outer_folds(classes[probe_rows_], seed) if len(np.unique(raw)) >= 2 else None
    probe_ok = "probe" in which and folds is not None

    report = progress or no_progress
    probe = (positions[probe_rows_], raw[probe_rows_], metric, folds, seed) if probe_ok else None
    job = _Pass(lay, which, cca_ok, probe, chunk_rows)
    calls = [(*_task_states(states, layer), layer, job) for layer in range(n_layers)]
    report(0.0, f"{n_layers} layers (streamed)")
    results = run_all(
        _layer_task, calls, executor=executor, work=n_layers * n_rows * d,
        done=lambda finished, total: report(
            finished / total, f"{finished} of {total} layers (streamed)"
        ),
    )  # fmt: skip
    timing = {key: sum(seconds[key] for _, seconds, _ in results) for key in results[0][1]}
    gram_rows = sum(staged for *_, staged in results)
    rows = [row for row, _, _ in results]
    report(1.0, "all layers done")
    df = pd.DataFrame(rows, columns=["layer", *COLUMNS])
    df["layer"] = df["layer"].astype(int)
    df.attrs.update(
        task_type="regression" if regression else "classification",
        metric=metric,
        n=len(raw),
        seed=seed,
        n_classes=n_classes,
        label_note=(
            f"Regression task: ν, CCA and ϱ use the scores cut into {n_classes} "
            "quantile bins; the probe is ridge regression scored by Spearman."
            if regression
            else ""
        ),
        route="streamed",
        timing={k: round(v, 3) for k, v in timing.items()},
        gram_gflop=round(gram_rows * d * d / 1e9, 3),  # the Gram updates' flops (syrk: N d² each)
        probe_cap=probe_cap,
        probe_n=len(probe_rows_) if probe_ok else 0,
        route_note=(
            f"Streamed statistics (N = {len(raw):,}): ν, CCA and ϱ use every example; the probe "
            f"is scored by 5-fold cross-validated predictions on {len(probe_rows_):,} of them (a "
            f"stratified subsample of at most {probe_cap:,} examples at d_model = {d:,})."
        ),
    )
    return df
