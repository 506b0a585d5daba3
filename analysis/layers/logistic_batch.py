"""Many `L2Logistic` fits on row subsets of one matrix, fitted side by side (`fit_subsets`).

The probe of one layer (`analysis.layers.probe`) is 5 outer folds × (3 inner folds × 7 C values
+ 1 refit) logistic fits, every one on a subset of the same N rows, each standardised with its
outer fold's mean and scale. One at a time, each L-BFGS step of each fit is two matrix-vector
passes over its rows, bound by memory bandwidth. Here the 15 inner fits walk their C grids
together (`walk_paths`: a fit that is done with one C goes straight on to its next, warm
started), and then the 5 refits (`fit_subsets`): each follows its own L-BFGS-B iterates
(`analysis.layers.lockstep`: the iterates its own ``L2Logistic.fit`` would take, up to the
rounding of its products), and in every round the products of all waiting fits are two matrix
products over the shared rows.

**How one matrix serves every fit.** The rows are held once as float32 x − c (c the rows' mean;
`SharedRows`). A fit standardised with (μ, σ) scores z·w + b = (x − μ)/σ · w + b
= (x − c) · (w/σ) + (b − (μ − c) · (w/σ)): a column w/σ of the product plus a float64 offset, and
its gradient is ((x − c)ᵀ r − (μ − c) Σ r) / σ. Centring first keeps the float32 rows free of the
states' large common offset (BERT's outlier dimensions), so the products round like the
standardised float32 rows a single fit reads (≈ 1e-7 relative). Each fit's rows are a 0/1 weight
per shared row (1/n on its rows; a row listed twice counts twice), so the loss and residuals of
all fits are elementwise operations on the (N, fits) product.

**The products.** Above ``TORCH_MIN_NUMBERS`` shared numbers (N · d) they are torch's (MKL) on one
thread (`analysis.compute.one_torch_thread`), faster than numpy's OpenBLAS there, whose skinny
products copy the large matrix into its packing buffers; below it numpy's (small tables: no torch
import in a worker that only fits layers, and the rows fit in cache). The choice depends on the
matrix's size alone, so a layer gets the same numbers in whichever process fits it. torch's inputs are its own 64-byte-aligned copies (MKL's kernels can
round differently on differently aligned memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.compute import one_torch_thread
from analysis.layers.lockstep import Minimum, minimize_together
from analysis.layers.logistic import L2Logistic

# Shared matrices of at least this many numbers (N · d) take torch's products (module docstring).
TORCH_MIN_NUMBERS = 1 << 21
FTOL = 64 * np.finfo(float).eps  # scikit-learn's L-BFGS-B ``ftol`` (as `L2Logistic`)


@dataclass
class SubsetFit:
    """One fit of a batch: ``model`` (an `L2Logistic`: its C, max_iter and tol; with
    ``warm_start`` its ``coef_`` / ``intercept_`` are the start) fitted on rows ``rows`` (n,) of
    the shared matrix, labelled ``labels`` (n,), standardised as z = (x − mean) / scale
    (``mean``, ``scale``: (d,) float64, a `StandardScaler`'s). `fit_subsets` fits the model in
    place (z-space coefficients, as ``model.fit(z[rows], labels)``)."""

    rows: np.ndarray
    labels: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    model: L2Logistic


class SharedRows:
    """The rows x (N, d) that a batch's fits read, held as float32 x − centre (module docstring);
    ``scores`` and ``back`` are the two products of an L-BFGS round."""

    def __init__(self, x: np.ndarray) -> None:
        x64 = np.asarray(x, dtype=np.float64)
        self.centre = x64.mean(axis=0)  # (d,)
        self._torch: Any = None
        if x64.size >= TORCH_MIN_NUMBERS:
            import torch

            self._torch = torch
            self._rows_t = torch.empty(x64.shape, dtype=torch.float32)  # torch's (aligned) memory
            self.rows = self._rows_t.numpy()  # (N, d), the same memory
        else:
            self.rows = np.empty(x64.shape, dtype=np.float32)
        for start in range(0, len(x64), 4096):  # no float64 temporary of the whole matrix
            np.subtract(x64[start : start + 4096], self.centre, out=self.rows[start : start + 4096],
                        casting="same_kind")  # fmt: skip

    def weights(self, fit: SubsetFit, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(weights on the shared rows (K, d), offsets (K,)) of z-space params (K, d + 1)."""
        wx = params[:, :-1] / fit.scale
        return wx, params[:, -1] - wx @ (fit.mean - self.centre)

    def scores(self, w: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(N, Q) float64: (x − centre) · wᵀ + offsets, w (Q, d) float32."""
        if len(w) == 1:  # see _two_columns
            return self.scores(_two_columns(w), np.append(offsets, 0.0))[:, :1]
        if self._torch is None:
            raw = (self.rows @ w.T).astype(np.float64)
        else:
            with one_torch_thread():
                w_t = self._torch.from_numpy(w).clone()
                raw = (self._rows_t @ w_t.T).numpy().astype(np.float64)
        raw += offsets
        return raw

    def back(self, residual: np.ndarray) -> np.ndarray:
        """(Q, d) float64: residualᵀ (x − centre), residual (N, Q)."""
        if residual.shape[1] == 1:  # see _two_columns
            return self.back(_two_columns(residual.T).T)[:1]
        if self._torch is None:
            return (self.rows.T @ np.asfortranarray(residual, dtype=np.float32)).T.astype(
                np.float64
            )
        with one_torch_thread():
            r_t = self._torch.from_numpy(np.ascontiguousarray(residual.T, dtype=np.float32))
            return (r_t.clone() @ self._rows_t).numpy().astype(np.float64)


def _two_columns(a: np.ndarray) -> np.ndarray:
    """``a`` (1, m) with a row of zeros below. A product with one column goes to the BLAS
    matrix-vector routine, which sums in another order than the matrix-matrix one: padded, a fit
    left alone in its last rounds keeps the matrix-matrix rounding it had beside others. Neither
    BLAS promises more: both pick their kernels by the product's width (MKL on AVX2 blocks the
    columns by fours and eights, whatever the thread count), so a fit's numbers can move by
    rounding with its batch-mates; a given batch gives the same numbers every time
    (tests/layers/test_logistic_batch.py)."""
    return np.concatenate([a, np.zeros_like(a)])


@dataclass
class _Problem:
    """A `SubsetFit` as the solver sees it: its classes, ``k`` weight rows (1 for two classes,
    else one per class), ``l2`` = 1 / (C n) for the C being fitted, and its start
    (k · (d + 1),)."""

    fit: SubsetFit
    classes: np.ndarray
    k: int
    l2: float
    start: np.ndarray


def _problem(fit: SubsetFit, d: int) -> tuple[_Problem, np.ndarray]:
    """(the problem, the class code of each of its rows (n,))."""
    classes, codes = np.unique(np.asarray(fit.labels), return_inverse=True)
    if len(classes) < 2:
        raise ValueError("Logistic regression needs at least two classes.")
    k = 1 if len(classes) == 2 else len(classes)
    start = np.zeros((k, d + 1))
    model = fit.model
    coef, intercept = getattr(model, "coef_", None), getattr(model, "intercept_", None)
    if model.warm_start and coef is not None and np.shape(coef) == (k, d):
        start[:, :d], start[:, d] = coef, intercept
    n = len(fit.rows)
    return _Problem(fit, classes, k, 1.0 / (model.C * n), start.ravel()), codes


def fit_subsets(shared: SharedRows, fits: list[SubsetFit]) -> None:
    """Fit every ``fit.model`` on its rows of ``shared``, side by side (module docstring). The
    models must share max_iter and tol."""
    walk_paths(shared, fits, [[fit.model.C] for fit in fits])


def walk_paths(
    shared: SharedRows, fits: list[SubsetFit], grids: list[list[float]]
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Fit each ``fits[p].model`` at every C of ``grids[p]`` in turn, each fit started from the
    last (a warm start: the walk up the C grid of scikit-learn's ``LogisticRegressionCV``), all
    side by side: a fit that reaches the end of one C goes straight on to its next, in the same
    rounds as the others (`analysis.layers.lockstep`). Returns per fit the (coef_, intercept_)
    at each C; the model ends fitted at its last C (``model.C`` set to it)."""
    if not fits:
        return []
    settings = {(fit.model.max_iter, fit.model.tol) for fit in fits}
    if len(settings) != 1:
        raise ValueError("fit_subsets: the models must share max_iter and tol.")
    max_iter, tol = settings.pop()
    n_all, d = shared.rows.shape
    problems = []
    weight = np.zeros((n_all, len(fits)))  # (N, P): 1/n on fit p's rows
    code = np.zeros((n_all, len(fits)), dtype=np.int64)  # (N, P): class code of fit p's rows
    for p, fit in enumerate(fits):
        problem, codes = _problem(fit, d)
        rows = np.asarray(fit.rows)
        np.add.at(weight[:, p], rows, 1.0 / len(rows))  # a row listed twice counts twice
        code[rows, p] = codes
        if len(np.unique(rows)) != len(rows) and not np.array_equal(code[rows, p], codes):
            raise ValueError("fit_subsets: a row listed twice with two labels.")
        problems.append(problem)
    sizes = np.array([p.k for p in problems])

    def evaluate(ids: list[int], points: list[np.ndarray]) -> list[tuple[float, np.ndarray]]:
        chosen = [problems[i] for i in ids]
        params = [x.reshape(p.k, d + 1) for p, x in zip(chosen, points, strict=True)]
        ks = sizes[ids]
        ends = np.cumsum(ks)
        w = np.empty((int(ends[-1]), d), dtype=np.float32)
        offsets = np.empty(int(ends[-1]))
        for p, theta, end, k in zip(chosen, params, ends, ks, strict=True):
            w[end - k : end], offsets[end - k : end] = shared.weights(p.fit, theta)
        raw = shared.scores(w, offsets)  # (N, Q)
        residual = np.empty_like(raw)
        losses = np.empty(len(ids))
        for k in np.unique(ks):  # fits with as many weight rows, together
            group = np.flatnonzero(ks == k)
            cols = (ends[group, None] - k + np.arange(k)).ravel()
            columns = np.asarray(ids)[group]
            loss, res = _data_terms(raw[:, cols], code[:, columns], weight[:, columns], int(k))
            losses[group] = loss
            residual[:, cols] = res
        grad_x = shared.back(residual)  # (Q, d)
        res_sums = _column_sums(residual)  # (Q,)
        out = []
        for p, theta, end, k, loss in zip(chosen, params, ends, ks, losses, strict=True):
            q = slice(end - k, end)
            coef = theta[:, :-1]
            grad = np.empty_like(theta)
            # ∂/∂w = ((x − c)ᵀ r − (μ − c) Σ r) / σ + l2 w ;  ∂/∂b = Σ r
            grad[:, :-1] = grad_x[q] - np.outer(res_sums[q], p.fit.mean - shared.centre)
            grad[:, :-1] /= p.fit.scale
            grad[:, :-1] += p.l2 * coef
            grad[:, -1] = res_sums[q]
            out.append((float(loss + 0.5 * p.l2 * np.sum(coef * coef)), grad.ravel()))
        return out

    paths: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in fits]

    def then(i: int, found: Minimum) -> np.ndarray | None:
        p = problems[i]
        params = found.x.reshape(p.k, d + 1)
        paths[i].append((params[:, :d].copy(), params[:, d].copy()))
        model = p.fit.model
        model.set_params(C=grids[i][len(paths[i]) - 1])
        model.classes_ = p.classes
        model.coef_, model.intercept_ = paths[i][-1]
        model.n_iter_ = np.array([found.nit])
        model.n_features_in_ = d
        if len(paths[i]) == len(grids[i]):
            return None
        p.l2 = 1.0 / (grids[i][len(paths[i])] * len(p.fit.rows))  # the next C, warm started
        return found.x

    for p, grid in zip(problems, grids, strict=True):
        p.l2 = 1.0 / (grid[0] * len(p.fit.rows))
    minimize_together(
        [p.start for p in problems], evaluate, maxiter=max_iter, gtol=tol, ftol=FTOL, maxls=50,
        then=then,
    )  # fmt: skip
    return paths


