"""Per-example probe predictions for one layer: which examples a layer gets right, and which it
confuses (the Layers page's picture shows them on hover and lists a selection).

The probe is the one of `analysis.layers.probe`: its inverse L2 strength C is chosen by
cross-validation (`fit_probe`). A prediction for an example the probe was trained on would be
optimistic, so every example is predicted by a probe that did not see it: the sample is split
into k stratified folds (k = 3, seeded), and each fold is predicted by the probe refit with that
C on the other folds (scikit-learn's ``cross_val_predict``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.base import clone
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline

from analysis.layers.metrics import ArrayLike, as_float64, as_labels
from analysis.layers.probe import CV_FOLDS, fit_probe


@dataclass(frozen=True)
class ProbePredictions:
    """predicted: (N,) class labels (as given) or regression outputs, each from a probe that did
    not train on that example (``held_out``; False when the sample was too small to split, and
    the predictions are in-sample); c: the probe's C; correct: (N,) bool (classification only)."""

    predicted: np.ndarray
    c: float
    held_out: bool
    correct: np.ndarray | None

    @property
    def accuracy(self) -> float | None:
        return None if self.correct is None else float(self.correct.mean())


def probe_predictions(
    states: ArrayLike, labels: ArrayLike, metric: str, seed: int = 0, folds: int = CV_FOLDS
) -> ProbePredictions:
    """Held-out probe predictions for every example of one layer.

    states: (N, d) one layer's pooled states; labels: (N,); metric: the task's score
    (``spearman`` means regression).
    """
    x = as_float64(states)
    y = as_labels(labels)
    regression = metric == "spearman"
    fit = fit_probe(x, y, metric, seed=seed, folds=folds)
    if regression:
        k = min(folds, len(y) // 2)
        splitter = KFold(k, shuffle=True, random_state=seed) if k >= 2 else None
    else:
        k = min(folds, int(np.unique(y, return_counts=True)[1].min()))
        splitter = StratifiedKFold(k, shuffle=True, random_state=seed) if k >= 2 else None
    if splitter is None:
        predicted, held_out = fit.predict(x), False
    else:
        # The same probe (scaler + model with the chosen C), refit on each fold's complement.
        model = clone(fit.model)  # an L2Logistic at the chosen C, unfitted
        if hasattr(model, "alphas"):  # RidgeCV → Ridge at the chosen α = 1 / C
            model = Ridge(alpha=1.0 / fit.c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # max_iter on near-separable layers, as in the probe
            predicted = cross_val_predict(
                make_pipeline(clone(fit.scaler), model), x, y, cv=splitter
            )
        held_out = True
    correct = None if regression else predicted == y
    return ProbePredictions(predicted=predicted, c=fit.c, held_out=held_out, correct=correct)
