"""The probe's classifier: L2-regularised logistic regression by L-BFGS — scikit-learn's
``LogisticRegression(solver="lbfgs")``, objective, optimiser and settings unchanged, without its
per-step overhead.

**Why not scikit-learn's own estimator.** A layer table fits many small probes (5 outer folds × an
inner 3-fold CV over 7 C values per layer: docs/explanation/layer-metrics.md, "The probe and its
cross-validation"), and on matrices this small scikit-learn's estimator spends most of each
L-BFGS step in its array-API dispatch and input checks, not in arithmetic; turning its checks off
(``config_context``) does not remove that. So this module writes only the loss and its gradient
and keeps the rest:

- the objective of ``LogisticRegression``:  (1/n) Σ_i ℓ(y_i, W z_i + b) + ‖W‖_F² / (2 C n),
  the intercept b not penalised; binary: ℓ the logistic loss of one weight vector, ``classes_[1]``
  the positive class; K > 2 classes: the softmax (multinomial) loss of K weight vectors;
- the optimiser and its options: scipy's L-BFGS-B with ``maxiter = max_iter``, ``maxls = 50``,
  ``gtol = tol``, ``ftol = 64 ε``, started from zeros or, with ``warm_start``, from the last fit's
  coefficients (or ``coef_`` / ``intercept_`` set by the caller);
- the estimator interface (``fit``, ``predict``, ``predict_proba``, ``decision_function``,
  ``classes_``, ``coef_``, ``intercept_``, ``n_iter_``; `clone` and pipelines work).

The matrix products run in the input's dtype (the probe passes float32: an L-BFGS step on
3,000 × 1,024 rows is two passes over the matrix and bound by memory bandwidth), the per-example
loss and gradient in float64. tests/layers/test_logistic.py checks the fits against scikit-learn's
(binary and multinomial, several C, warm and cold starts): the same predictions and coefficients
to the solver's tolerance.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.special
from sklearn.base import BaseEstimator, ClassifierMixin

MAX_ITER = 300
TOL = 1e-4  # scikit-learn's default: L-BFGS-B's gtol (the largest projected gradient entry)


class L2Logistic(ClassifierMixin, BaseEstimator):
    """``LogisticRegression(C=C, solver="lbfgs", max_iter=max_iter, tol=tol,
    warm_start=warm_start)``, fitted by this module's loss (module docstring)."""

    def __init__(
        self, C: float = 1.0, max_iter: int = MAX_ITER, tol: float = TOL, warm_start: bool = False
    ) -> None:
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.warm_start = warm_start

    def fit(self, X: np.ndarray, y: np.ndarray) -> L2Logistic:
        z = np.asarray(X)
        if z.dtype not in (np.float32, np.float64):
            z = z.astype(np.float64)
        classes, codes = np.unique(np.asarray(y), return_inverse=True)
        if len(classes) < 2:
            raise ValueError("Logistic regression needs at least two classes.")
        n, d = z.shape
        rows = 1 if len(classes) == 2 else len(classes)
        start = np.zeros((rows, d + 1))
        coef, intercept = getattr(self, "coef_", None), getattr(self, "intercept_", None)
        if self.warm_start and coef is not None and np.shape(coef) == (rows, d):
            start[:, :d], start[:, d] = coef, intercept
        loss = _binary_loss if rows == 1 else _multinomial_loss
        target = codes.astype(np.float64) if rows == 1 else codes
        result = scipy.optimize.minimize(
            loss, start.ravel(), args=(z, target, rows, 1.0 / (self.C * n)), jac=True,
            method="L-BFGS-B",
            options={"maxiter": self.max_iter, "maxls": 50, "gtol": self.tol,
                     "ftol": 64 * np.finfo(float).eps},
        )  # fmt: skip
        params = result.x.reshape(rows, d + 1)
        self.classes_ = classes
        self.coef_ = params[:, :d].copy()
        self.intercept_ = params[:, d].copy()
        self.n_iter_ = np.array([result.nit])
        self.n_features_in_ = d
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """(N,) for two classes (> 0: ``classes_[1]``), else (N, K)."""
        raw = np.asarray(X, dtype=np.float64) @ self.coef_.T + self.intercept_
        return raw[:, 0] if len(self.classes_) == 2 else raw

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.labels_of(self.decision_function(X))

    def labels_of(self, raw: np.ndarray) -> np.ndarray:
        """The predicted labels of decision values ``raw`` ((N,) or (N, K), as
        `decision_function` gives them; the probe's side-by-side fits compute them elsewhere)."""
        index = (raw > 0).astype(int) if raw.ndim == 1 else raw.argmax(axis=1)
        return self.classes_[index]

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """(N, K) in the order of ``classes_``."""
        raw = self.decision_function(X)
        if raw.ndim == 1:
            positive = scipy.special.expit(raw)
            return np.column_stack([1.0 - positive, positive])
        return scipy.special.softmax(raw, axis=1)


def _binary_loss(
    w: np.ndarray, z: np.ndarray, y: np.ndarray, _rows: int, l2: float
) -> tuple[float, np.ndarray]:
    """Objective and gradient for two classes; w = (coef (d,), intercept), y ∈ {0, 1}."""
    # In-place steps and sum / n for np.mean: the same arithmetic in fewer calls (a default
    # layer table evaluates this ≈ 19,000 times, each ≈ 50 µs, mostly call overhead).
    n, coef = len(y), w[:-1]
    raw = (z @ coef.astype(z.dtype)).astype(np.float64)
    raw += w[-1]
    terms = np.logaddexp(0.0, raw)
    terms -= y * raw
    loss = terms.sum() / n + 0.5 * l2 * (coef @ coef)
    residual = scipy.special.expit(raw)
    residual -= y
    residual /= n
    grad = np.empty_like(w)
    grad[:-1] = z.T @ residual.astype(z.dtype) + l2 * coef
    grad[-1] = residual.sum()
    return float(loss), grad


def _multinomial_loss(
    w: np.ndarray, z: np.ndarray, y: np.ndarray, rows: int, l2: float
) -> tuple[float, np.ndarray]:
    """Objective and gradient for K = ``rows`` classes; w = (K, d + 1) ravelled (each row a
    class's coef and intercept), y the class codes 0..K−1."""
    n, params = len(y), w.reshape(rows, -1)
    coef = params[:, :-1]
    raw = (z @ coef.T.astype(z.dtype)).astype(np.float64)
    raw += params[:, -1]
    top = raw.max(axis=1, keepdims=True)
    residual = np.subtract(raw, top)  # softmax, shifted for stability (cheaper than logsumexp)
    np.exp(residual, out=residual)
    total = residual.sum(axis=1, keepdims=True)
    picked = np.arange(n)
    terms = np.log(total[:, 0])
    terms += top[:, 0]
    terms -= raw[picked, y]
    loss = terms.sum() / n + 0.5 * l2 * np.sum(coef**2)
    residual /= total
    residual[picked, y] -= 1.0
    residual /= n
    grad = np.empty_like(params)
    grad[:, :-1] = (residual.T.astype(z.dtype) @ z) + l2 * coef
    grad[:, -1] = residual.sum(axis=0)
    return float(loss), grad.ravel()
