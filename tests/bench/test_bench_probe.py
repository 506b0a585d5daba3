"""bench/bench_probe.py's reference (every CV fit made alone, as the probe was before its fits ran
side by side) against `cv_predictions`: the same estimator, so the same score up to where the
rounding of the products moves an L-BFGS stop."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_probe

from analysis.layers.probe import cv_predictions, outer_folds


def test_one_at_a_time_and_side_by_side_give_the_same_probe():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    scale = np.logspace(-1, 1, 30)
    x = (rng.standard_normal((400, 30)) + 0.3 * y[:, None]) * scale + 20.0
    folds = outer_folds(y, 0)
    alone = bench_probe.one_at_a_time(x, y, folds)
    side = cv_predictions(x, y, "accuracy", folds)
    assert 0.6 < side.score < 1.0
    assert abs(side.score - alone) <= max(0.01, 0.5 * side.se)
