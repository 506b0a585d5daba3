"""The spectrum of a layer's trajectory: compact SVD through the t × t Gram matrix, streamed."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors import safe_open

from analysis.cache import DiskCache
from analysis.progress import Progress, no_progress
from analysis.subspace.trajectory import EPS, Trajectory, as_trajectory


class LayerSVD(NamedTuple):
    """Compact SVD of one layer's trajectory matrix W (t × D): W = U diag(s) Vᵀ."""

    singular_values: torch.Tensor  # (t,) float64, descending; exactly 0 below the cut-off
    V: torch.Tensor  # (D, r) float32, r = number of non-zero singular values; orthonormal columns
    explained_variance_ratio: torch.Tensor  # (t,) float64, s_i² / Σ s², sums to 1


def _block_size(t: int, block_bytes: int) -> int:
    return max(1024, block_bytes // (8 * max(t, 1)))


def trajectory_svd(
    source: Trajectory | Path | str,
    layer: int,
    centre: bool = False,
    block_bytes: int = 32 << 20,
) -> LayerSVD:
    """Compact SVD of layer ``layer``'s trajectory through the Gram matrix
    (docs/explanation/subspaces.md, "The compact SVD").

    W = [θ_1 − θ_0; …; θ_t − θ_0] ∈ R^{t × D} (``centre=True``: each column of W minus its mean
    over the t rows instead, i.e. principal directions of the trajectory).
    G = W Wᵀ (t × t, float64) = U Λ Uᵀ (eigh), s = √Λ, V = Wᵀ U S⁻¹ (D × r).

    Cut-off (what counts as a zero singular value): s_i ≤ τ with
    τ = 2 (ε_s ‖W‖_F + ε_p √t ‖θ_0‖ + √(t ε_64) s_max), where ε_s is the unit round-off of the
    stored dtype (2⁻²⁴ float32, 2⁻¹¹ float16, 2⁻⁸ bfloat16), ε_p that of the parameters
    (float32: 2⁻²⁴) and ε_64 = 2⁻⁵³. The three terms bound, in spectral norm, the perturbation of W
    by rounding the stored differences, by the rounding of each θ_j to the parameters' dtype
    (‖E‖ ≤ ‖E‖_F ≤ √t ε_p ‖θ‖), and the error of eigh on the float64 Gram matrix. Below τ a
    direction cannot be told from rounding noise, and dividing by it would only amplify the noise;
    so such s_i are set to 0 and their directions dropped from V.

    Streaming: two passes over column blocks of W read with ``safe_open(...).get_slice`` from the
    t snapshot files into one reused buffer (block ≈ ``block_bytes`` of float64). Pass 1
    accumulates G in float64; pass 2 fills V block by block in float32 (V's dtype; each entry is
    a sum of only t terms). Peak memory ≈ V itself (D × r float32, the size of W) plus a block.
    """
    traj = as_trajectory(source)
    if layer not in traj.slots:
        raise ValueError(f"Layer {layer} was not recorded; recorded layers: {traj.layers}.")
    t, dim = traj.t, traj.n_params(layer)
    key = f"layer.{layer}"
    block = _block_size(t, block_bytes)
    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(safe_open(traj.path(j), framework="pt")).get_slice(key)
            for j in range(t + 1)
        ]
        theta0, handles = handles[0], handles[1:]

        rows32 = torch.empty(t, block, dtype=torch.float32)
        rows64 = torch.empty(t, block, dtype=torch.float64)

        def read_block(start: int, stop: int) -> torch.Tensor:
            """Columns start:stop of W, (t, stop - start) float32, read into a reused buffer."""
            rows = rows32[:, : stop - start]
            for j, handle in enumerate(handles):
                rows[j].copy_(handle[start:stop])  # float16 → float32 has a fast path
            if centre:
                rows -= rows.mean(dim=0, keepdim=True, dtype=torch.float64).float()
            return rows

        gram = torch.zeros(t, t, dtype=torch.float64)
        theta0_sq = 0.0  # ‖θ_0‖², for the cut-off
        for start in range(0, dim, block):
            stop = min(start + block, dim)
            w = rows64[:, : stop - start]
            w.copy_(read_block(start, stop))
            gram += w @ w.T
            theta0_sq += float(theta0[start:stop].double().square().sum())
        eigvals, eigvecs = torch.linalg.eigh(gram)  # ascending
        eigvals, eigvecs = eigvals.flip(0), eigvecs.flip(1)
        s = eigvals.clamp_min(0).sqrt()
        s_max = float(s[0]) if t else 0.0
        tol = 2.0 * (
            EPS[traj.dtype] * math.sqrt(float(gram.trace().clamp_min(0)))
            + EPS[traj.param_dtype] * math.sqrt(t * theta0_sq)
            + math.sqrt(t * EPS["float64"]) * s_max
        )
        keep = s > tol if s_max > 0 else torch.zeros(t, dtype=torch.bool)
        s = torch.where(keep, s, torch.zeros_like(s))
        r = int(keep.sum())
        coef = (eigvecs[:, :r] / s[:r]).float()  # U S⁻¹, (t, r)
        del rows64
        V = torch.empty(dim, r, dtype=torch.float32)
        if r:
            for start in range(0, dim, block):
                stop = min(start + block, dim)
                torch.mm(read_block(start, stop).T, coef, out=V[start:stop])
    total = float((s**2).sum())
    evr = s**2 / total if total > 0 else torch.zeros_like(s)
    return LayerSVD(s, V, evr)


