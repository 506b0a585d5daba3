"""One layer's row of the layer table (`layer_row`) and of the layer repeats (`resampled_rows`),
as tasks an executor runs, one per layer (`layer_rows`, `analysis.compute.run_all`).

A task receives its layer, not the states: a `StoredLayer` (the cache file's path and where the
layer lies in it, read memory-mapped by whichever process runs the task) or, for states that
are not in a file, that layer's array. Each layer gets the same float64 rows, folds and seed
wherever it is fitted, so the numbers do not depend on the executor (tests/layers/test_rows.py).
This module imports no torch, so a worker that only fits layers starts in the time its numpy,
scipy and scikit-learn imports take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.cache import StoredTensor
from analysis.compute import run_all
from analysis.layers.metrics import (
    ArrayLike,
    Split,
    as_float64,
    as_states,
    cca_score,
    nu,
    rank_metric,
    split_indices,
)
from analysis.layers.probe import ProbeCV, cv_predictions
from analysis.scores import task_score

States = StoredTensor | ArrayLike  # (L+1, N, d): in a cache file, or an array / tensor
Row = tuple[dict[str, float], "ProbeCV | None"]
JACKKNIFE_GROUPS = 20  # delete-a-group jackknife for the repeats' BCa acceleration


def n_states(states: States) -> tuple[int, int, int]:
    """(L+1, N, d) of stored or in-memory states."""
    shape = tuple(states.shape)
    if len(shape) != 3:
        raise ValueError(f"States must have shape (L+1, N, d); got {shape}.")
    return shape  # type: ignore[return-value]


@dataclass(frozen=True)
class StoredLayer:
    """Layer ``layer`` of states stored in a cache file: what a task is sent instead of the
    layer's numbers. The path is absolute (a worker keeps the working folder it started in)."""

    stored: StoredTensor
    layer: int

    def read(self) -> np.ndarray:
        """(N, d) in the stored dtype, memory-mapped read-only."""
        _, n, d = self.stored.shape
        dtype = self.stored.numpy_dtype
        offset = self.stored.offset + self.layer * n * d * dtype.itemsize
        return np.memmap(self.stored.path, dtype=dtype, mode="r", offset=offset, shape=(n, d))


LayerSource = StoredLayer | np.ndarray


def layer_source(states: States, layer: int) -> LayerSource:
    """What a task gets for ``states[layer]``: a `StoredLayer` for states in a file, else the
    layer as a numpy array in its own float dtype (a view where it can be)."""
    if isinstance(states, StoredTensor):
        stored = dataclasses.replace(states, path=Path(states.path).resolve())
        return StoredLayer(stored, layer)
    return as_states(states[layer])


def read_layer(source: LayerSource) -> np.ndarray:
    """(N, d) float32 / float64 states of the layer a task was sent."""
    return source.read() if isinstance(source, StoredLayer) else source


def layer_row(
    layer: int,
    h: np.ndarray,
    classes: np.ndarray,
    raw: np.ndarray,
    split: Split,
    metric: str,
    which: Sequence[str],
    seed: int,
    folds: np.ndarray | None = None,
) -> Row:
    """One layer's metrics and its cross-validated probe; h: (N, d) float64. Metrics not in
    ``which`` are NaN, and so are CCA (too few examples for its dev / test parts) and the probe
    (``folds`` None: some class too small for stratified folds) when the sample is tiny.
    folds: (N,) the probe's outer fold per example (`analysis.layers.probe.outer_folds`, shared
    by every layer). probe_c: the median over the folds of the C the inner CV chose; probe_se:
    the probe score's bootstrap s.e. (`analysis.layers.probe.score_se`)."""
    cca_ok = len(split.dev) >= 2 and len(split.test) >= 2
    row = {
        "layer": layer,
        "nu": nu(h, classes) if "nu" in which else np.nan,
        "cca": cca_score(h, classes, split=split) if "cca" in which and cca_ok else np.nan,
        "rank": rank_metric(h, classes) if "rank" in which else np.nan,
        "probe": np.nan,
        "probe_c": np.nan,
        "probe_se": np.nan,
    }
    probe = None
    if "probe" in which and folds is not None:
        probe = cv_predictions(h, raw, metric, folds, seed=seed)
        row.update(probe=probe.score, probe_c=probe.c, probe_se=probe.se)
    return row, probe


def _row_task(layer: int, source: LayerSource, *arguments) -> Row:
    return layer_row(layer, as_float64(read_layer(source)), *arguments)


def layer_rows(
    states: States,
    arguments: tuple,
    *,
    executor: Executor | None = None,
    done: Callable[[int, int], None] | None = None,
) -> list[Row]:
    """`layer_row` of every layer of ``states`` ((L+1, N, d): stored, numpy or torch), in layer
    order: ``layer_row(layer, states[layer] as float64, *arguments)``, one task per layer on
    ``executor`` (default `analysis.compute.current`); ``done(finished, total)`` as they finish."""
    n_layers, n, d = n_states(states)
    calls = [(layer, layer_source(states, layer), *arguments) for layer in range(n_layers)]
    return run_all(_row_task, calls, executor=executor, work=n_layers * n * d, done=done)


# -- the layer repeats' rows (`analysis.layers.repeats`) -------------------------------------------


