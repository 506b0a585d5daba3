"""Everything about one trajectory for the CLI and the page: spectrum, update and outliers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.cache import DiskCache
from analysis.progress import Progress, no_progress
from analysis.subspace.outliers import (
    N_SIGMA,
    TOP_K,
    LayerOutliers,
    abs_profile,
    final_update,
    find_outliers,
    recurring_dims,
)
from analysis.subspace.spectrum import LayerSpectrum, layer_spectrum, load_layer_svd
from analysis.subspace.trajectory import Trajectory, as_trajectory


@dataclass
class SubspaceReport:
    """Spectrum and outliers of every layer of one trajectory (see `analyse_trajectory`)."""

    trajectory: Trajectory
    centre: bool
    spectra: list[LayerSpectrum]
    outliers: list[LayerOutliers]
    profiles: dict[int, np.ndarray]  # layer -> (n_bins,) max |u| per run of coordinates
    recurring: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``layers`` (layer, n_params, singular_values, explained_variance_ratio,
        rank, n_directions_90, n_outliers, mean, std, threshold, outliers[param, name, kind, row,
        col, hidden_dim, value, index]) and ``recurring`` (hidden_dim, n_layers, layers)."""
        traj = self.trajectory
        layers = []
        for sp, lo in zip(self.spectra, self.outliers, strict=True):
            layers.append(
                {
                    "layer": sp.layer,
                    "n_params": sp.n_params,
                    "singular_values": sp.singular_values,
                    "explained_variance_ratio": sp.explained_variance_ratio,
                    "rank": sp.rank,
                    "n_directions_90": sp.n_directions(0.9),
                    "n_outliers": lo.n_outliers,
                    "mean": lo.mean,
                    "std": lo.std,
                    "threshold": lo.threshold,
                    "outliers": [
                        {
                            k: e[k]
                            for k in (
                                "param",
                                "name",
                                "kind",
                                "row",
                                "col",
                                "hidden_dim",
                                "value",
                                "index",
                            )
                        }
                        for e in lo.top
                    ],
                }
            )
        return {
            "trajectory_dir": str(traj.folder),
            "t": traj.t,
            "steps": list(traj.steps),
            "dtype": traj.dtype,
            "bytes_per_snapshot": traj.bytes_per_snapshot,
            "centre": self.centre,
            "update": "final update theta_t - theta_0 projected on the trajectory subspace",
            "n_sigma": N_SIGMA,
            "layers": layers,
            "recurring": self.recurring,
        }

    def outlier_table(self) -> pd.DataFrame:
        """One row per top outlier, every layer: layer, kind, param, row, col, hidden_dim, value,
        index (flat coordinate), n_params (the layer's D)."""
        columns = ["layer", "kind", "param", "row", "col", "hidden_dim", "value", "index"]
        rows = [
            {**{k: e[k] for k in columns}, "n_params": lo.n_params}
            for lo in self.outliers
            for e in lo.top
        ]
        return pd.DataFrame(rows, columns=[*columns, "n_params"])


def analyse_trajectory(
    source: Trajectory | Path | str,
    centre: bool = False,
    n_sigma: float = N_SIGMA,
    top_k: int = TOP_K,
    n_bins: int = 512,
    cache: DiskCache | None = None,
    progress: Progress | None = None,
) -> SubspaceReport:
    """Spectrum, learned update u and its outliers for every layer, one layer in memory at a time.

    u is `final_update` (the last snapshot's θ_t − θ_0 projected on the trajectory's subspace).
    For a run trained with method ``subspace`` this is V(θ̄_t − θ̄_0), the paper's V θ̄ up to its
    tiny starting point; for full fine-tuning it is the full update.
    """
    traj = as_trajectory(source)
    report = progress or no_progress
    spectra, outliers, profiles = [], [], {}
    n = len(traj.layers)
    for k, layer in enumerate(traj.layers):
        report(k / n, f"layer {layer}: SVD of the trajectory")
        svd, _ = load_layer_svd(traj, layer, centre=centre, cache=cache)
        spectra.append(layer_spectrum(traj, layer, svd))
        report((k + 0.7) / n, f"layer {layer}: outliers of the update")
        u = final_update(traj, layer, svd.V)
        del svd
        outliers.append(find_outliers(u, traj, layer, n_sigma=n_sigma, top_k=top_k))
        profiles[layer] = abs_profile(u, n_bins)
        del u
    report(1.0, "done")
    return SubspaceReport(traj, centre, spectra, outliers, profiles, recurring_dims(outliers))
