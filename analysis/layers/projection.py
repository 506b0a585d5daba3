"""2-D pictures of one layer's states (PCA, UMAP) for the layer view."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from analysis.layers.metrics import ArrayLike, as_float64

if TYPE_CHECKING:
    from analysis.cache import DiskCache
    from analysis.extract import LayerStates


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


PROJECTION_VERSION = 1


def cached_projection(
    layer_states: LayerStates, layer: int, method: str = "pca", seed: int = 0,
    cache: DiskCache | None = None,
) -> tuple[np.ndarray, bool]:  # fmt: skip
    """`project_2d` of one layer of an extraction, from the disk cache when already computed
    (a UMAP takes seconds; a prepared lesson computes none). Returns ((N, 2), hit)."""
    from analysis.cache import DiskCache

    recipe = projection_recipe(layer_states, layer, method, seed)

    def compute():
        xy = project_2d(layer_states.states[layer], method, seed)
        return {"xy": torch.from_numpy(np.ascontiguousarray(xy))}, {}

    tensors, _, hit = (cache or DiskCache()).get_or_compute("projection", recipe, compute)
    return tensors["xy"].numpy(), hit


def projection_recipe(layer_states: LayerStates, layer: int, method: str, seed: int) -> dict:
    """What decides a picture: the states (their cache entry), the layer, the method and seed."""
    if not layer_states.meta.get("cache_path"):
        raise ValueError("Only states from the disk cache have a cached picture.")
    return {
        "states": Path(layer_states.meta["cache_path"]).name,
        "layer": int(layer),
        "method": method,
        "seed": int(seed) if method == "umap" else 0,  # PCA has no seed
        "version": PROJECTION_VERSION,
    }