def bootstrap_indices(classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A stratified bootstrap resample: for each class, as many draws with replacement from its
    examples as it has examples. classes: (N,) codes 0..C−1; returns (N,) indices, sorted."""
    parts = [
        rng.choice(members, size=len(members), replace=True)
        for members in (np.flatnonzero(classes == y) for y in range(int(classes.max()) + 1))
        if len(members)
    ]
    return np.sort(np.concatenate(parts))


def jackknife_groups(classes: np.ndarray, seed: int, groups: int = JACKKNIFE_GROUPS) -> np.ndarray:
    """(N,) group 0..G−1 of each example for the delete-a-group jackknife: within each class a
    seeded permutation dealt round-robin, so every group keeps the class shares (G = min(groups,
    smallest class count); at least 2)."""
    counts = np.bincount(classes)
    g = max(2, min(groups, int(counts[counts > 0].min())))
    rng = np.random.default_rng([seed, 7919])
    out = np.empty(len(classes), dtype=np.int64)
    offset = 0
    for y in range(len(counts)):
        members = rng.permutation(np.flatnonzero(classes == y))
        out[members] = (np.arange(len(members)) + offset) % g
        offset += len(members)
    return out


@dataclass(frozen=True)
class Resamples:
    """The repeats' draws, as a recipe: ``repeats`` stratified bootstrap resamples seeded with
    (seed, r), then one delete-a-group jackknife subsample per group (``jackknife`` groups at
    most; 0: none). A task makes the draws itself (`draws`) instead of being sent R + G index
    arrays of N each."""

    classes: np.ndarray  # (N,) codes 0..C−1
    seed: int
    repeats: int
    jackknife: int

    @property
    def count(self) -> int:
        """Draws in all: the resamples, then the jackknife groups."""
        if not self.jackknife:
            return self.repeats
        return (
            self.repeats + int(jackknife_groups(self.classes, self.seed, self.jackknife).max()) + 1
        )

    def draws(self) -> list[tuple[np.ndarray, int]]:
        """(rows (N,) or (N − N/G,), CCA split seed) per draw: the resamples, then the groups."""
        out = []
        for r in range(self.repeats):
            rng = np.random.default_rng([self.seed, r])
            rows = bootstrap_indices(self.classes, rng)
            out.append((rows, int(rng.integers(2**31 - 1))))
        if self.jackknife:
            groups = jackknife_groups(self.classes, self.seed, self.jackknife)
            for g in range(int(groups.max()) + 1):
                out.append((np.flatnonzero(groups != g), int(self.seed) + g))
        return out


def split_by_example(
    indices: np.ndarray, classes: np.ndarray, seed: int
) -> tuple[Split, np.ndarray]:
    """The train / dev / test split of a resample's rows, drawn over its distinct examples.

    indices: (N,) the resample (example index per row); classes: (N_total,) codes of every
    example. Returns (split over the rows 0..N−1, groups (N,): which distinct example each row
    copies). Every copy of an example lands in the part its example was drawn into.
    """
    distinct, groups = np.unique(indices, return_inverse=True)
    by_example = split_indices(classes[distinct], seed)
    part = np.zeros(len(distinct), dtype=np.int64)
    part[by_example.dev] = 1
    part[by_example.test] = 2
    row_part = part[groups]
    split = Split(*(np.flatnonzero(row_part == p) for p in range(3)))
    return split, groups


def resampled_row(
    h: np.ndarray,
    rows: np.ndarray,
    classes: np.ndarray,
    raw: np.ndarray,
    predictions: np.ndarray | None,
    metric: str,
    which: Sequence[str],
    split_seed: int,
) -> list[float]:
    """nu, cca, rank, probe of one layer on the rows ``rows`` (a resample, copies allowed, or a
    jackknife subsample); h: (N, d) the layer's states, classes / raw (N,), predictions (N,) the
    probe's out-of-fold predictions (None: no probe). CCA's split is drawn over the distinct
    examples (`split_by_example`)."""
    x = as_float64(h[rows])
    y = classes[rows]
    out = [np.nan] * 4
    if "nu" in which:
        out[0] = nu(x, y)
    if "cca" in which:
        split, _ = split_by_example(rows, classes, split_seed)
        if len(split.dev) >= 2 and len(split.test) >= 2:
            out[1] = cca_score(x, y, split=split)
    if "rank" in which:
        out[2] = rank_metric(x, y)
    if "probe" in which and predictions is not None and np.isfinite(predictions).all():
        out[3] = task_score(metric, raw[rows], predictions[rows].astype(raw.dtype, copy=False))
    return out


def resampled_rows(
    source: LayerSource,
    resamples: Resamples,
    raw: np.ndarray,
    predictions: np.ndarray | None,
    metric: str,
    which: Sequence[str],
) -> np.ndarray:
    """(draws, 4): `resampled_row` of one layer for each of ``resamples``' draws (a task)."""
    h = read_layer(source)
    draws = resamples.draws()
    classes = resamples.classes
    return np.array(
        [
            resampled_row(h, rows, classes, raw, predictions, metric, which, split_seed)
            for rows, split_seed in draws
        ],
        dtype=np.float64,
    ).reshape(len(draws), 4)
