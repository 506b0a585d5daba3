"""Repeats of the layer metrics: how much ν, CCA, ϱ, the probe, ρ, ζ and ℓ* move when the sample
does, and intervals that belong to the values printed beside them
(docs/explanation/statistics.md, "Repeats and bootstrap intervals").

The extraction and the full-sample table (`analysis.layers.table.layer_metrics`) run once; each
repeat r = 1..R draws a **stratified bootstrap resample** of the N cached states (within each class
y, N_y draws with replacement, so class counts stay fixed) and recomputes every layer's metrics on
it. Everything is seeded by (seed, r): the same seed gives the same repeats, and repeat r does not
depend on R.

**What is refit per resample, and what is not.** ν and ϱ are recomputed on the resample's rows,
copies included (that is the bootstrap). CCA is refit on a split of its own drawn over the
resample's *distinct* examples (stratified 80/10/10; every copy goes with its example, so nothing
is scored on a copy of an example it was fit on). The probe is **not** refit: its full-sample score
is the metric over N out-of-fold predictions (`analysis.layers.probe.cv_predictions`), and a
repeat's probe score is the metric over the resampled (prediction, label) pairs, the fitted probes
held fixed. Why: refitting the nested-CV probe on every resample would cost 5 × 3 × 7 fits per layer
per repeat (the whole table's time, R times over); the resampled out-of-fold predictions capture
the variation from which examples are scored, the larger part of a CV score's sampling error at
these N, and leave out the refit's own variation (a resample of the same examples moves the C the
inner CV chooses by one grid step at most on most layers). So the probe's interval is slightly
narrow rather than wide, and ρ(ν, s)'s interval slightly narrow on that side; that cost decision is
stated in the UI beside the intervals.

**The value shown is always the full-sample estimate**, and its interval is a bootstrap interval
around it (`bca_interval`): BCa at level 90 %, the bias correction z₀ from the share of repeats
below the estimate and the acceleration a from a delete-a-group jackknife (G = 20 stratified
groups of examples, each left out once: `jackknife_groups`). When the acceleration cannot be
estimated a = 0 (the bias-corrected percentile interval). When every repeat lies on one side of the
estimate (z₀ infinite), or the corrected interval still misses it, **no interval is shown**: the
bootstrap then says the estimate is strongly biased by resampling (as ζ can be: a resample's copies
make the ν curve rougher), and a verdict resting on it is inconclusive. Intervals need R ≥ 50
repeats (`INTERVAL_REPEATS`; a 5–95 % interval from R = 5 is the range of five values); with fewer,
only bootstrap standard errors (sd of the replicates, ddof = 1) are given, labelled as such. This
holds for the per-layer metrics, ρ(metric, s) and |ρ| for ν, CCA and ϱ, and ζ. ℓ* is given as
counts of repeats per layer ("ℓ* = 4 in 41 of 50 repeats").
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from analysis.cache import DiskCache
from analysis.compute import run_all
from analysis.layers.metrics import (
    DEFAULT_BINS,
    METRICS,
    ArrayLike,
    as_labels,
    bin_scores,
    encode_classes,
    rho,
    zeta,
)
from analysis.layers.rows import (  # noqa: F401  (re-exported: the resamples' pieces)
    JACKKNIFE_GROUPS,
    Resamples,
    States,
    bootstrap_indices,
    jackknife_groups,
    layer_source,
    n_states,
    resampled_row,
    resampled_rows,
    split_by_example,
)
from analysis.layers.streamed import stream_limit_mb, use_streamed
from analysis.layers.table import cached_layer_metrics, finite, layer_metrics, metrics_recipe
from analysis.progress import Progress, no_progress
from analysis.rates import announce, estimate, work_meta

if TYPE_CHECKING:
    from analysis.extract import LayerStates

DEFAULT_REPEATS = 50  # the Layers page's and the claims' default; the CLI's is 1 (no repeats)
INTERVAL_REPEATS = 50  # intervals need at least this many repeats; fewer give s.e. only
LEVEL = 0.9  # the intervals' level
STABLE_SHARE = (4, 5)  # ℓ* is "stable" when one layer wins at least ⌈4/5 · R⌉ repeats
RHO_METRICS = ("nu", "cca", "rank")
# bump when a change here changes the numbers (part of the cache key). 3: the probe's
# out-of-fold predictions resampled, not refit; the jackknife for BCa
REPEATS_VERSION = "3"


def at_least_share(count: int, total: int, share: tuple[int, int] = STABLE_SHARE) -> bool:
    """count ≥ ⌈share · total⌉ in integers (share = numerator, denominator): "k of R ≥ ⌈0.8 R⌉"
    with no float rounding (0.8 · 10 = 8.000000000000002 would otherwise need 9)."""
    num, den = share
    return count * den >= num * total


@dataclass(frozen=True)
class LayerRepeats:
    """The metrics of every layer on the full sample, on each of R bootstrap resamples and on each
    of G jackknife subsamples.

    full: (L+1, 4), values: (R, L+1, 4), jackknife: (G, L+1, 4), columns `METRICS` (nu, cca, rank,
    probe); attrs: task_type, metric, n, seed, repeats, seconds.
    """

    values: np.ndarray
    attrs: dict[str, Any]
    full: np.ndarray | None = None
    jackknife: np.ndarray | None = None
    # What `summarise_repeats` and `intervals` derive, kept with the object: a result the
    # dashboard serves is one object that every session showing it reads (a class on one step).
    _derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _once(self, key: Any, compute: Callable[[], Any]) -> Any:
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    @property
    def n_repeats(self) -> int:
        return int(self.values.shape[0])

    def frame(self, repeat: int) -> pd.DataFrame:
        """Repeat ``repeat``'s table (columns layer, nu, cca, rank, probe)."""
        return _frame(self.values[repeat])

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

    def intervals(self, level: float = LEVEL) -> pd.DataFrame:
        """Per layer and metric the `bca_interval` around the full-sample value: columns layer,
        nu_lo, nu_hi, cca_lo, … (NaN where no interval: fewer than `INTERVAL_REPEATS` repeats, a
        metric left out, or the estimate outside what the bootstrap can correct)."""
        return self._once(("intervals", level), lambda: self._intervals(level)).copy()

    def _intervals(self, level: float) -> pd.DataFrame:
        n_layers = self.values.shape[1]
        out = {"layer": np.arange(n_layers)}
        for j, m in enumerate(METRICS):
            lo, hi = np.full(n_layers, np.nan), np.full(n_layers, np.nan)
            for layer in range(n_layers):
                est = self.estimate(self.full[layer, j], self.values[:, layer, j],
                                    None if self.jackknife is None else self.jackknife[:, layer, j],
                                    level)  # fmt: skip
                lo[layer], hi[layer] = est.lo, est.hi
            out[f"{m}_lo"], out[f"{m}_hi"] = lo, hi
        return pd.DataFrame(out)

    def estimate(
        self, value: float, replicates: np.ndarray, jack: np.ndarray | None, level: float = LEVEL
    ) -> Estimate:
        return estimate_of(value, replicates, jack, level)


