"""Intrinsic task subspaces of fine-tuning (SPEC.md "Subspaces", paper 003).

Four stages, each usable on its own:

1. **Recording** (`TrajectoryRecorder`): during a fine-tuning run, every ``every`` optimiser steps,
   each encoder layer's parameters are flattened into one vector θ ∈ R^D (D = the layer's parameter
   count) and written to disk, one safetensors file per snapshot. Nothing is kept in memory across
   snapshots except θ_0.
2. **Spectrum** (`trajectory_svd`, `spectrum_all_layers`): per layer, W = [θ_1 − θ_0; …; θ_t − θ_0]
   ∈ R^{t × D}, compact SVD through the t × t Gram matrix G = W Wᵀ in float64, V = Wᵀ U S⁻¹.
   Streamed in column blocks read straight from the snapshot files: W is never materialised.
3. **Outliers** (`find_outliers`, `recurring_dims`): coordinates of the learned update u whose
   deviation from the mean exceeds 3 standard deviations, with their parameter, row, column and the
   residual-stream (d_model) index they touch.
4. **Disable experiment** (`outlier_positions_file`, `random_positions_like`, `apply_zero_weights`):
   the JSON file of weights to zero before fine-tuning, for the outliers or for as many random
   weights.

Trajectory folder, format version 1::

    index.json                  what is where (see `TrajectoryRecorder`)
    snap-00000.safetensors      θ_0, float32, keys ``layer.<ℓ>`` (ℓ = 1..L), shape (D_ℓ,)
    snap-00001.safetensors      θ_1 − θ_0 in the chosen dtype, same keys
    …

Snapshots after the first store the *difference* from θ_0, not θ_j itself. Why: fine-tuning
moves a weight by about the learning rate per step (≈ 2e-5), while float16 spacing at a typical
weight magnitude of 0.05 is 3e-5 — a float16 θ_j would round most of the update away, whereas a
float16 θ_j − θ_0 keeps three significant digits of it. The SVD needs exactly these differences.

Within a layer the flattened order is fixed and documented: the layer's ``named_parameters()``
sorted by name, each tensor flattened row-major (``reshape(-1)``), concatenated. ``index.json``
lists every parameter with its name, shape and offset, so a coordinate maps back to an entry.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import math
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from analysis.cache import DiskCache
from analysis.models import LAYER_PARTS
from analysis.progress import Progress, no_progress

FORMAT = "tunescope-trajectory"
FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Unit round-off per dtype, used by the singular-value cut-off of `trajectory_svd`.
_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
N_SIGMA = 3.0
TOP_K = 10


class TrajectoryError(ValueError):
    """A trajectory folder that is missing, incomplete or not ours."""


# ----------------------------------------------------------------------------------------------
# 1. Recording


@dataclass(frozen=True)
class ParamSlot:
    """Where one parameter tensor of a layer lives inside the layer's flattened vector."""

    name: str  # inside the layer, e.g. 'attention.self.query.weight'
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def layer_slots(layer: nn.Module) -> list[ParamSlot]:
    """The layer's parameters in the recorded order: sorted by name, row-major, concatenated."""
    slots, offset = [], 0
    for name, param in sorted(layer.named_parameters(), key=lambda item: item[0]):
        slots.append(ParamSlot(name, tuple(param.shape), offset))
        offset += param.numel()
    return slots


def flatten_layer(layer: nn.Module) -> torch.Tensor:
    """θ of one layer, (D,) float32 on the layer's device, in the `layer_slots` order."""
    params = sorted(layer.named_parameters(), key=lambda item: item[0])
    return torch.cat([p.detach().reshape(-1).float() for _, p in params])


