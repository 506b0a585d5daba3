"""Linear probes: how well a linear model on one layer's states predicts the task
(docs/explanation/layer-metrics.md, "The probe and its cross-validation").

**The probe score** of a layer is scored by *cross-validated predictions over all N examples*
(`cv_predictions`): the N examples are cut into k = 5 stratified outer folds, fixed by the seed and
shared by every layer (`outer_folds`), and each example is predicted once, by the probe fit on the
other four folds; the score is the task's metric over the N predictions. Every example counting
once scores five times as many examples as one held-out part would, so the curve (and ρ) depends
far less on which examples happen to be held out.

**Inside each outer fold** the probe is multinomial logistic regression on states standardised
with that fold's train part's mean and std; its inverse L2 strength C is chosen by an inner
stratified 3-fold CV on the fold's train part (C ∈ {10⁻⁴, 10⁻³, …, 10²}, scored with the task's
metric), and the probe is refit on the fold's train part with that C (`fit_probe`). A fixed C = 1
on a few hundred examples in d = 384 overfits and understates separability. The chosen C is
reported per fold and as its median.

Regression (metric ``spearman``): ridge regression with α = 1 / C, C chosen the same way by
(unstratified) k-fold CV scored by Spearman, outer folds unstratified too.

The inner CV walks the C grid with warm starts within each fold rather than refitting every
(fold, C) pair: scikit-learn's ``RidgeCV`` for regression; for classification our own loop
(`_logistic_cv`) over `analysis.layers.logistic.L2Logistic` fits — scikit-learn's
``LogisticRegression`` objective and L-BFGS settings without its per-step overhead (that
module's docstring) — because ``LogisticRegressionCV`` works in float64 only, and float32 fits
are cheaper. The 15 inner fits of a layer's 5 outer folds walk their grids side by side, and
then the 5 refits (`analysis.layers.logistic_batch`): each takes its own L-BFGS-B iterates, and
the products of all fits waiting in a round are two matrix products over the layer's rows, read
once (the same fits up to the rounding of their products; `bench/bench_probe.py` times it against
one fit at a time).
Within `fit_probe` the states are standardised once with its whole train part's mean and std
(not per inner fold): the inner folds see two moments' worth of leakage, which moves no CV
score measurably; the outer folds never do (each is standardised on its own train part).

**The probe's standard error** (`score_se`): the bootstrap over examples of the out-of-fold
predictions (the fitted probes held fixed), the same resampling the layer repeats use
(`analysis.layers.repeats`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import Ridge, RidgeCV
from sklearn.metrics import make_scorer
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.preprocessing import StandardScaler

from analysis.layers.logistic import L2Logistic
from analysis.layers.logistic_batch import (
    SharedRows,
    SubsetFit,
    decisions,
    fit_subsets,
    walk_paths,
)
from analysis.layers.metrics import ArrayLike, as_float64, as_labels
from analysis.scores import task_score

PROBE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # candidate C (inverse L2 strength)
CV_FOLDS = 3
FALLBACK_C = 1.0  # when the train part is too small to cross-validate (fewer than 2 per class)


@dataclass(frozen=True)
class ProbeFit:
    """A probe fitted on one layer's train part.

    c: the chosen C (``FALLBACK_C`` when no CV was possible); cv_score: the mean CV score of
    that C (NaN without CV); cv_scores: mean CV score per candidate C in grid order
    (classification; empty for regression or without CV).
    """

    scaler: StandardScaler
    model: L2Logistic | Ridge | RidgeCV
    c: float
    cv_score: float
    cv_scores: tuple[float, ...]
    regression: bool

    def predict(self, states: ArrayLike) -> np.ndarray:
        """Predicted class labels (as given to `fit_probe`) or regression outputs, (N,)."""
        return self.model.predict(self.scaler.transform(as_float64(states)))

    def probabilities(self, states: ArrayLike) -> np.ndarray:
        """Class probabilities (N, C) in the order of ``model.classes_`` (classification)."""
        if self.regression:
            raise ValueError("A regression probe has no class probabilities.")
        return self.model.predict_proba(self.scaler.transform(as_float64(states)))


def fit_probe(
    states: ArrayLike,
    labels: ArrayLike,
    metric: str,
    seed: int = 0,
    grid: tuple[float, ...] = PROBE_GRID,
    folds: int = CV_FOLDS,
    groups: ArrayLike | None = None,
) -> ProbeFit:
    """Fit the probe of one layer: CV over ``grid`` on (states, labels), refit with the best C.

    states: (N, d); labels: (N,) class labels or regression targets; metric: the task's score
    (``spearman`` means regression). Ties between candidates go to the smaller C (the stronger
    regularisation). With fewer than 2 examples of some class (regression: fewer than 4
    examples) there is nothing to cross-validate, and the probe is fit with C = 1.

    groups: (N,) the example each row is a copy of, for rows of a bootstrap resample
    (`analysis.layers.repeats`): the folds then split the distinct examples, so that no copy of
    an example sits in a fold's train part while another copy is scored (that leak would favour
    weak regularisation). None: every row is its own example.
    """
    x = as_float64(states)
    return fit_probes(x, labels, [np.arange(len(x))], metric, seed, grid, folds, groups)[0]


def fit_probes(
    states: ArrayLike,
    labels: ArrayLike,
    trains: list[np.ndarray],
    metric: str,
    seed: int = 0,
    grid: tuple[float, ...] = PROBE_GRID,
    folds: int = CV_FOLDS,
    groups: ArrayLike | None = None,
) -> list[ProbeFit]:
    """`fit_probe` on each train part ``trains[t]`` (row indices into states (N, d)), every
    part's logistic fits side by side (`_logistic_cv`); the same fits as one `fit_probe` per
    part."""
    x = as_float64(states)
    y_all = as_labels(labels)
    regression = metric == "spearman"
    group_all = None if groups is None else np.unique(as_labels(groups), return_inverse=True)[1]
    done: list[ProbeFit | None] = []
    searches: list[tuple[int, StandardScaler, np.ndarray, np.ndarray, list]] = []
    for t, rows in enumerate(trains):
        y = y_all[rows]
        group_ids = None if group_all is None else group_all[rows]
        first = (
            np.arange(len(y))
            if group_ids is None
            else np.unique(group_ids, return_index=True)[1]  # one row per distinct example
        )
        if regression:
            y = y.astype(np.float64)
            smallest = len(first) // 2
        else:
            _, counts = np.unique(y[first], return_counts=True)
            if len(np.unique(y)) < 2:
                raise ValueError("The probe needs at least two classes in its train part.")
            smallest = int(counts.min()) if len(counts) >= 2 else 0
        scaler = StandardScaler().fit(x[rows])
        k = min(folds, smallest)
        with warnings.catch_warnings():
            # Hitting max_iter on near-separable layers is expected; the held-out score stands.
            warnings.simplefilter("ignore")
            if k < 2:
                z = scaler.transform(x[rows])
                model = Ridge(alpha=1.0 / FALLBACK_C) if regression else L2Logistic(C=FALLBACK_C)
                done.append(ProbeFit(scaler, model.fit(z, y), FALLBACK_C, np.nan, (), regression))
                continue
            splitter = (
                KFold(k, shuffle=True, random_state=seed)
                if regression
                else StratifiedKFold(k, shuffle=True, random_state=seed)
            )
            cv = splitter if group_ids is None else _group_folds(splitter, y, group_ids, first)
            if regression:
                # RidgeCV tries the alphas in order; largest α (smallest C) first breaks ties so.
                scorer = make_scorer(lambda t_, p_: task_score(metric, t_, p_))
                z = scaler.transform(x[rows])
                model = RidgeCV(alphas=[1.0 / c for c in grid], cv=cv, scoring=scorer).fit(z, y)
                done.append(ProbeFit(
                    scaler, model, 1.0 / float(model.alpha_), float(model.best_score_), (), True
                ))  # fmt: skip
                continue
            splits = list(cv.split(np.zeros(len(y)), y) if hasattr(cv, "split") else cv)
        done.append(None)
        searches.append((t, scaler, np.asarray(rows), y, splits))
    if searches:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = _logistic_cv(x, searches, grid, metric)
        for (t, scaler, *_), (model, best, means) in zip(searches, found, strict=True):
            done[t] = ProbeFit(
                scaler, model, grid[best], float(means[best]), tuple(means.tolist()), False
            )
    return done  # type: ignore[return-value]


def _logistic_cv(
    x: np.ndarray, searches: list, grid: tuple[float, ...], metric: str
) -> list[tuple[L2Logistic, int, np.ndarray]]:
    """The inner CV of the logistic probe for several train parts at once: per part, (refit
    model, index of the best C, mean CV score per C).

    searches: (t, scaler, rows, y, splits) per part — its rows of x (N, d) float64, their labels,
    its fitted `StandardScaler`, and its inner folds (index pairs into ``rows``).

    What scikit-learn's ``LogisticRegressionCV`` does — per inner fold, walk the C grid upwards
    with warm starts (L-BFGS), score each C on the fold's held-out rows; the best mean score wins
    (ties to the smaller C); refit on every row of the part with that C, started from the folds'
    mean coefficients. The fits are `L2Logistic`'s (scikit-learn's ``LogisticRegression``
    objective and L-BFGS settings; that module's docstring) on the part's standardised states,
    in float32 like the single fits before them (an L-BFGS step reads the rows twice and is bound
    by memory bandwidth: float32 took 0.6× the time). Every inner fold of every part walks its C
    grid side by side with the others, and then every part's refit
    (`analysis.layers.logistic_batch`): each fit takes its own L-BFGS-B iterates, but the
    waiting fits' products are taken together over the layer's rows, read once. The inner
    folds' held-out scores come from the same shared rows, one product per C.
    """
    shared = SharedRows(x)
    inner = []  # (part, fold, held rows of x, SubsetFit) for every inner fold of every part
    for p, (_, scaler, rows, y, splits) in enumerate(searches):
        for i, (train, held) in enumerate(splits):
            model = L2Logistic(C=grid[0], warm_start=True)
            fit = SubsetFit(rows[train], y[train], scaler.mean_, scaler.scale_, model)
            inner.append((p, i, (rows[held], y[held]), fit))
    fits = [fit for *_, fit in inner]
    paths = walk_paths(shared, fits, [list(grid)] * len(fits))  # (coef_, intercept_) per C
    scores = [np.full((len(s[4]), len(grid)), np.nan) for s in searches]
    for j in range(len(grid)):  # every inner fit at C_j scored on its held-out rows
        raws = decisions(shared, fits, [path[j] for path in paths])
        for (p, i, (held, y_held), fit), raw in zip(inner, raws, strict=True):
            scores[p][i, j] = task_score(metric, y_held, fit.model.labels_of(raw[held]))
    refits, picks = [], []
    for p, (_, scaler, rows, y, _) in enumerate(searches):
        means = scores[p].mean(axis=0)
        best = int(np.nanargmax(means)) if np.isfinite(means).any() else 0
        model = L2Logistic(C=grid[best], warm_start=True)
        fold_paths = [path for (q, *_), path in zip(inner, paths, strict=True) if q == p]
        if len({path[best][0].shape for path in fold_paths}) == 1:  # every fold saw every class
            model.coef_ = np.mean([path[best][0] for path in fold_paths], axis=0)
            model.intercept_ = np.mean([path[best][1] for path in fold_paths], axis=0)
        refits.append(SubsetFit(rows, y, scaler.mean_, scaler.scale_, model))
        picks.append((best, means))
    fit_subsets(shared, refits)
    return [(fit.model, best, means) for fit, (best, means) in zip(refits, picks, strict=True)]


def _group_folds(
    splitter: KFold | StratifiedKFold, y: np.ndarray, group_ids: np.ndarray, first: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The splitter's folds over the distinct examples (one row each: ``first``), expanded to
    every row: all copies of an example land in the same fold."""
    folds = []
    for _, held in splitter.split(np.zeros(len(first)), y[first]):
        scored = np.isin(group_ids, held)
        folds.append((np.flatnonzero(~scored), np.flatnonzero(scored)))
    return folds


