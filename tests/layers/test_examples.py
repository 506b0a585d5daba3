"""Held-out probe predictions per example (analysis.layers.examples)."""

from __future__ import annotations

import numpy as np

from analysis.layers.examples import probe_predictions


def blobs(n_per_class: int, separation: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [separation, 0.0], [0.0, separation]])
    x = np.concatenate([rng.standard_normal((n_per_class, 2)) + c for c in centres])
    y = np.repeat(np.arange(3), n_per_class)
    return np.hstack([x, rng.standard_normal((len(y), 3))]), y


def test_separable_classes_are_predicted_right_and_a_planted_outlier_wrong():
    x, y = blobs(40, separation=12.0)
    x[5, :2] = [12.0, 0.0]  # an example of class 0 sitting in the middle of class 1
    out = probe_predictions(x, y, "accuracy", seed=0)
    assert out.held_out and out.predicted.shape == (120,)
    assert out.predicted[5] == 1 and not out.correct[5]
    assert out.correct.sum() == 119 and out.accuracy == 119 / 120


def test_predictions_are_held_out_not_in_sample():
    # Pure noise with as many dimensions as examples: a probe fit on everything is (nearly)
    # perfect on its own examples, held-out predictions are at chance.
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((60, 60)), np.repeat([0, 1], 30)
    out = probe_predictions(x, y, "accuracy", seed=0)
    assert out.held_out and out.accuracy < 0.75


def test_regression_and_tiny_samples():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 4))
    target = x @ np.array([1.0, -2.0, 0.5, 0.0])
    out = probe_predictions(x, target, "spearman")
    assert out.correct is None and out.accuracy is None
    assert np.corrcoef(out.predicted, target)[0, 1] > 0.95
    few = probe_predictions(x[:4], np.array([0, 1, 0, 1]), "accuracy")  # 2 per class: 2 folds
    assert few.held_out
    lone = probe_predictions(x[:3], np.array([0, 1, 1]), "accuracy")  # a class of one: no folds
    assert not lone.held_out and lone.predicted.shape == (3,)