def _frame(values: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame(values, columns=list(METRICS))
    df.insert(0, "layer", np.arange(len(df)))
    return df


@contextmanager
def _quiet() -> Iterator[None]:
    """All-NaN layers (a metric left out) make nanstd / nanmean warn; their NaN is the answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def layer_repeats(
    states: States,
    labels: ArrayLike,
    metric: str = "accuracy",
    seed: int = 0,
    repeats: int = DEFAULT_REPEATS,
    which: Sequence[str] = METRICS,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
    table: pd.DataFrame | None = None,
    jackknife: int = JACKKNIFE_GROUPS,
    executor: Executor | None = None,
) -> LayerRepeats:
    """Every metric of every layer on ``repeats`` bootstrap resamples and ``jackknife`` delete-a-
    group subsamples (module docstring).

    states: (L+1, N, d) (numpy, torch or an `analysis.cache.StoredTensor`, float32 kept as is);
    labels: (N,); metric: the task's score (``spearman``: regression, ν / CCA / ϱ on
    `bin_scores`). Repeat r uses the generator seeded with (seed, r) for its resample and CCA's
    split. table: the full-sample
    `analysis.layers.table.layer_metrics` frame of these states with ``seed`` (its values are the
    estimates and its ``probe_predictions`` are resampled); computed when None. ``progress`` is
    told how many layers are done. Each layer is one task of ``executor`` (default
    `analysis.compute.current`), which makes the draws itself from their seeds (`Resamples`).
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"Repeats must be a whole number ≥ 1 (got {repeats!r}).")
    raw = as_labels(labels)
    regression = metric == "spearman"
    classes = bin_scores(raw, n_bins) if regression else encode_classes(raw)[0]
    report = progress or (lambda f, m="": None)
    start = time.perf_counter()
    if table is None:
        table = layer_metrics(states, raw, metric, seed, which, n_bins, executor=executor)
    full = table[list(METRICS)].to_numpy(dtype=np.float64, copy=True)
    full[:, [m not in which for m in METRICS]] = np.nan
    predictions = table.attrs.get("probe_predictions")
    n_layers, n, d = n_states(states)
    resamples = Resamples(classes, seed, repeats, jackknife)
    n_draws = resamples.count
    calls = [
        (layer_source(states, layer), resamples, raw,
         None if predictions is None else np.asarray(predictions[layer]), metric, which)
        for layer in range(n_layers)
    ]  # fmt: skip
    report(0.0, f"{repeats} repeats of {n_layers} layers")
    per_layer = run_all(
        resampled_rows, calls, executor=executor, work=n_layers * n * d,
        done=lambda finished, total: report(
            finished / total, f"{repeats} repeats: {finished} of {total} layers done"
        ),
    )  # fmt: skip
    out = np.stack(per_layer, axis=1)  # (draws, L+1, 4)
    report(1.0, f"{repeats} repeats done")
    return LayerRepeats(
        values=out[:repeats],
        attrs={
            "task_type": "regression" if regression else "classification",
            "metric": metric,
            "n": len(raw),
            "seed": seed,
            "repeats": repeats,
            "jackknife_groups": n_draws - repeats,
            "which": list(which),
            "seconds": time.perf_counter() - start,
        },
        full=full,
        jackknife=out[repeats:] if jackknife else None,
    )


