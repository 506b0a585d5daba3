"""Outlier dimensions of a learned update, and the zero-weights files of the disable experiment."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.io import atomic_write_json, read_json
from analysis.models import LAYER_PARTS
from analysis.seeding import Stream
from analysis.subspace.trajectory import Trajectory, as_trajectory

N_SIGMA = 3.0
TOP_K = 10


def subspace_update(V: torch.Tensor, theta_bar: torch.Tensor) -> torch.Tensor:
    """u = V θ̄ ∈ R^D, the learned update of a subspace-trained layer (V: (D, r), θ̄: (r,))."""
    return V @ theta_bar.to(V.dtype)


def final_update(
    source: Trajectory | Path | str, layer: int, V: torch.Tensor | None = None
) -> torch.Tensor:
    """u for a plain fine-tuning trajectory, where no θ̄ exists: V Vᵀ (θ_t − θ_0), (D,) float32.

    With uncentred rows θ_t − θ_0 is itself a row of W, so the projection returns it unchanged
    except for the directions dropped by the singular-value cut-off; without ``V`` the raw final
    update θ_t − θ_0 is returned. This is our reading for analysing a trajectory without a
    subspace run; the paper's u is `subspace_update` with the θ̄ trained in the subspace.
    """
    traj = as_trajectory(source)
    update = traj.delta(traj.t, layer)
    return update if V is None else V @ (V.T @ update)


# Readable kinds for the outlier table (paper 003, Table 4).
PART_KINDS = {
    "query": "query",
    "key": "key",
    "value": "value",
    "attn_out": "attention output",
    "ffn_in": "FFN in",
    "ffn_out": "FFN out",
    "attn_norm": "LayerNorm",
    "ffn_norm": "LayerNorm",
}
# Which side of a part's weight W[out, in] is the residual stream (d_model): 'in', 'out' or None.
_RESIDUAL_SIDE = {
    "query": "in",
    "key": "in",
    "value": "in",
    "attn_out": "out",
    "ffn_in": "in",
    "ffn_out": "out",
    "attn_norm": "out",
    "ffn_norm": "out",
}


def param_part(name: str, family: str | None) -> str | None:
    """The canonical part ('query', …, 'ffn_norm') a layer-local parameter name belongs to."""
    families = [family] if family in LAYER_PARTS else list(LAYER_PARTS)
    for fam in families:
        for part, path in LAYER_PARTS[fam].items():
            if name.startswith(path + "."):
                return part
    return None


def describe_entry(name: str, entry: Sequence[int], family: str | None) -> dict[str, Any]:
    """Kind, row, column and residual-stream index of one parameter entry.

    ``kind``: query / key / value / attention output / FFN in / FFN out for Linear weights,
    LayerNorm for LayerNorm weights and biases, bias for Linear biases, other otherwise.
    ``hidden_dim``: the d_model (residual-stream) coordinate the entry reads from or writes to —
    the input column of query/key/value/FFN-in weights, the output row of attention-output/FFN-out
    weights and the index of their biases and of LayerNorm entries. None where the entry touches
    no residual coordinate directly (query/key/value biases live in head space, the FFN-in bias
    in the d_ff space).
    """
    part = param_part(name, family)
    tensor = name.rsplit(".", 1)[-1]
    row = int(entry[0]) if len(entry) >= 1 else 0
    col = int(entry[1]) if len(entry) >= 2 else None
    if part is None:
        kind, hidden = "other", None
    elif part in ("attn_norm", "ffn_norm"):
        kind, hidden = "LayerNorm", row
    elif tensor == "bias":
        kind = "bias"
        hidden = row if _RESIDUAL_SIDE[part] == "out" else None
    else:
        kind = PART_KINDS[part]
        hidden = col if _RESIDUAL_SIDE[part] == "in" else row
    return {
        "kind": kind,
        "part": part,
        "tensor": tensor,
        "row": row,
        "col": col,
        "hidden_dim": hidden,
    }


@dataclass(frozen=True)
class LayerOutliers:
    """The 3σ outliers of one layer's update u (paper 003, "outlier dimensions")."""

    layer: int
    n_params: int
    mean: float
    std: float
    threshold: float  # n_sigma · std
    indices: torch.Tensor  # (n_outliers,) int64 flat coordinates, |u_i − mean| > threshold
    top: list[dict[str, Any]]  # the top-k outliers by |u_i|, described (see `describe_entry`)

    @property
    def n_outliers(self) -> int:
        return int(self.indices.numel())


