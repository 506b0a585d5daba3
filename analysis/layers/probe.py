"""Linear probes: how well a linear classifier on one layer's states predicts the task (SPEC.md, "Probe score")."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from analysis.layers.metrics import ArrayLike, as_float64, as_labels
from analysis.scores import task_score

if TYPE_CHECKING:
    from sklearn.linear_model import LogisticRegression

PROBE_C = 1.0  # inverse L2 strength of the logistic probe, on standardised states
RIDGE_ALPHA = 1.0  # L2 strength of the ridge probe (regression tasks), on standardised states


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = train.mean(axis=0), train.std(axis=0)
    std[std == 0] = 1.0
    return (train - mean) / std, (test - mean) / std


def probe_score(
    train_states: ArrayLike,
    train_labels: ArrayLike,
    test_states: ArrayLike,
    test_labels: ArrayLike,
    metric: str,
    model: LogisticRegression | None = None,
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
        return task_score(metric, y_te, pred)
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
    return task_score(metric, y_te, model.predict(x_te))


def new_probe(n_classes: int = 2, warm_start: bool = False) -> LogisticRegression:
    """The logistic probe, C = PROBE_C. Two classes: Newton–Cholesky (a d × d Hessian, converges in
    a handful of steps; 3–5× faster than L-BFGS here); more classes: L-BFGS, since the multinomial
    Hessian is (d·C)² and Newton would be far slower."""
    from sklearn.linear_model import LogisticRegression

    solver = "newton-cholesky" if n_classes == 2 else "lbfgs"
    return LogisticRegression(C=PROBE_C, solver=solver, max_iter=300, warm_start=warm_start)
