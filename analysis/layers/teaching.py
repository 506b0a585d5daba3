"""The teaching view's synthetic classes and their live metrics."""

from __future__ import annotations

import numpy as np

from analysis.layers.metrics import cca_score, nu, rank_metric


def synthetic_classes(
    n_classes: int = 3,
    dim: int = 2,
    separation: float = 3.0,
    spread: float = 1.0,
    n_per_class: int = 100,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes for the teaching view: X (n_classes · n_per_class, dim), y.

    Class means sit on a circle (dim 2) or a Fibonacci sphere (dim 3) of radius ``separation``;
    each class is isotropic Gaussian noise of std ``spread`` around its mean.
    """
    if dim not in (2, 3):
        raise ValueError(f"The teaching view draws 2-D or 3-D classes (got dim={dim}).")
    if n_classes < 2 or n_per_class < 2:
        raise ValueError("Draw at least 2 classes of at least 2 points each.")
    if separation < 0 or spread < 0:
        raise ValueError("Separation and spread must be non-negative.")
    k = np.arange(n_classes)
    if dim == 2:
        angle = 2 * np.pi * k / n_classes
        centres = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    else:
        z = 1 - 2 * (k + 0.5) / n_classes
        phi = np.pi * (3 - np.sqrt(5)) * k
        r = np.sqrt(1 - z**2)
        centres = np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)
    rng = np.random.default_rng(seed)
    y = np.repeat(k, n_per_class)
    x = separation * centres[y] + spread * rng.standard_normal((len(y), dim))
    return x, y


def teaching_metrics(x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, float]:
    """ν, CCA and ϱ of one synthetic draw (the teaching view's live numbers)."""
    return {"nu": nu(x, y), "cca": cca_score(x, y, seed=seed), "rank": rank_metric(x, y)}
