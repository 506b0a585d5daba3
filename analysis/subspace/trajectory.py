"""Recording a fine-tuning trajectory and reading it back (format: see the package docstring)."""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from analysis.io import atomic_save_tensors, atomic_write_json
from analysis.models import LAYER_PARTS
from analysis.words import counted

FORMAT = "tunescope-trajectory"
FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Unit round-off per dtype, used by the singular-value cut-off of `trajectory_svd`.
EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


class TrajectoryError(ValueError):
    """A trajectory folder that is missing, incomplete or not ours."""


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


class TrajectoryRecorder:
    """Snapshot each encoder layer's flattened parameters every ``every`` steps
    (docs/explanation/subspaces.md, "Trajectory").

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
        size = atomic_save_tensors(self.folder / name, tensors)
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
        atomic_write_json(self.folder / "index.json", index)


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
            f"The trajectory in {folder} has {counted(len(snaps), 'snapshot')}; the SVD needs θ_0 "
            "and at least one trained snapshot (train longer or record more often)."
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
        param_dtype=index.get("param_dtype") if index.get("param_dtype") in EPS else "float32",
        every=int(index["every"]),
        family=index.get("family"),
        steps=tuple(int(s["step"]) for s in snaps),
        files=tuple(s["file"] for s in snaps),
        snapshot_bytes=tuple(int(s["bytes"]) for s in snaps),
        slots=slots,
        prefixes=prefixes,
        fingerprint=hashlib.sha256(raw).hexdigest(),
    )


def as_trajectory(source: Trajectory | Path | str) -> Trajectory:
    return source if isinstance(source, Trajectory) else open_trajectory(source)