def repeats_recipe(
    layer_states: LayerStates,
    seed: int,
    repeats: int,
    n_bins: int = DEFAULT_BINS,
    which: Sequence[str] = METRICS,
) -> dict[str, Any]:
    """What decides the repeats: the single table's recipe, R and how resamples are drawn."""
    return {
        **metrics_recipe(layer_states, seed, n_bins),
        "repeats": repeats,
        "which": list(which),
        "resample": "stratified bootstrap; CCA split by distinct example; probe predictions kept",
        "jackknife_groups": JACKKNIFE_GROUPS,
        "repeats_version": REPEATS_VERSION,
    }


def cached_layer_repeats(
    layer_states: LayerStates,
    seed: int = 0,
    repeats: int = DEFAULT_REPEATS,
    n_bins: int = DEFAULT_BINS,
    cache: DiskCache | None = None,
    progress: Progress | None = None,
    which: Sequence[str] = METRICS,
    executor: Executor | None = None,
) -> tuple[LayerRepeats, bool]:
    """`layer_repeats` of one extraction (analysis.extract.LayerStates), served from the disk
    cache when already computed (keyed by `repeats_recipe`). Returns (repeats, hit). The
    single table (the estimates and the probe's out-of-fold predictions) comes from its own
    cache entry, computed if missing — unless ``which`` leaves out the probe (then only the
    cheap metrics asked are computed, in memory). Each layer is one task of ``executor``
    (default `analysis.compute.current`), reading its layer from the cache file.

    Repeats are computed in memory only: on states large enough for the streamed table
    (`analysis.layers.streamed.use_streamed`) a clear ValueError says so. Why not stream them: a
    bootstrap resample must keep every copy of an example on one side of CCA's split, and the
    streamed route splits over positions; and the streamed probe predicts a capped subsample,
    so its bands would not be around the same estimator.
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
        if "probe" in which:
            table, _ = cached_layer_metrics(layer_states, seed, n_bins, cache, executor=executor)
        else:
            table = None
        source = layer_states.stored if layer_states.stored is not None else layer_states.states
        work = repeats * math.prod(layer_states.states.shape)  # R × (L+1) × N × d
        told = announce(progress or no_progress, estimate("layer_repeats", work, cache.root, "cpu"),
                        f"{repeats} bootstrap repeats")  # fmt: skip
        rep = layer_repeats(
            source, layer_states.labels, layer_states.metric, seed, repeats, which, n_bins,
            told, table=table, executor=executor,
        )  # fmt: skip
        tensors = {"values": torch.tensor(rep.values), "full": torch.tensor(rep.full)}
        if rep.jackknife is not None:
            tensors["jackknife"] = torch.tensor(rep.jackknife)
        return tensors, {
            **rep.attrs,
            **work_meta("layer_repeats", work, rep.attrs["seconds"], "cpu"),
        }

    recipe = repeats_recipe(layer_states, seed, repeats, n_bins, which)
    tensors, meta, hit = cache.get_or_compute("layer_repeats", recipe, compute)
    return LayerRepeats(
        values=tensors["values"].numpy(), attrs=dict(meta), full=tensors["full"].numpy(),
        jackknife=tensors["jackknife"].numpy() if "jackknife" in tensors else None,
    ), hit  # fmt: skip


# -- intervals around the estimate ---------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A full-sample value with its bootstrap s.e. and (when R ≥ `INTERVAL_REPEATS` and the
    bootstrap can centre one on it) its interval [lo, hi] at ``level``; ``method`` "BCa" or
    "BC" (acceleration 0), "" without an interval, and ``note`` why not."""

    value: float
    se: float
    lo: float = math.nan
    hi: float = math.nan
    method: str = ""
    note: str = ""
    repeats: int = 0
    level: float = LEVEL

    @property
    def interval(self) -> tuple[float, float] | None:
        if math.isfinite(self.lo) and math.isfinite(self.hi):
            return self.lo, self.hi
        return None

    def text(self, digits: int = 2, signed: bool = True) -> str:
        """ "−0.72 [−0.85, −0.51] (90 % BCa, R = 50)", "−0.72 ± 0.10 s.e. (R = 5)", or the
        value alone without repeats."""
        f = f"{{:{'+' if signed else ''}.{digits}f}}"
        if not math.isfinite(self.value):
            return "undefined"
        shown = f.format(self.value)
        if self.interval is not None:
            lo, hi = self.interval
            return (f"{shown} [{f.format(lo)}, {f.format(hi)}] ({self.level:.0%} {self.method}, "
                    f"R = {self.repeats})")  # fmt: skip
        if math.isfinite(self.se):
            why = f"; no interval: {self.note}" if self.note else ""
            return f"{shown} ± {self.se:.{digits}f} s.e. (R = {self.repeats}{why})"
        return shown

    def to_dict(self) -> dict[str, Any]:
        """{"estimate", "se", "interval": [lo, hi] | null, "method", "level", "repeats", "note"}."""
        return {
            "estimate": finite(float(self.value)),
            "se": finite(float(self.se)),
            "interval": None if self.interval is None else [self.lo, self.hi],
            "method": self.method or None,
            "level": self.level,
            "repeats": self.repeats,
            "note": self.note,
        }