def find_outliers(
    u: torch.Tensor,
    source: Trajectory | Path | str,
    layer: int,
    n_sigma: float = N_SIGMA,
    top_k: int = TOP_K,
) -> LayerOutliers:
    """Coordinates of u (D,) with |u_i − mean(u)| > n_sigma · std(u); the top_k of them by |u_i|.

    Each top entry: ``{layer, index, param (layer-local name), name (full name inside the
    encoder), kind, part, tensor, row, col, hidden_dim, value}``.
    """
    traj = as_trajectory(source)
    if u.ndim != 1 or u.numel() != traj.n_params(layer):
        raise ValueError(
            f"u must be a vector of layer {layer}'s {traj.n_params(layer)} parameters."
        )
    u64 = u.double()
    mean, std = float(u64.mean()), float(u64.std(correction=0))
    threshold = n_sigma * std
    indices = (
        torch.nonzero((u64 - mean).abs() > threshold).flatten()
        if std > 0
        else torch.empty(0, dtype=torch.long)
    )
    order = u64[indices].abs().argsort(descending=True)[:top_k]
    top = []
    for idx in indices[order].tolist():
        slot, entry = traj.locate(layer, idx)
        top.append(
            {
                "layer": layer,
                "index": idx,
                "param": slot.name,
                "name": traj.prefixes.get(layer, "") + slot.name,
                **describe_entry(slot.name, entry, traj.family),
                "value": float(u[idx]),
            }
        )
    return LayerOutliers(layer, traj.n_params(layer), mean, std, threshold, indices, top)


def recurring_dims(outliers: Sequence[LayerOutliers]) -> list[dict[str, Any]]:
    """How many layers' top outliers touch each residual-stream index (paper 003's O1).

    Each layer counts once per index. Returns ``[{hidden_dim, n_layers, layers}]``, most
    recurrent first (ties by index).
    """
    layers_of: dict[int, set[int]] = {}
    for lo in outliers:
        for entry in lo.top:
            if entry["hidden_dim"] is not None:
                layers_of.setdefault(entry["hidden_dim"], set()).add(lo.layer)
    rows = [
        {"hidden_dim": dim, "n_layers": len(layers), "layers": sorted(layers)}
        for dim, layers in layers_of.items()
    ]
    return sorted(rows, key=lambda r: (-r["n_layers"], r["hidden_dim"]))


def abs_profile(u: torch.Tensor, n_bins: int = 512) -> np.ndarray:
    """max |u| over ``n_bins`` equal runs of coordinates, (n_bins,): a spike-preserving picture."""
    a = u.detach().abs().float()
    n_bins = max(1, min(n_bins, a.numel()))
    edges = np.linspace(0, a.numel(), n_bins + 1).astype(np.int64)
    return np.array([float(a[edges[i] : edges[i + 1]].max()) for i in range(n_bins)])


# ----------------------------------------------------------------------------------------------
# The disable experiment


def positions_by_param(
    traj: Trajectory, layer: int, indices: Iterable[int]
) -> dict[str, list[list[int]]]:
    """{full parameter name: [[row, col] (matrices) or [i] (vectors), …]} for flat coordinates."""
    out: dict[str, list[list[int]]] = {}
    for idx in sorted(set(int(i) for i in indices)):
        slot, entry = traj.locate(layer, idx)
        out.setdefault(traj.prefixes.get(layer, "") + slot.name, []).append(list(entry))
    return out


