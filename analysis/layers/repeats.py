"""Repeats of the layer metrics: how much ν, CCA, ϱ, the probe, ρ and ℓ* move when the sample does
(SPEC.md, "Numbers a researcher can quote": Repeats).

The extraction runs once; each repeat r = 1..R draws a **stratified bootstrap resample** of the N
cached states (within each class y, N_y draws with replacement, so class counts stay fixed) and
recomputes every layer's metrics on it with a split of its own. Everything is seeded by
(seed, r): the same seed gives the same repeats, and repeat r does not depend on R.

**How copies are split.** A bootstrap resample holds about 63 % of the distinct examples, many
of them several times. If one copy of an example fell in the train part and another in the test
part, CCA and the probe would be scored partly on examples they were fit on. So the split is
drawn over the *distinct* examples (stratified 80/10/10, as in the single table) and every copy
goes with its example; the probe's cross-validation folds split the distinct examples too
(`analysis.layers.probe.fit_probe`'s ``groups``). ν and ϱ use the whole resample, copies
included: that is the bootstrap.

**The probe's C in a repeat** is chosen again by cross-validation, among the full-sample table's
choice C* for that layer and its neighbours in the grid (C*/10, C*, 10 C*), not the whole grid:
the choice still moves with the sample, and the repeats cost about a third of a table each
instead of the whole table (the large-C fits of the full grid are 85 % of a table's time on
MiniLM, N = 2,000). Without the table's C* (``probe_c=None``) the whole grid is searched.

Per layer we report the full-sample value (the single table) with the **bootstrap standard
error**: the standard deviation (ddof = 1) of the R replicates. The centre is the full-sample value,
not the replicates' mean that SPEC.md's "mean ± s.e." could be read as: a resample holds copies of
its examples, which shrink the within-class scatter, so the replicates' mean of ν (and of ϱ, a
ratio of second moments) is biased; the full-sample value is the estimate, the replicates give its
spread. ρ(metric, s) is computed on each
repeat and quoted as the mean over repeats with the 5th–95th percentile interval; ℓ* as the share
of repeats that pick each layer, "stable" when one layer gets at least 80 %.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from analysis.cache import DiskCache
from analysis.layers.metrics import (
    DEFAULT_BINS,
    METRICS,
    ArrayLike,
    Split,
    as_float64,
    as_labels,
    bin_scores,
    encode_classes,
    split_indices,
)
from analysis.layers.probe import PROBE_GRID
from analysis.layers.streamed import stream_limit_mb, use_streamed
from analysis.layers.table import (
    COLUMNS,
    blas_threads,
    cached_layer_metrics,
    finite,
    layer_row,
    metrics_recipe,
    summary,
)
from analysis.progress import Progress

if TYPE_CHECKING:
    from analysis.extract import LayerStates

DEFAULT_REPEATS = 5  # the Layers page's default; the CLI's is 1 (no repeats)
STABLE_SHARE = 0.8  # ℓ* is "stable" when one layer wins at least this share of repeats
INTERVAL = (5.0, 95.0)  # percentiles of ρ over repeats
RHO_METRICS = ("nu", "cca", "rank")
REPEATS_VERSION = "2"  # 2: the probe's C among the table's choice and its neighbours  # bump when a change here changes the numbers (part of the cache key)


def bootstrap_indices(classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A stratified bootstrap resample: for each class, as many draws with replacement from its
    examples as it has examples. classes: (N,) codes 0..C−1; returns (N,) indices, sorted."""
    parts = [
        rng.choice(members, size=len(members), replace=True)
        for members in (np.flatnonzero(classes == y) for y in range(int(classes.max()) + 1))
        if len(members)
    ]
    return np.sort(np.concatenate(parts))


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


