"""2-D pictures of one layer's states (PCA, UMAP) for the layer view."""

from __future__ import annotations

import numpy as np

from analysis.layers.metrics import ArrayLike, as_float64


def project_2d(states: ArrayLike, method: str = "pca", seed: int = 0) -> np.ndarray:
    """A 2-D picture of one layer's states (N, d) → (N, 2), for the layer view.

    ``pca``: the top two principal components (centred, via SVD; deterministic signs: the largest
    loading of each component is positive). ``umap``: umap-learn with ``random_state=seed``
    (single-threaded, hence reproducible), n_neighbors = min(15, N − 1), on standardised states.
    """
    h = as_float64(states)
    if h.ndim != 2 or len(h) < 3:
        raise ValueError("A 2-D picture needs states of shape (N, d) with N ≥ 3.")
    if method == "pca":
        centred = h - h.mean(axis=0)
        vt = np.linalg.svd(centred, full_matrices=False)[2][:2]  # (k ≤ 2, d)
        signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])
        xy = centred @ (vt * signs[:, None]).T
        return np.pad(xy, ((0, 0), (0, 2 - xy.shape[1])))
    if method == "umap":
        import umap

        std = h.std(axis=0)
        std[std == 0] = 1.0
        reducer = umap.UMAP(
            n_components=2, n_neighbors=min(15, len(h) - 1), random_state=seed, n_jobs=1
        )
        return np.asarray(reducer.fit_transform((h - h.mean(axis=0)) / std), dtype=np.float64)
    raise ValueError(f"Unknown projection {method!r}: choose pca or umap.")