def write_zero_weights(positions: dict[str, list[list[int]]], path: Path | str) -> dict[str, Any]:
    """Write a ``zero_weights`` JSON file atomically; returns {path, n_weights, n_params}."""
    atomic_write_json(path, dict(sorted(positions.items())))
    return {
        "path": str(path),
        "n_weights": sum(map(len, positions.values())),
        "n_params": len(positions),
    }


def outlier_positions(
    traj: Trajectory, outliers: Sequence[LayerOutliers]
) -> dict[str, list[list[int]]]:
    """Every 3σ outlier of every layer as ``zero_weights`` positions (full names inside the encoder)."""
    merged: dict[str, list[list[int]]] = {}
    for lo in outliers:
        merged.update(positions_by_param(traj, lo.layer, lo.indices.tolist()))
    return merged


def outlier_positions_file(
    source: Trajectory | Path | str, outliers: Sequence[LayerOutliers], path: Path | str
) -> dict[str, Any]:
    """Write the outliers' positions as a ``zero_weights`` file (format: see `write_zero_weights`)."""
    return write_zero_weights(outlier_positions(as_trajectory(source), outliers), path)


def random_positions_like(
    source: Trajectory | Path | str,
    outliers: Sequence[LayerOutliers],
    seed: int,
    path: Path | str | None = None,
) -> dict[str, list[list[int]]]:
    """As many uniformly random coordinates per layer as that layer has outliers, drawn from the
    method stream of training seed ``seed`` (`analysis.seeding`).

    The control of the disable experiment; written as a ``zero_weights`` file when ``path`` given.
    """
    traj = as_trajectory(source)
    rng = Stream(seed, "method").numpy()
    merged: dict[str, list[list[int]]] = {}
    for lo in outliers:
        chosen = rng.choice(traj.n_params(lo.layer), size=lo.n_outliers, replace=False)
        merged.update(positions_by_param(traj, lo.layer, chosen.tolist()))
    if path is not None:
        write_zero_weights(merged, path)
    return merged


def read_zero_weights(path: Path | str) -> dict[str, list[list[int]]]:
    """Read and check a ``zero_weights`` file: {name: [[row, col] or [i], …]}."""
    data = read_json(path, "zero-weights file")
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(e, list) for e in v) for v in data.values()
    ):
        raise ValueError(
            f"The zero-weights file '{path}' must hold {{param name: [[row, col], ...]}}."
        )
    return data


@torch.no_grad()
def apply_zero_weights(
    model: nn.Module,
    positions: dict[str, list[list[int]]] | Path | str,
    skip: Iterable[str] = (),
) -> int:
    """Set the named entries of ``model``'s parameters to zero; returns how many were zeroed.

    Names are full names inside ``model`` (e.g. 'encoder.layer.2.attention.self.query.weight'
    for a base encoder). Each position has one index per tensor dimension. Names in ``skip``
    are ignored (a run cut at its classifier's layer skips the removed layers' weights).
    """
    if not isinstance(positions, dict):
        positions = read_zero_weights(positions)
    params = dict(model.named_parameters())
    skipped = set(skip)
    count = 0
    for name, entries in positions.items():
        if name in skipped:
            continue
        if name not in params:
            raise ValueError(
                f"The model has no parameter {name!r}: is the zero-weights file from another model?"
            )
        param = params[name]
        if not entries:
            continue
        idx = torch.tensor(entries, dtype=torch.long)
        if idx.ndim != 2 or idx.shape[1] != param.ndim:
            raise ValueError(f"Positions of {name} need {param.ndim} indices each.")
        if (idx < 0).any() or (idx >= torch.tensor(param.shape)).any():
            raise ValueError(f"A position of {name} is outside its shape {tuple(param.shape)}.")
        param[tuple(idx.T.to(param.device))] = 0
        count += len(entries)
    return count