def layer_prefixes(root: nn.Module, layers: Sequence[nn.Module]) -> list[str]:
    """Each layer's qualified name inside ``root`` plus a dot ('encoder.layer.0.'), for full names."""
    names = {id(module): name for name, module in root.named_modules()}
    prefixes = []
    for layer in layers:
        if id(layer) not in names:
            raise ValueError(
                "A layer given to layer_prefixes is not a submodule of the root model."
            )
        prefixes.append(names[id(layer)] + ".")
    return prefixes


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _atomic_save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> int:
    """Write a safetensors file atomically; return its size in bytes."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path.stat().st_size


class TrajectoryRecorder:
    """Snapshot each encoder layer's flattened parameters every ``every`` steps (SPEC "Subspaces").

    Usage by the fine-tuning engine::

        rec = TrajectoryRecorder(run_dir / "trajectory", encoder_layers(model), every=k, dtype="float16")
        rec.maybe_record(0)             # θ_0, before the first optimiser step
        for step in 1..n: ...; optimiser.step(); rec.maybe_record(step)
        info = rec.close()

    ``layers`` are the L transformer blocks bottom to top; they are recorded as ``layer.1`` ..
    ``layer.L``. ``family`` (optional) names the layer parts; ``prefixes`` (optional) are each
    layer's qualified name inside the encoder (``'encoder.layer.0.'``), used to write full
    parameter names for the disable experiment; both are inferred when not given.

    Memory: θ_0 of every layer stays on the CPU in float32 (one copy of the encoder's layers);
    each snapshot is built, written and dropped. Writes are atomic (temporary file + rename) and
    ``index.json`` is rewritten after each snapshot, so a run that dies leaves a readable prefix.
    """

    def __init__(
        self,
        folder: Path | str,
        layers: Sequence[nn.Module],
        every: int,
        dtype: str = "float32",
        family: str | None = None,
        prefixes: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(
                f"Trajectory interval must be a positive number of steps, got {every!r}."
            )
        if dtype not in DTYPES:
            raise ValueError(f"Trajectory dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
        if len(layers) == 0:
            raise ValueError("A trajectory needs at least one layer to record.")
        if prefixes is not None and len(prefixes) != len(layers):
            raise ValueError("Give one prefix per recorded layer.")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        if (self.folder / "index.json").exists():
            raise ValueError(f"{self.folder} already holds a trajectory; give a fresh folder.")
        self.layers = list(layers)
        self.every = every
        self.dtype = dtype
        self._slots = [layer_slots(layer) for layer in self.layers]
        first_param = next(self.layers[0].parameters())
        self.param_dtype = str(first_param.dtype).removeprefix("torch.")
        names = [s.name for s in self._slots[0]]
        self.family = family or infer_family(names)
        if prefixes is None:
            stem = "transformer.layer" if self.family == "distilbert" else "encoder.layer"
            prefixes = [f"{stem}.{i}." for i in range(len(self.layers))]
        self._prefixes = list(prefixes)
        self._theta0: list[torch.Tensor] | None = None
        self._snapshots: list[dict[str, Any]] = []
        self._id = uuid.uuid4().hex
        self._closed = False

    def maybe_record(self, step: int) -> bool:
        """Record when ``step`` is a multiple of ``every`` (step 0 = before training). True if written."""
        if self._closed:
            raise RuntimeError("This trajectory recorder is closed.")
        if step % self.every != 0 or self._recorded(step):
            return False
        self._record(step)
        return True

    def close(self) -> dict[str, Any]:
        """Finish (no more snapshots) and describe what was written.

        Only steps that are multiples of ``every`` are recorded: the engine may restore its best
        dev state before closing, so the weights at close time need not be the last step's.
        Returns ``{trajectory_dir, n_snapshots, steps, dtype, every, bytes_per_snapshot,
        bytes_total, n_params (per layer), n_layers}``; ``bytes_per_snapshot`` is the size of one
        difference snapshot (the float32 θ_0 file counts only in ``bytes_total``).
        """
        self._closed = True
        self._theta0 = None
        sizes = [s["bytes"] for s in self._snapshots]
        return {
            "trajectory_dir": str(self.folder),
            "n_snapshots": len(self._snapshots),
            "steps": [s["step"] for s in self._snapshots],
            "dtype": self.dtype,
            "every": self.every,
            "bytes_per_snapshot": sizes[1] if len(sizes) > 1 else (sizes[0] if sizes else 0),
            "bytes_total": sum(sizes),
            "n_params": [sum(s.numel for s in slots) for slots in self._slots],
            "n_layers": len(self.layers),
        }

    def _recorded(self, step: int) -> bool:
        return bool(self._snapshots) and self._snapshots[-1]["step"] == step

    def _record(self, step: int) -> None:
        first = self._theta0 is None
        tensors: dict[str, torch.Tensor] = {}
        current = [flatten_layer(layer).cpu() for layer in self.layers]
        if first:
            self._theta0 = current
            for i, theta in enumerate(current, start=1):
                tensors[f"layer.{i}"] = theta.contiguous()
        else:
            for i, (theta, theta0) in enumerate(zip(current, self._theta0, strict=True), start=1):
                tensors[f"layer.{i}"] = (theta - theta0).to(DTYPES[self.dtype]).contiguous()
        name = f"snap-{len(self._snapshots):05d}.safetensors"
        size = _atomic_save_tensors(self.folder / name, tensors)
        self._snapshots.append({"step": int(step), "file": name, "bytes": size})
        self._write_index()

    def _write_index(self) -> None:
        index = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "id": self._id,
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
            "every": self.every,
            "family": self.family,
            "stored": "snapshot 0 holds theta_0 (float32); snapshot j >= 1 holds theta_j - theta_0",
            "param_order": "sorted named_parameters() of the layer, each flattened row-major",
            "layers": [
                {
                    "layer": i,
                    "prefix": prefix,
                    "n_params": sum(s.numel for s in slots),
                    "params": [[s.name, list(s.shape), s.offset] for s in slots],
                }
                for i, (slots, prefix) in enumerate(
                    zip(self._slots, self._prefixes, strict=True), start=1
                )
            ],
            "snapshots": self._snapshots,
        }
        _atomic_write_bytes(self.folder / "index.json", json.dumps(index, indent=1).encode())


def infer_family(param_names: Iterable[str]) -> str | None:
    """The family whose layer-part paths explain the most parameter names (None if none does)."""
    names = list(param_names)
    best, best_hits = None, 0
    for family, parts in LAYER_PARTS.items():
        hits = sum(any(n.startswith(path + ".") for path in parts.values()) for n in names)
        if hits > best_hits:
            best, best_hits = family, hits
    return best


# ----------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class Trajectory:
    """A recorded trajectory, opened for reading (see the module docstring for the format)."""

    folder: Path
    id: str
    dtype: str  # of the stored differences
    param_dtype: str  # of the model's parameters when recorded
    every: int
    family: str | None
    steps: tuple[int, ...]
    files: tuple[str, ...]
    snapshot_bytes: tuple[int, ...]
    slots: dict[int, tuple[ParamSlot, ...]]  # layer (1-based) -> parameters in flattened order
    prefixes: dict[int, str]
    fingerprint: str  # SHA-256 of index.json
    _offsets: dict[int, list[int]] = field(default_factory=dict, repr=False)

    @property
    def t(self) -> int:
        """Number of trained snapshots θ_1..θ_t (θ_0 excluded)."""
        return len(self.steps) - 1

    @property
    def layers(self) -> list[int]:
        return sorted(self.slots)

    def n_params(self, layer: int) -> int:
        last = self.slots[layer][-1]
        return last.offset + last.numel

    @property
    def bytes_per_snapshot(self) -> int:
        return self.snapshot_bytes[1] if len(self.snapshot_bytes) > 1 else self.snapshot_bytes[0]

    def path(self, j: int) -> Path:
        return self.folder / self.files[j]

    def theta0(self, layer: int) -> torch.Tensor:
        """θ_0 of a layer, (D,) float32."""
        with safe_open(self.path(0), framework="pt") as fh:
            return fh.get_tensor(f"layer.{layer}").float()

    def delta(self, j: int, layer: int) -> torch.Tensor:
        """θ_j − θ_0 of a layer, (D,) float32 (j ≥ 1)."""
        if not 1 <= j <= self.t:
            raise IndexError(f"Snapshot {j} is not in 1..{self.t}.")
        with safe_open(self.path(j), framework="pt") as fh:
            return fh.get_tensor(f"layer.{layer}").float()

    def theta(self, j: int, layer: int) -> torch.Tensor:
        """θ_j of a layer, (D,) float32."""
        base = self.theta0(layer)
        return base if j == 0 else base + self.delta(j, layer)

    def locate(self, layer: int, index: int) -> tuple[ParamSlot, tuple[int, ...]]:
        """The parameter holding flat coordinate ``index`` of a layer, and its entry (row, col) or (i,)."""
        offsets = self._offsets.get(layer) or [s.offset for s in self.slots[layer]]
        self._offsets[layer] = offsets
        if not 0 <= index < self.n_params(layer):
            raise IndexError(
                f"Coordinate {index} is outside layer {layer} (D = {self.n_params(layer)})."
            )
        slot = self.slots[layer][bisect.bisect_right(offsets, index) - 1]
        entry = np.unravel_index(index - slot.offset, slot.shape) if slot.shape else ()
        return slot, tuple(int(e) for e in entry)

    def flat_index(self, layer: int, name: str, entry: Sequence[int]) -> int:
        """The inverse of `locate`: flat coordinate of entry ``entry`` of parameter ``name``."""
        for slot in self.slots[layer]:
            if slot.name == name:
                return slot.offset + int(np.ravel_multi_index(tuple(entry), slot.shape))
        raise KeyError(f"Layer {layer} has no parameter {name!r}.")


def open_trajectory(folder: Path | str) -> Trajectory:
    """Open a trajectory folder written by `TrajectoryRecorder`; TrajectoryError if unusable."""
    folder = Path(folder)
    index_path = folder / "index.json"
    if not index_path.is_file():
        raise TrajectoryError(f"No trajectory in {folder}: index.json is missing.")
    raw = index_path.read_bytes()
    try:
        index = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TrajectoryError(f"{index_path} is not valid JSON: {exc}") from exc
    if index.get("format") != FORMAT or index.get("version") != FORMAT_VERSION:
        raise TrajectoryError(
            f"{folder} does not hold a version-{FORMAT_VERSION} tunescope trajectory."
        )
    snaps = index.get("snapshots", [])
    if len(snaps) < 2:
        raise TrajectoryError(
            f"The trajectory in {folder} has {len(snaps)} snapshot(s); the SVD needs θ_0 and at "
            "least one trained snapshot (train longer or record more often)."
        )
    for snap in snaps:
        if not (folder / snap["file"]).is_file():
            raise TrajectoryError(f"Snapshot file {snap['file']} of {folder} is missing.")
    slots = {
        int(entry["layer"]): tuple(ParamSlot(n, tuple(s), int(o)) for n, s, o in entry["params"])
        for entry in index["layers"]
    }
    prefixes = {int(entry["layer"]): entry.get("prefix") or "" for entry in index["layers"]}
    return Trajectory(
        folder=folder,
        id=index["id"],
        dtype=index["dtype"],
        param_dtype=index.get("param_dtype") if index.get("param_dtype") in _EPS else "float32",
        every=int(index["every"]),
        family=index.get("family"),
        steps=tuple(int(s["step"]) for s in snaps),
        files=tuple(s["file"] for s in snaps),
        snapshot_bytes=tuple(int(s["bytes"]) for s in snaps),
        slots=slots,
        prefixes=prefixes,
        fingerprint=hashlib.sha256(raw).hexdigest(),
    )


def _as_trajectory(source: Trajectory | Path | str) -> Trajectory:
    return source if isinstance(source, Trajectory) else open_trajectory(source)


# ----------------------------------------------------------------------------------------------
# 2. Spectrum


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
    """Compact SVD of layer ``layer``'s trajectory through the Gram matrix (SPEC "Subspaces").

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
    traj = _as_trajectory(source)
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
            _EPS[traj.dtype] * math.sqrt(float(gram.trace().clamp_min(0)))
            + _EPS[traj.param_dtype] * math.sqrt(t * theta0_sq)
            + math.sqrt(t * _EPS["float64"]) * s_max
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
    traj = _as_trajectory(source)
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


def spectrum_all_layers(
    source: Trajectory | Path | str,
    centre: bool = False,
    cache: DiskCache | None = None,
    progress: Progress | None = None,
) -> list[LayerSpectrum]:
    """The spectrum of every recorded layer, one layer in memory at a time; V cached on disk."""
    traj = _as_trajectory(source)
    report = progress or no_progress
    spectra = []
    for k, layer in enumerate(traj.layers):
        report(k / len(traj.layers), f"SVD of layer {layer}'s trajectory")
        svd, _ = load_layer_svd(traj, layer, centre=centre, cache=cache)
        spectra.append(
            LayerSpectrum(
                layer=layer,
                n_params=traj.n_params(layer),
                singular_values=svd.singular_values.tolist(),
                explained_variance_ratio=svd.explained_variance_ratio.tolist(),
                rank=int(svd.V.shape[1]),
            )
        )
        del svd
    report(1.0, "spectra done")
    return spectra


# ----------------------------------------------------------------------------------------------
# 3. Outliers


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
    traj = _as_trajectory(source)
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
    traj = _as_trajectory(source)
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
# 4. Disable experiment


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(path, json.dumps(positions, indent=1, sort_keys=True).encode())
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
    return write_zero_weights(outlier_positions(_as_trajectory(source), outliers), path)


def random_positions_like(
    source: Trajectory | Path | str,
    outliers: Sequence[LayerOutliers],
    seed: int,
    path: Path | str | None = None,
) -> dict[str, list[list[int]]]:
    """As many uniformly random coordinates per layer as that layer has outliers (seeded).

    The control of the disable experiment; written as a ``zero_weights`` file when ``path`` given.
    """
    traj = _as_trajectory(source)
    rng = np.random.default_rng(seed)
    merged: dict[str, list[list[int]]] = {}
    for lo in outliers:
        chosen = rng.choice(traj.n_params(lo.layer), size=lo.n_outliers, replace=False)
        merged.update(positions_by_param(traj, lo.layer, chosen.tolist()))
    if path is not None:
        write_zero_weights(merged, path)
    return merged


def read_zero_weights(path: Path | str) -> dict[str, list[list[int]]]:
    """Read and check a ``zero_weights`` file: {name: [[row, col] or [i], …]}."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"Cannot read zero-weights file {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(e, list) for e in v) for v in data.values()
    ):
        raise ValueError(f"{path} is not a zero-weights file ({{param name: [[row, col], ...]}}).")
    return data


@torch.no_grad()
def apply_zero_weights(model: nn.Module, positions: dict[str, list[list[int]]] | Path | str) -> int:
    """Set the named entries of ``model``'s parameters to zero; returns how many were zeroed.

    Names are full names inside ``model`` (e.g. 'encoder.layer.2.attention.self.query.weight'
    for a base encoder). Each position has one index per tensor dimension.
    """
    if not isinstance(positions, dict):
        positions = read_zero_weights(positions)
    params = dict(model.named_parameters())
    count = 0
    for name, entries in positions.items():
        if name not in params:
            raise ValueError(
                f"The model has no parameter {name!r} (zero-weights file from another model?)."
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


def count_by_kind(outliers: Sequence[LayerOutliers]) -> Counter:
    """How often each kind appears among the top outliers (for the table's summary)."""
    return Counter(entry["kind"] for lo in outliers for entry in lo.top)


# ----------------------------------------------------------------------------------------------
# Everything about one trajectory, for the CLI and the page


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
    traj = _as_trajectory(source)
    report = progress or no_progress
    spectra, outliers, profiles = [], [], {}
    n = len(traj.layers)
    for k, layer in enumerate(traj.layers):
        report(k / n, f"layer {layer}: SVD of the trajectory")
        svd, _ = load_layer_svd(traj, layer, centre=centre, cache=cache)
        spectra.append(
            LayerSpectrum(
                layer=layer,
                n_params=traj.n_params(layer),
                singular_values=svd.singular_values.tolist(),
                explained_variance_ratio=svd.explained_variance_ratio.tolist(),
                rank=int(svd.V.shape[1]),
            )
        )
        report((k + 0.7) / n, f"layer {layer}: outliers of the update")
        u = final_update(traj, layer, svd.V)
        del svd
        outliers.append(find_outliers(u, traj, layer, n_sigma=n_sigma, top_k=top_k))
        profiles[layer] = abs_profile(u, n_bins)
        del u
    report(1.0, "done")
    return SubspaceReport(traj, centre, spectra, outliers, profiles, recurring_dims(outliers))


# ----------------------------------------------------------------------------------------------
# Comparing runs: intrinsic vs random subspace vs frozen vs full; outliers vs random weights zeroed

COMPARISON_GROUPS = (
    "full",
    "intrinsic subspace",
    "random subspace",
    "frozen",
    "outliers zeroed",
    "random weights zeroed",
)


def comparison_group(
    config: dict[str, Any],
    source: Sequence[str],
    outlier_file: str | None,
    random_files: Sequence[str] = (),
) -> str | None:
    """Which bar of the comparison a run's config belongs to (None: not part of it).

    ``source``: the names of the subspace's run (its id and/or trajectory folder), matched
    against ``subspace_from``; ``outlier_file`` / ``random_files``: the zero-weights files of the
    disable experiment, matched against ``zero_weights``.
    """
    method = config.get("method")
    zero = config.get("zero_weights")
    if method in ("subspace", "subspace-random"):
        if config.get("subspace_from") not in source:
            return None
        return "intrinsic subspace" if method == "subspace" else "random subspace"
    if method == "frozen" and not zero:
        return "frozen"
    if method == "full":
        if not zero:
            return "full"
        if outlier_file and zero == outlier_file:
            return "outliers zeroed"
        if zero in random_files:
            return "random weights zeroed"
    return None


def comparison_table(
    runs: pd.DataFrame,
    source: Sequence[str],
    outlier_file: str | None = None,
    random_files: Sequence[str] = (),
) -> pd.DataFrame:
    """Completed runs (``RunsDB.list_runs`` rows, with ``config_json``) sorted into the groups.

    Columns: id, group, seed, score, metric, n_trainable.
    """
    rows = []
    for _, run in runs.iterrows():
        if run.get("status") != "done" or not isinstance(run.get("config_json"), str):
            continue
        group = comparison_group(json.loads(run["config_json"]), source, outlier_file, random_files)
        if group is not None:
            rows.append(
                {
                    "id": run["id"],
                    "group": group,
                    "seed": run["seed"],
                    "score": run["score"],
                    "metric": run.get("metric"),
                    "n_trainable": run.get("n_trainable"),
                }
            )
    return pd.DataFrame(rows, columns=["id", "group", "seed", "score", "metric", "n_trainable"])


def summarise_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per group: n_seeds, mean score, score_sem = std(ddof=1)/√n (NaN with one seed), n_trainable."""
    columns = ["group", "n_seeds", "score", "score_sem", "n_trainable"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    scores = table.assign(score=pd.to_numeric(table["score"], errors="coerce"))
    out = (
        scores.groupby("group", sort=False)
        .agg(
            n_seeds=("score", "count"),
            score=("score", "mean"),
            score_std=("score", "std"),
            n_trainable=("n_trainable", "mean"),
        )
        .reset_index()
    )
    out["score_sem"] = out["score_std"] / np.sqrt(out["n_seeds"].clip(lower=1))
    out.loc[out["n_seeds"] < 2, "score_sem"] = np.nan
    order = {g: i for i, g in enumerate(COMPARISON_GROUPS)}
    return out.sort_values("group", key=lambda s: s.map(order)).reset_index(drop=True)[columns]