@dataclass(frozen=True)
class LayerRepeats:
    """The metrics of every layer on each of R bootstrap resamples.

    values: (R, L+1, 5), columns `analysis.layers.table.COLUMNS` (nu, cca, rank, probe,
    probe_c); attrs: task_type, metric, n, seed, repeats, seconds.
    """

    values: np.ndarray
    attrs: dict[str, Any]

    @property
    def n_repeats(self) -> int:
        return int(self.values.shape[0])

    def frame(self, repeat: int) -> pd.DataFrame:
        """Repeat ``repeat``'s table, like `analysis.layers.table.layer_metrics`'s."""
        df = pd.DataFrame(self.values[repeat], columns=list(COLUMNS))
        df.insert(0, "layer", np.arange(len(df)))
        return df

    def summaries(self) -> list[dict[str, Any]]:
        """ℓ*, ζ and ρ of each repeat (`analysis.layers.table.summary`)."""
        return [summary(self.frame(r)) for r in range(self.n_repeats)]

    def standard_errors(self) -> pd.DataFrame:
        """Per layer: the bootstrap standard error (sd over repeats, ddof = 1) of nu, cca, rank
        and probe, as columns nu_se…; NaN with fewer than 2 repeats."""
        with _quiet():
            se = np.nanstd(self.values[:, :, :4], axis=0, ddof=1)  # (L+1, 4)
        if self.n_repeats < 2:
            se[:] = np.nan
        df = pd.DataFrame(se, columns=[f"{m}_se" for m in METRICS])
        df.insert(0, "layer", np.arange(len(df)))
        return df


@contextmanager
def _quiet() -> Iterator[None]:
    """All-NaN layers (a metric left out) make nanstd / nanmean warn; their NaN is the answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def layer_repeats(
    states: ArrayLike,
    labels: ArrayLike,
    metric: str = "accuracy",
    seed: int = 0,
    repeats: int = DEFAULT_REPEATS,
    which: Sequence[str] = METRICS,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
    probe_c: Sequence[float] | None = None,
) -> LayerRepeats:
    """Every metric of every layer on ``repeats`` bootstrap resamples (module docstring).

    states: (L+1, N, d) (numpy or torch, float32 kept as is); labels: (N,); metric: the task's
    score (``spearman``: regression, ν / CCA / ϱ on `bin_scores`). Repeat r uses the generator
    seeded with (seed, r) for its resample, its split and its probes' folds. ``progress`` is told
    the repeat and the layer. probe_c: (L+1,) the full-sample table's C per layer: each repeat's
    probe chooses among it and its grid neighbours (`neighbour_grid`).
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"Repeats must be a whole number ≥ 1 (got {repeats!r}).")
    raw = as_labels(labels)
    regression = metric == "spearman"
    classes = bin_scores(raw, n_bins) if regression else encode_classes(raw)[0]
    report = progress or (lambda f, m="": None)
    n_layers = len(states)
    values = np.full((repeats, n_layers, len(COLUMNS)), np.nan)
    start = time.perf_counter()
    with blas_threads():
        for r in range(repeats):
            rng = np.random.default_rng([seed, r])
            rows = bootstrap_indices(classes, rng)
            split_seed = int(rng.integers(2**31 - 1))
            split, groups = split_by_example(rows, classes, split_seed)
            picked = torch.as_tensor(rows) if isinstance(states, torch.Tensor) else rows
            for layer in range(n_layers):
                report(
                    (r + layer / n_layers) / repeats,
                    f"repeat {r + 1} of {repeats}: layer {layer} of {n_layers - 1}",
                )
                h = as_float64(states[layer][picked])
                grid = neighbour_grid(None if probe_c is None else probe_c[layer])
                row = layer_row(layer, h, classes[rows], raw[rows], split, metric, which,
                                split_seed, groups, grid)  # fmt: skip
                values[r, layer] = [row[c] for c in COLUMNS]
    report(1.0, f"{repeats} repeats done")
    return LayerRepeats(
        values=values,
        attrs={
            "task_type": "regression" if regression else "classification",
            "metric": metric,
            "n": len(raw),
            "seed": seed,
            "repeats": repeats,
            "seconds": time.perf_counter() - start,
        },
    )


def neighbour_grid(c: float | None) -> tuple[float, ...]:
    """C and its neighbours in the probe's grid (the whole grid when C is unknown or off it)."""
    if c is None or not math.isfinite(c) or c not in PROBE_GRID:
        return PROBE_GRID
    i = PROBE_GRID.index(c)
    return PROBE_GRID[max(0, i - 1) : i + 2]


