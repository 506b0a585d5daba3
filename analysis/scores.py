"""Task scores (docs/explanation/statistics.md, "Task scores"): computed with scikit-learn /
scipy, never fetched metric code.

- ``accuracy``: share of exact matches.
- ``f1``: binary F1 of the positive class (label 1), as for paraphrase-style tasks (MRPC, QQP).
- ``mcc``: Matthews correlation (CoLA-style), in [-1, 1].
- ``spearman``: Spearman rank correlation of a regression output with the gold scores (STS-B-style).

Every score is higher-is-better.
"""

from __future__ import annotations

import warnings

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

METRICS = ("accuracy", "f1", "mcc", "spearman")

METRIC_LABELS: dict[str, str] = {
    "accuracy": "Accuracy",
    "f1": "F1",
    "mcc": "Matthews correlation",
    "spearman": "Spearman correlation",
}


def task_score(metric: str, y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """The task's score of predictions ``y_pred`` (N,) against gold labels ``y_true`` (N,).

    Classification metrics take class ids; ``spearman`` takes real-valued scores. A Spearman
    correlation with a constant input is undefined and returned as NaN; F1 with no predicted
    or gold positive is 0.0, as is the MCC of constant predictions.
    """
    if metric not in METRICS:
        raise ValueError(f"Unknown metric {metric!r}: choose one of {', '.join(METRICS)}.")
    true = np.asarray(y_true)
    pred = np.asarray(y_pred)
    if true.ndim != 1 or pred.ndim != 1 or true.shape != pred.shape:
        raise ValueError(
            f"Gold labels and predictions must be two 1-D arrays of one length "
            f"(got shapes {true.shape} and {pred.shape})."
        )
    if true.size == 0:
        raise ValueError("Cannot score an empty set of predictions.")
    if metric == "accuracy":
        if true.dtype.kind == pred.dtype.kind and true.dtype.kind in "biuU":
            # scikit-learn's accuracy_score is this share; its target checks cost more than the
            # count itself, and the probe's inner CV scores hundreds of (fold, C) pairs per
            # layer table. Other label kinds get those checks.
            return float(np.count_nonzero(true == pred) / true.size)
        return float(accuracy_score(true, pred))
    if metric == "f1":
        return float(f1_score(true, pred, average="binary", pos_label=1, zero_division=0.0))
    if metric == "mcc":
        return float(matthews_corrcoef(true, pred))
    if np.all(true == true[0]) or np.all(pred == pred[0]):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(true.astype(np.float64), pred.astype(np.float64)).statistic)