def probe_score(
    train_states: ArrayLike,
    train_labels: ArrayLike,
    test_states: ArrayLike,
    test_labels: ArrayLike,
    metric: str,
    seed: int = 0,
) -> float:
    """Held-out task score of the layer's probe, C chosen by CV
    (docs/explanation/layer-metrics.md, "The probe and its cross-validation").

    train_states: (N_train, d); test_states: (N_test, d); labels (N,) each. `fit_probe` on the
    train part, scored on the test part with ``metric``.
    """
    fit = fit_probe(train_states, train_labels, metric, seed=seed)
    return task_score(metric, as_labels(test_labels), fit.predict(test_states))


OUTER_FOLDS = 5  # the probe score's stratified outer folds (module docstring)
SE_RESAMPLES = 200  # bootstrap resamples of the out-of-fold predictions for the table's s.e.


def outer_folds(classes: ArrayLike, seed: int = 0, folds: int = OUTER_FOLDS) -> np.ndarray | None:
    """Which outer fold (0..k−1) each of the N examples is held out in, (N,) int64.

    classes: (N,) class codes (for regression, the binned scores: the folds are then stratified
    by bin). Stratified and seeded (scikit-learn's ``StratifiedKFold``, shuffled with ``seed``);
    k = min(folds, smallest class count). None when some class has fewer than 2 examples (no
    stratified split is possible). Computed once per table and shared by every layer.
    """
    y = as_labels(classes)
    _, counts = np.unique(y, return_counts=True)
    k = min(folds, int(counts.min())) if len(counts) >= 2 else 0
    if k < 2:
        return None
    fold = np.zeros(len(y), dtype=np.int64)
    splitter = StratifiedKFold(k, shuffle=True, random_state=seed)
    for i, (_, held) in enumerate(splitter.split(np.zeros(len(y)), y)):
        fold[held] = i
    return fold