def repeats_recipe(
    layer_states: LayerStates, seed: int, repeats: int, n_bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """What decides the repeats: the single table's recipe, R and how resamples are drawn."""
    return {
        **metrics_recipe(layer_states, seed, n_bins),
        "repeats": repeats,
        "resample": "stratified bootstrap; split and CV folds by distinct example",
        "probe_grid": "the table's C and its grid neighbours",
        "repeats_version": REPEATS_VERSION,
    }


def cached_layer_repeats(
    layer_states: LayerStates,
    seed: int = 0,
    repeats: int = DEFAULT_REPEATS,
    n_bins: int = DEFAULT_BINS,
    cache: DiskCache | None = None,
    progress: Progress | None = None,
) -> tuple[LayerRepeats, bool]:
    """`layer_repeats` of one extraction (analysis.extract.LayerStates), served from the disk
    cache when already computed (keyed by `repeats_recipe`). Returns (repeats, hit). The
    single table (for the probe's C per layer) comes from its own cache entry, computed if
    missing.

    Repeats are computed in memory only: on states large enough for the streamed table
    (`analysis.layers.streamed.use_streamed`) a clear ValueError says so. Why not stream them: a
    bootstrap resample must keep every copy of an example on one side of the train / held-out
    split, and the streamed route splits over positions; and the streamed probe fits a capped
    subsample, so its bands would not be around the same estimator.
    """
    cache = cache or DiskCache()
    if use_streamed(layer_states.n, layer_states.d_model):
        limit = stream_limit_mb()
        largest = int(limit * 2**20 // (8 * layer_states.d_model))
        raise ValueError(
            f"Bootstrap repeats are computed in memory, and one layer of these states (N = "
            f"{layer_states.n:,}, d = {layer_states.d_model}) is "
            f"{layer_states.n * layer_states.d_model * 8 / 2**20:,.0f} MB in float64, above the "
            f"{limit:,.0f} MB where the table of metrics streams (TUNESCOPE_STREAM_METRICS_MB). "
            f"Use R = 1 (the single table), or a sample of N ≤ {largest:,} for intervals."
        )

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        table, _ = cached_layer_metrics(layer_states, seed, n_bins, cache)
        rep = layer_repeats(
            layer_states.states, layer_states.labels, layer_states.metric, seed, repeats,
            METRICS, n_bins, progress, probe_c=table["probe_c"].tolist(),
        )  # fmt: skip
        return {"values": torch.tensor(rep.values)}, rep.attrs

    recipe = repeats_recipe(layer_states, seed, repeats, n_bins)
    tensors, meta, hit = cache.get_or_compute("layer_repeats", recipe, compute)
    return LayerRepeats(values=tensors["values"].numpy(), attrs=dict(meta)), hit


# -- what the repeats say ------------------------------------------------------------------------


@dataclass(frozen=True)
class RepeatSummary:
    """ρ, ℓ* and ζ over the repeats.

    rho: metric → (R,) ρ(metric, s) per repeat; rho_mean / rho_interval: the mean and the 5th–95th
    percentiles (NaN when no repeat has a finite ρ); l_star: (R,) ℓ* per repeat (0 = undefined);
    l_star_share: layer → share of repeats, by layer; zeta: (R,) ζ of each repeat's ν curve.
    """

    repeats: int
    rho: dict[str, np.ndarray]
    rho_mean: dict[str, float]
    rho_interval: dict[str, tuple[float, float]]
    l_star: np.ndarray
    l_star_share: dict[int, float]
    zeta: np.ndarray

    @property
    def modal_l_star(self) -> int | None:
        """The layer most repeats pick (the lower on ties), None when no repeat has an ℓ*."""
        if not self.l_star_share:
            return None
        return max(sorted(self.l_star_share), key=self.l_star_share.get)

    @property
    def stable(self) -> bool:
        """One layer is ℓ* in at least 80 % of the repeats."""
        return bool(self.l_star_share) and max(self.l_star_share.values()) >= STABLE_SHARE

    def l_star_sentence(self) -> str:
        """ "ℓ* = 4 in 5 of 5 repeats" (the modal layer), plus the runners-up."""
        if self.modal_l_star is None:
            return "ℓ* is undefined in every repeat"
        count = round(self.l_star_share[self.modal_l_star] * self.repeats)
        others = [
            f"{layer} in {round(share * self.repeats)}"
            for layer, share in sorted(self.l_star_share.items())
            if layer != self.modal_l_star
        ]
        tail = f" ({', '.join(others)})" if others else ""
        return f"ℓ* = {self.modal_l_star} in {count} of {self.repeats} repeats{tail}"


def summarise_repeats(rep: LayerRepeats) -> RepeatSummary:
    """ρ per repeat with its mean and 5th–95th percentile interval, ℓ* shares, ζ per repeat."""
    per = rep.summaries()
    rho = {m: np.array([s["rho"][m] for s in per], dtype=float) for m in RHO_METRICS}
    rho_mean, rho_interval = {}, {}
    for m, values in rho.items():
        ok = values[np.isfinite(values)]
        rho_mean[m] = float(ok.mean()) if ok.size else math.nan
        rho_interval[m] = (
            tuple(float(x) for x in np.percentile(ok, INTERVAL)) if ok.size else (math.nan,) * 2
        )
    l_star = np.array([s["l_star"] or 0 for s in per], dtype=int)
    picked = l_star[l_star > 0]
    layers, counts = np.unique(picked, return_counts=True)
    shares = {int(layer): float(c) / len(l_star) for layer, c in zip(layers, counts, strict=True)}
    zeta = np.array([s["zeta"] for s in per], dtype=float)
    return RepeatSummary(rep.n_repeats, rho, rho_mean, rho_interval, l_star, shares, zeta)


def add_repeats(result: dict[str, Any], rep: LayerRepeats) -> dict[str, Any]:
    """The layers JSON (`analysis.layers.table.report`) with the repeats added: per layer
    nu_se, cca_se, rank_se, probe_se; top level repeats, rho_mean, rho_interval {nu, cca, rank:
    [lo, hi]}, l_star_share {"4": 0.8, …}, l_star_stable, zeta_repeats. One repeat adds nothing:
    the JSON stays the single table's."""
    if rep.n_repeats < 2:
        return result
    summ = summarise_repeats(rep)
    se = rep.standard_errors().set_index("layer")
    layers = [
        {**row, **{c: finite(float(se.loc[row["layer"], c])) for c in se.columns}}
        for row in result["layers"]
    ]
    return {
        **result,
        "layers": layers,
        "repeats": rep.n_repeats,
        "rho_mean": {m: finite(v) for m, v in summ.rho_mean.items()},
        "rho_interval": {m: [finite(lo), finite(hi)] for m, (lo, hi) in summ.rho_interval.items()},
        "l_star_share": {str(layer): share for layer, share in summ.l_star_share.items()},
        "l_star_stable": summ.stable,
        "zeta_repeats": [finite(float(z)) for z in summ.zeta],
        "repeats_seconds": rep.attrs.get("seconds"),
    }


# -- verdicts the repeats support (used by the Layers page and the claims) ----------------------

RHO_STRONG = -0.85  # the paper's figure (000, Table 1)
RHO_WEAK = -0.5


def rho_verdict(mean: float, interval: tuple[float, float]) -> str:
    """Does ν track the probe? (SPEC.md, claim X1) "holds" when the 95th percentile of ρ(ν, s) is
    ≤ −0.5 and its mean ≤ −0.85; "holds weakly" with only the first; "does not hold" when even the
    5th percentile is above −0.5; else "inconclusive" (the interval covers both)."""
    lo, hi = interval
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if hi <= RHO_WEAK:
        return "holds" if mean <= RHO_STRONG else "holds weakly"
    if lo > RHO_WEAK:
        return "does not hold"
    return "inconclusive"


def mid_network_verdict(shares: dict[int, float], n_layers: int) -> str:
    """Is ℓ* mid-network? (claim X2) "holds" when a layer 1 < ℓ < L gets ≥ 80 % of the repeats;
    "does not hold" when the edge layers (1 and L) get ≥ 80 % together; else "inconclusive"."""
    if any(1 < layer < n_layers and share >= STABLE_SHARE for layer, share in shares.items()):
        return "holds"
    edges = sum(share for layer, share in shares.items() if layer in (1, n_layers))
    return "does not hold" if edges >= STABLE_SHARE else "inconclusive"