@dataclass(frozen=True)
class LayerSpectrum:
    """What the page and the CLI show of one layer's trajectory SVD."""

    layer: int
    n_params: int
    singular_values: list[float]  # (t,)
    explained_variance_ratio: list[float]  # (t,)
    rank: int  # non-zero singular values = columns of V

    def n_directions(self, share: float = 0.9) -> int:
        """The smallest k whose first k directions explain at least ``share`` of Σ s²."""
        cum = np.cumsum(self.explained_variance_ratio)
        if not len(cum) or cum[-1] <= 0:
            return 0
        return int(min(np.searchsorted(cum, share - 1e-12) + 1, len(cum)))


def svd_recipe(traj: Trajectory, layer: int, centre: bool) -> dict[str, Any]:
    return {
        "trajectory": traj.id,
        "index_sha256": traj.fingerprint,
        "layer": layer,
        "centre": centre,
    }


def load_layer_svd(
    source: Trajectory | Path | str,
    layer: int,
    centre: bool = False,
    cache: DiskCache | None = None,
) -> tuple[LayerSVD, bool]:
    """`trajectory_svd`, served from the disk cache (kind ``subspace-svd``); returns (svd, hit)."""
    traj = as_trajectory(source)
    cache = cache or DiskCache()

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        svd = trajectory_svd(traj, layer, centre=centre)
        tensors = {
            "V": svd.V,
            "singular_values": svd.singular_values,
            "explained_variance_ratio": svd.explained_variance_ratio,
        }
        return tensors, {"layer": layer, "rank": int(svd.V.shape[1]), "t": traj.t}

    tensors, _, hit = cache.get_or_compute("subspace-svd", svd_recipe(traj, layer, centre), compute)
    svd = LayerSVD(tensors["singular_values"], tensors["V"], tensors["explained_variance_ratio"])
    return svd, hit


def layer_spectrum(traj: Trajectory, layer: int, svd: LayerSVD) -> LayerSpectrum:
    return LayerSpectrum(
        layer=layer,
        n_params=traj.n_params(layer),
        singular_values=svd.singular_values.tolist(),
        explained_variance_ratio=svd.explained_variance_ratio.tolist(),
        rank=int(svd.V.shape[1]),
    )


def spectrum_all_layers(
    source: Trajectory | Path | str,
    centre: bool = False,
    cache: DiskCache | None = None,
    progress: Progress | None = None,
) -> list[LayerSpectrum]:
    """The spectrum of every recorded layer, one layer in memory at a time; V cached on disk."""
    traj = as_trajectory(source)
    report = progress or no_progress
    spectra = []
    for k, layer in enumerate(traj.layers):
        report(k / len(traj.layers), f"SVD of layer {layer}'s trajectory")
        svd, _ = load_layer_svd(traj, layer, centre=centre, cache=cache)
        spectra.append(layer_spectrum(traj, layer, svd))
        del svd
    report(1.0, "spectra done")
    return spectra