def estimate_of(
    value: float,
    replicates: np.ndarray,
    jackknife: np.ndarray | None = None,
    level: float = LEVEL,
    min_repeats: int = INTERVAL_REPEATS,
) -> Estimate:
    """The `Estimate` of ``value`` from its bootstrap ``replicates`` (R,) and, for BCa's
    acceleration, its delete-a-group ``jackknife`` values (G,)."""
    reps = np.asarray(replicates, dtype=np.float64)
    ok = reps[np.isfinite(reps)]
    se = float(np.std(ok, ddof=1)) if ok.size >= 2 else math.nan
    base = {"value": float(value), "se": se, "repeats": int(reps.size), "level": level}
    if not math.isfinite(value):
        return Estimate(**base)
    if reps.size < min_repeats:
        return Estimate(**base, note=f"intervals need R ≥ {min_repeats}")
    lo, hi, method, note = bca_interval(value, ok, jackknife, level)
    return Estimate(**base, lo=lo, hi=hi, method=method, note=note)


def bca_interval(
    value: float, replicates: np.ndarray, jackknife: np.ndarray | None = None,
    level: float = LEVEL,
) -> tuple[float, float, str, str]:  # fmt: skip
    """The BCa interval (Efron 1987) of ``value`` at ``level`` from bootstrap ``replicates`` (R,).

    z₀ = Φ⁻¹(share of replicates below the value, ties counted half); the acceleration
    a = Σ(θ̄ − θ_(g))³ / (6 (Σ(θ̄ − θ_(g))²)^{3/2}) from the jackknife values θ_(g) (a = 0 without
    them: "BC"); the ends are the replicates' quantiles at Φ(z₀ + (z₀ + z_α)/(1 − a (z₀ + z_α)))
    for z_α = ±Φ⁻¹((1 + level)/2). Returns (lo, hi, method, note); (NaN, NaN, "", why) when z₀
    is infinite (every replicate on one side of the value) or the interval does not contain the
    value: the bootstrap cannot put an interval around it.
    """
    from scipy.special import ndtr, ndtri

    reps = np.asarray(replicates, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    if reps.size < 2:
        return math.nan, math.nan, "", "too few finite repeats"
    below = float(np.sum(reps < value)) + 0.5 * float(np.sum(reps == value))
    share = below / reps.size
    if share <= 0.0 or share >= 1.0:
        side = "above" if share <= 0.0 else "below"
        return (math.nan, math.nan, "",
                f"every repeat lies {side} the estimate (biased by resampling)")  # fmt: skip
    z0 = float(ndtri(share))
    accel, method = 0.0, "BC"
    if jackknife is not None:
        jack = np.asarray(jackknife, dtype=np.float64)
        jack = jack[np.isfinite(jack)]
        if jack.size >= 3:
            dev = jack.mean() - jack
            denom = 6.0 * float(np.sum(dev**2)) ** 1.5
            if denom > 0:
                accel, method = float(np.sum(dev**3)) / denom, "BCa"
    z = float(ndtri((1.0 + level) / 2.0))
    ends = []
    for za in (-z, z):
        shifted = z0 + za
        ends.append(float(ndtr(z0 + shifted / (1.0 - accel * shifted))))
    lo, hi = (float(np.quantile(reps, q)) for q in ends)
    if not lo <= value <= hi:
        return (math.nan, math.nan, "",
                f"the estimate lies in its bootstrap distribution's tail (z₀ = {z0:+.2f})")  # fmt: skip
    return lo, hi, method, ""


# -- what the repeats say ------------------------------------------------------------------------


def curve_summary(values: np.ndarray) -> dict[str, Any]:
    """ℓ* (argmin ν over ℓ = 1..L; None when undefined), ζ of the ν curve and ρ(metric, probe) for
    nu, cca, rank of one (L+1, 4) table in `METRICS` order."""
    body = values[1:]
    nu_curve = body[:, 0]
    finite_nu = np.isfinite(nu_curve)
    l_star = (
        int(np.flatnonzero(finite_nu)[np.argmin(nu_curve[finite_nu])]) + 1
        if finite_nu.any()
        else None
    )
    return {
        "l_star": l_star,
        "zeta": zeta(nu_curve),
        "rho": {m: rho(body[:, j], body[:, 3]) for j, m in enumerate(RHO_METRICS)},
    }


@dataclass(frozen=True)
class RepeatSummary:
    """ρ, |ρ|, ζ and ℓ* of the full sample, with their bootstrap s.e. and intervals.

    rho / abs_rho: metric → `Estimate`; zeta: `Estimate`; rho_replicates: metric → (R,);
    zeta_replicates (R,); l_star: the full-sample ℓ*; l_star_replicates (R,) (0 = undefined);
    l_star_counts: layer → number of repeats choosing it; n: examples.
    """

    repeats: int
    rho: dict[str, Estimate]
    abs_rho: dict[str, Estimate]
    zeta: Estimate
    rho_replicates: dict[str, np.ndarray]
    zeta_replicates: np.ndarray
    l_star: int | None
    l_star_replicates: np.ndarray
    l_star_counts: dict[int, int]
    n: int = 0

    @property
    def modal_l_star(self) -> int | None:
        """The layer most repeats pick (the lower on ties), None when no repeat has an ℓ*."""
        if not self.l_star_counts:
            return None
        return max(sorted(self.l_star_counts), key=self.l_star_counts.get)

    @property
    def stable(self) -> bool:
        """One layer is ℓ* in at least ⌈0.8 R⌉ of the repeats."""
        return bool(self.l_star_counts) and at_least_share(
            max(self.l_star_counts.values()), self.repeats
        )

    def l_star_sentence(self) -> str:
        """ "ℓ* = 4 in 41 of 50 repeats (3 in 6, 5 in 3)": the modal layer, then the others."""
        if self.modal_l_star is None:
            return "ℓ* is undefined in every repeat"
        others = [
            f"{layer} in {count}"
            for layer, count in sorted(self.l_star_counts.items())
            if layer != self.modal_l_star
        ]
        tail = f" ({', '.join(others)})" if others else ""
        count = self.l_star_counts[self.modal_l_star]
        return f"ℓ* = {self.modal_l_star} in {count} of {self.repeats} repeats{tail}"


def summarise_repeats(rep: LayerRepeats, level: float = LEVEL) -> RepeatSummary:
    """ρ, |ρ| and ζ of the full sample with their intervals (`estimate_of`), ℓ* counts; computed
    once per `LayerRepeats` and level."""
    return rep._once(("summary", level), lambda: _summarise(rep, level))


def _summarise(rep: LayerRepeats, level: float) -> RepeatSummary:
    full = rep.full if rep.full is not None else np.full(rep.values.shape[1:], np.nan)
    est = curve_summary(full)
    per = [curve_summary(rep.values[r]) for r in range(rep.n_repeats)]
    jack = (
        [curve_summary(rep.jackknife[g]) for g in range(len(rep.jackknife))]
        if rep.jackknife is not None
        else None
    )
    rho_reps = {m: np.array([s["rho"][m] for s in per], dtype=float) for m in RHO_METRICS}
    rho_est, abs_est = {}, {}
    for m in RHO_METRICS:
        j = None if jack is None else np.array([s["rho"][m] for s in jack], dtype=float)
        rho_est[m] = estimate_of(est["rho"][m], rho_reps[m], j, level)
        abs_est[m] = estimate_of(abs(est["rho"][m]), np.abs(rho_reps[m]),
                                 None if j is None else np.abs(j), level)  # fmt: skip
    zeta_reps = np.array([s["zeta"] for s in per], dtype=float)
    zeta_jack = None if jack is None else np.array([s["zeta"] for s in jack], dtype=float)
    l_star = np.array([s["l_star"] or 0 for s in per], dtype=int)
    layers, counts = np.unique(l_star[l_star > 0], return_counts=True)
    return RepeatSummary(
        repeats=rep.n_repeats,
        rho=rho_est,
        abs_rho=abs_est,
        zeta=estimate_of(est["zeta"], zeta_reps, zeta_jack, level),
        rho_replicates=rho_reps,
        zeta_replicates=zeta_reps,
        l_star=est["l_star"],
        l_star_replicates=l_star,
        l_star_counts={int(a): int(c) for a, c in zip(layers, counts, strict=True)},
        n=int(rep.attrs.get("n", 0)),
    )


def difference_estimate(
    a: LayerRepeats, b: LayerRepeats, stat: str = "zeta", level: float = LEVEL
) -> Estimate:
    """stat(a) − stat(b) (stat "zeta") on the same resamples of the same examples (two poolings
    of one sample: the repeats and jackknife groups are drawn from the same seed and labels),
    with its interval (`estimate_of`)."""

    def values(rep: LayerRepeats) -> tuple[float, np.ndarray, np.ndarray | None]:
        full = curve_summary(rep.full)[stat]
        reps = np.array([curve_summary(v)[stat] for v in rep.values], dtype=float)
        jack = (
            None
            if rep.jackknife is None
            else np.array([curve_summary(v)[stat] for v in rep.jackknife], dtype=float)
        )
        return full, reps, jack

    fa, ra, ja = values(a)
    fb, rb, jb = values(b)
    if ra.shape != rb.shape:
        raise ValueError("The two repeats differ in R: they are not the same resamples.")
    jack = None if ja is None or jb is None or ja.shape != jb.shape else ja - jb
    return estimate_of(fa - fb, ra - rb, jack, level)


def add_repeats(result: dict[str, Any], rep: LayerRepeats) -> dict[str, Any]:
    """The layers JSON (`analysis.layers.table.report`) with the repeats added. Per layer:
    nu_se, cca_se, rank_se, probe_se and, with R ≥ 50, nu_lo, nu_hi, … (the 90 % interval around
    the value). Top level: ``rho``, ``abs_rho`` (metric → `Estimate.to_dict`), ``zeta`` (one
    `Estimate.to_dict`) and ``l_star`` {"estimate": ℓ*, "counts": {"4": 41, …}, "repeats": R,
    "stable": …} replace the bare numbers; repeats, repeats_seconds. One repeat adds nothing: the
    JSON stays the single table's."""
    if rep.n_repeats < 2:
        return result
    summ = summarise_repeats(rep)
    se = rep.standard_errors().set_index("layer")
    bounds = rep.intervals().set_index("layer")
    layers = [
        {**row, **{c: finite(float(se.loc[row["layer"], c])) for c in se.columns},
         **{c: finite(float(bounds.loc[row["layer"], c])) for c in bounds.columns}}
        for row in result["layers"]
    ]  # fmt: skip
    return {
        **result,
        "layers": layers,
        "repeats": rep.n_repeats,
        "rho": {m: e.to_dict() for m, e in summ.rho.items()},
        "abs_rho": {m: e.to_dict() for m, e in summ.abs_rho.items()},
        "zeta": summ.zeta.to_dict(),
        "l_star": {
            "estimate": summ.l_star,
            "counts": {str(layer): c for layer, c in summ.l_star_counts.items()},
            "repeats": summ.repeats,
            "stable": summ.stable,
            "sentence": summ.l_star_sentence(),
        },
        "repeats_seconds": rep.attrs.get("seconds"),
    }


# -- verdicts the repeats support (used by the Layers page and the claims) ----------------------

RHO_STRONG = -0.85  # the paper's figure (000, Table 1)
RHO_WEAK = -0.5


def rho_verdict(estimate: Estimate) -> str:
    """Does ν track the probe? Claim X1 on one sample (docs/explanation/claims.md, "The claims and
    their rules"): "holds" when the interval's upper end is ≤ −0.5 and the full-sample ρ(ν, s)
    ≤ −0.85; "holds weakly" with only the first; "does not hold" when the interval lies above
    −0.5; else (or without an interval) "inconclusive"."""
    if estimate.interval is None:
        return "inconclusive"
    lo, hi = estimate.interval
    if hi <= RHO_WEAK:
        return "holds" if estimate.value <= RHO_STRONG else "holds weakly"
    if lo > RHO_WEAK:
        return "does not hold"
    return "inconclusive"


def mid_network_verdict(counts: dict[int, int], repeats: int, n_layers: int) -> str:
    """Is ℓ* mid-network? (claim X2, one sample) "holds" when the repeats choosing some
    1 < ℓ < L number ≥ ⌈0.8 R⌉; "does not hold" when those choosing 1 or L do; else
    "inconclusive". Counts, not shares."""
    middle = sum(c for layer, c in counts.items() if 1 < layer < n_layers)
    edges = sum(c for layer, c in counts.items() if layer in (1, n_layers))
    if at_least_share(middle, repeats):
        return "holds"
    return "does not hold" if at_least_share(edges, repeats) else "inconclusive"


def smoothness_verdict(difference: Estimate) -> str:
    """Are first-token curves less smooth? (claim X3, one sample) "holds" when the interval of
    ζ(first) − ζ(mean) lies above 0, "does not hold" below 0, else (or without an interval)
    "inconclusive"."""
    if difference.interval is None:
        return "inconclusive"
    lo, hi = difference.interval
    return "holds" if lo > 0 else "does not hold" if hi < 0 else "inconclusive"