def decisions(
    shared: SharedRows, fits: list[SubsetFit], coefs: list[tuple[np.ndarray, np.ndarray]]
) -> list[np.ndarray]:
    """The decision values on every shared row ((N,) for two classes, else (N, K)) of each fit's
    standardisation with coefficients ``coefs[i]`` (coef_ (K, d), intercept_ (K,)), all in one
    product."""
    blocks = [
        shared.weights(fit, np.column_stack([coef, intercept]))
        for fit, (coef, intercept) in zip(fits, coefs, strict=True)
    ]
    raw = shared.scores(
        np.concatenate([w for w, _ in blocks]).astype(np.float32),
        np.concatenate([off for _, off in blocks]),
    )
    ends = np.cumsum([len(w) for w, _ in blocks])
    return [
        raw[:, end - len(w) : end] if len(w) > 1 else raw[:, end - 1]
        for (w, _), end in zip(blocks, ends, strict=True)
    ]


def _data_terms(
    raw: np.ndarray, target: np.ndarray, weight: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The data terms of G fits with k weight rows each, over all N rows weighted by ``weight``.

    raw: (N, G·k) float64 scores, each fit's k columns together; target: (N, G) class codes;
    weight: (N, G) (1/n on a fit's rows, 0 elsewhere). Returns (losses (G,) = Σ_i weight_i ℓ_i,
    residuals (N, G·k) = weight_i ∂ℓ_i/∂score): `L2Logistic`'s binary and softmax terms."""
    if k == 1:  # two classes: one score per row, y ∈ {0, 1}
        # log(1 + e^s) and the sigmoid from one exponential, e = exp(−|s|) (numpy's logaddexp
        # and scipy's expit each take their own)
        e = np.exp(-np.abs(raw))
        terms = np.log1p(e)
        terms += np.maximum(raw, 0.0)
        terms -= np.where(target == 1, raw, 0.0)
        residual = np.where(raw >= 0.0, 1.0, e)
        residual /= 1.0 + e
        residual -= target
        residual *= weight
        terms *= weight
        return _column_sums(terms), residual
    n, g = target.shape
    scores = raw.reshape(n, g, k)
    top = scores.max(axis=2, keepdims=True)
    prob = np.exp(scores - top)
    total = prob.sum(axis=2, keepdims=True)
    at = target[:, :, None]
    terms = np.log(total[:, :, 0]) + top[:, :, 0] - np.take_along_axis(scores, at, axis=2)[:, :, 0]
    prob /= total
    np.put_along_axis(prob, at, np.take_along_axis(prob, at, axis=2) - 1.0, axis=2)
    prob *= weight[:, :, None]
    terms *= weight
    return _column_sums(terms), prob.reshape(n, g * k)


def _column_sums(a: np.ndarray) -> np.ndarray:
    """(Q,) the column sums of a (N, Q), each summed alone as a contiguous vector (numpy's
    pairwise sum), so that a column's sum does not depend on what columns stand beside it. A
    reduction along axis 0 adds the rows one after another when a is wide but sums a
    one-column a pairwise: a fit left alone in its last rounds then rounded differently."""
    return np.ascontiguousarray(a.T).sum(axis=1)


def torch_products(shared: SharedRows) -> bool:
    """Whether ``shared``'s products are torch's (for the tests and benchmarks)."""
    return shared._torch is not None