@dataclass(frozen=True)
class ProbeCV:
    """A layer's cross-validated probe: predictions (N,) (each example's, by the probe fit on the
    other folds), score (the task's metric over them), c_folds (the C chosen in each outer fold)
    and se (`score_se`)."""

    predictions: np.ndarray
    score: float
    c_folds: tuple[float, ...]
    se: float

    @property
    def c(self) -> float:
        """The median of the folds' chosen C (NaN without folds)."""
        return float(np.median(self.c_folds)) if self.c_folds else float("nan")


def cv_predictions(
    states: ArrayLike,
    labels: ArrayLike,
    metric: str,
    folds: np.ndarray,
    seed: int = 0,
    grid: tuple[float, ...] = PROBE_GRID,
    inner: int = CV_FOLDS,
) -> ProbeCV:
    """The probe of one layer scored by cross-validated predictions (module docstring).

    states: (N, d); labels: (N,) class labels or regression targets; folds: (N,) outer fold of
    each example (`outer_folds`, shared by every layer); the inner CV of each outer fold is
    seeded with ``seed``. Returns a `ProbeCV`.
    """
    x = as_float64(states)
    y = as_labels(labels)
    fold_ids = np.asarray(folds, dtype=np.int64)
    if len(fold_ids) != len(y) or len(x) != len(y):
        raise ValueError(f"The probe got {len(x)} states, {len(y)} labels, {len(fold_ids)} folds.")
    regression = metric == "spearman"
    predictions = np.empty(len(y), dtype=np.float64 if regression else y.dtype)
    outer = np.unique(fold_ids)
    trains = [np.flatnonzero(fold_ids != k) for k in outer]
    fits = fit_probes(x, y, trains, metric, seed=seed, grid=grid, folds=inner)
    for k, fit in zip(outer, fits, strict=True):
        held = fold_ids == k
        predictions[held] = fit.predict(x[held])
    chosen = [fit.c for fit in fits]
    score = task_score(metric, y, predictions)
    return ProbeCV(predictions, float(score), tuple(chosen), score_se(predictions, y, metric, seed))


def score_se(
    predictions: ArrayLike, labels: ArrayLike, metric: str, seed: int = 0,
    resamples: int = SE_RESAMPLES,
) -> float:  # fmt: skip
    """Bootstrap standard error (sd, ddof = 1) of the task's score over ``resamples`` resamples
    of the N (prediction, label) pairs, the fitted probes held fixed; NaN for N < 2."""
    from analysis.compare import _resample_counts, _resampled_scores

    try:
        pred = np.asarray(predictions, dtype=np.float64)
        y = np.asarray(as_labels(labels), dtype=np.float64)
    except (TypeError, ValueError):  # text labels: class codes (F1's positive class is "1")
        _, codes = np.unique(np.concatenate([as_labels(labels), as_labels(predictions)]),
                                   return_inverse=True)  # fmt: skip
        y, pred = codes[: len(codes) // 2].astype(float), codes[len(codes) // 2 :].astype(float)
    if len(y) < 2:
        return float("nan")
    scores = _resampled_scores(pred, y, metric, _resample_counts(len(y), resamples, seed))
    scores = scores[np.isfinite(scores)]
    return float(np.std(scores, ddof=1)) if scores.size >= 2 else float("nan")
