"""Every metric for every layer of one extraction, ℓ* and its summary, disk-cached, as JSON."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from analysis import strategies as gen
from analysis.cache import DiskCache
from analysis.config import ExtractConfig, to_dict
from analysis.layers.metrics import (
    CCA_GRID,
    DEFAULT_BINS,
    METRICS,
    ArrayLike,
    as_labels,
    bin_scores,
    encode_classes,
    rho,
    split_indices,
    zeta,
)
from analysis.layers.probe import CV_FOLDS, OUTER_FOLDS, PROBE_GRID, outer_folds
from analysis.layers.rows import States, layer_rows, n_states
from analysis.layers.streamed import route_recipe, streamed_metrics_of
from analysis.progress import Progress, no_progress
from analysis.rates import announce, estimate, work_meta

if TYPE_CHECKING:
    from analysis.extract import LayerStates

COLUMNS = (*METRICS, "probe_c", "probe_se")  # a metrics frame's columns after ``layer``


def layer_metrics(
    states: States,
    labels: ArrayLike,
    metric: str = "accuracy",
    seed: int = 0,
    which: Sequence[str] = METRICS,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> pd.DataFrame:
    """Every metric for every layer: a DataFrame with columns layer, nu, cca, rank, probe,
    probe_c (the median of the C its inner CV chose per outer fold), probe_se (the probe score's
    bootstrap s.e.).

    states: (L+1, N, d), layer 0 = embeddings (an array, a tensor, or an
    `analysis.cache.StoredTensor`: each layer is then read from the file where it is fitted);
    labels: (N,); metric: the task's score
    (``spearman`` marks a regression task). One seeded stratified 80/10/10 split of the N examples
    serves CCA (fit on train, λ chosen on dev, scored on test). The probe is scored by
    cross-validated predictions over all N examples (`analysis.layers.probe.cv_predictions`:
    stratified 5-fold, C chosen by an inner 3-fold CV in each outer fold), the outer folds fixed
    by ``seed`` and shared by every layer, so that layer differences are not fold noise.
    Regression: the probe is ridge regression scored by Spearman on the raw scores, while ν, CCA
    and ϱ use `bin_scores(labels, n_bins)`; ``df.attrs["label_note"]`` says so.
    Metrics left out of ``which`` are NaN. ``df.attrs`` also holds task_type, metric, n, seed,
    probe_folds (k), probe_c_folds (per layer, the C of each outer fold) and probe_predictions
    ((L+1, N) each example's out-of-fold prediction, NaN rows without a probe; the repeats
    resample them). Each layer is one task of ``executor`` (default `analysis.compute.current`).
    """
    unknown = set(which) - set(METRICS)
    if unknown:
        raise ValueError(f"Unknown metrics {sorted(unknown)}: choose from {', '.join(METRICS)}.")
    n_layers = n_states(states)[0]
    if n_layers < 2:
        raise ValueError("layer_metrics needs states of shape (L+1, N, d) with L ≥ 1.")
    raw = as_labels(labels)
    regression = metric == "spearman"
    classes = bin_scores(raw, n_bins) if regression else encode_classes(raw)[0]
    split = split_indices(classes, seed)
    folds = outer_folds(classes, seed) if len(np.unique(raw)) >= 2 else None
    report = progress or (lambda f, m="": None)
    predictions = np.full((n_layers, len(raw)), np.nan)
    c_folds: list[list[float]] = []
    rows = []
    report(0.0, f"fitting {n_layers} layers")
    fitted = layer_rows(
        states,
        (classes, raw, split, metric, which, seed, folds),
        executor=executor,
        done=lambda finished, total: report(finished / total, f"{finished} of {total} layers done"),
    )
    for layer, (row, probe) in enumerate(fitted):
        rows.append(row)
        if probe is not None:
            predictions[layer] = probe.predictions
        c_folds.append([] if probe is None else list(probe.c_folds))
    df = pd.DataFrame(rows, columns=["layer", *COLUMNS])
    df["layer"] = df["layer"].astype(int)
    df.attrs.update(
        task_type="regression" if regression else "classification",
        metric=metric,
        n=len(raw),
        seed=seed,
        n_classes=int(classes.max()) + 1,
        probe_folds=0 if folds is None else int(folds.max()) + 1,
        probe_c_folds=c_folds,
        probe_predictions=predictions,
        label_note=(
            f"Regression task: ν, CCA and ϱ use the scores cut into {int(classes.max()) + 1} "
            "quantile bins; the probe is ridge regression scored by Spearman."
            if regression
            else ""
        ),
    )
    return df


def summary(df: pd.DataFrame) -> dict[str, Any]:
    """ℓ* = argmin ν over ℓ = 1..L, ζ of the ν curve, and ρ(metric, probe) for nu, cca, rank."""
    body = df[df["layer"] >= 1].sort_values("layer")
    nu_curve = body["nu"].to_numpy(dtype=float)
    finite = np.isfinite(nu_curve)
    l_star = (
        int(body["layer"].to_numpy()[finite][np.argmin(nu_curve[finite])]) if finite.any() else None
    )
    return {
        "l_star": l_star,
        "zeta": zeta(nu_curve),
        "rho": {m: rho(body[m], body["probe"]) for m in ("nu", "cca", "rank")},
    }


def strategies(l_star: int, n_layers: int) -> dict[str, list[tuple[int, int, int]]]:
    """The (ℓ_bottom, ℓ_top, ℓ_cls) strategies ℓ* implies, from the one home of the paper's
    generators, `analysis.strategies` (docs/explanation/strategies.md, "ℓ*-down and ℓ*-up").
    ℓ*-up is empty when ℓ* = L."""
    if not 1 <= l_star <= n_layers:
        raise ValueError(f"ℓ* must lie in 1..{n_layers} (got {l_star}).")
    return {
        "l_star_down": sorted(gen.l_star_down(l_star, n_layers)),
        "l_star_up": gen.l_star_up(l_star, n_layers),
        "baselines": gen.baselines(n_layers),
    }


# --- cached, and as JSON -------------------------------------------------------------------------

# Bump when a change to this module changes the numbers; it is part of every metrics cache key.
# 3: the probe's C chosen by CV; 4: scored by 5-fold CV predictions; 5: the probe's fits side by
# side (analysis.layers.logistic_batch: the same iterates up to the rounding of their products)
METRICS_VERSION = "5"


def states_key(layer_states: LayerStates) -> str:
    """The disk-cache key of an extraction (analysis.extract.LayerStates): the SHA-256 of its
    recipe (model weights, data, sample, pooling, max length), so equal keys mean equal states."""
    return Path(layer_states.meta["cache_path"]).name


def metrics_recipe(
    layer_states: LayerStates, seed: int, n_bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """What decides the metric numbers: the states and the metric settings."""
    return {
        "states": states_key(layer_states),
        "metric": layer_states.metric,
        "seed": seed,
        "n_bins": n_bins,
        "split": [0.8, 0.1, 0.1],
        "cca_grid": list(CCA_GRID),
        "probe_grid": list(PROBE_GRID),
        "probe_folds": CV_FOLDS,
        "probe_outer_folds": OUTER_FOLDS,
        "version": METRICS_VERSION,
        **route_recipe(layer_states),  # {} unless the states are large enough to stream
    }


MIN_PER_CLASS = OUTER_FOLDS  # the probe's 5 outer folds; CCA's dev and test then get ≥ 1 per class


def check_sample_size(
    labels: ArrayLike,
    metric: str = "accuracy",
    label_names: Sequence[str] = (),
    n_bins: int = DEFAULT_BINS,
) -> None:
    """Refuse a sample too small for the layer analyses, with one message.

    Every class (for scores: every quantile bin of `bin_scores`) needs at least
    ``MIN_PER_CLASS`` = 5 examples: the probe is scored by stratified 5-fold cross-validated
    predictions, and CCA's stratified 80/10/10 split then puts at least one example of each class
    in its dev and in its test part (≥ 2 each with two classes). Below that ρ, CCA and the probe
    are undefined and ℓ* would be a guess. labels: (N,) class ids or scores; label_names: class
    names for the message.
    """
    raw = as_labels(labels)
    regression = metric == "spearman"
    classes = bin_scores(raw, n_bins) if regression else encode_classes(raw)[0]
    values, counts = np.unique(classes, return_counts=True)
    unit, units = ("score bin", "score bins") if regression else ("class", "classes")
    need = f"at least {MIN_PER_CLASS} examples of every {unit}"
    why = (
        f"The layer analyses need {need} (the probe is scored by {OUTER_FOLDS}-fold "
        "cross-validation, and CCA's dev and test parts need at least two examples each)"
    )
    if len(values) < 2:
        raise ValueError(
            f"{why}, and at least two {units}: the N = {len(raw):,} examples all have one "
            f"{'score' if regression else 'label'}. Raise N or choose other data."
        )
    if counts.min() < MIN_PER_CLASS:
        small = int(values[np.argmin(counts)])
        if regression:
            name = f"score bin {small + 1} of {len(values)}"
        else:
            original = np.unique(raw)[small]
            index = int(original) if np.issubdtype(np.asarray(original).dtype, np.integer) else -1
            label = label_names[index] if 0 <= index < len(label_names) else str(original)
            name = f"class {label!r}"
        raise ValueError(
            f"{why}: {name} has {int(counts.min())} of the N = {len(raw):,} examples. Raise N "
            f"(about {-(-MIN_PER_CLASS * len(raw) // int(counts.min())):,} would do at these "
            f"{unit} shares)."
        )


def cached_layer_metrics(
    layer_states: LayerStates,
    seed: int = 0,
    n_bins: int = DEFAULT_BINS,
    cache: DiskCache | None = None,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> tuple[pd.DataFrame, bool]:
    """`layer_metrics` of one extraction, served from the disk cache when already computed.

    layer_states: analysis.extract.LayerStates (its layers are read from the cache file where
    they are fitted, when it has one). Returns (df, hit); df.attrs as in `layer_metrics` plus
    ``seconds`` (compute time of the first run). A sample with fewer than 5 examples of some
    class is refused first (`check_sample_size`: one ValueError, for the CLI and the page alike).
    Each layer is one task of ``executor`` (default `analysis.compute.current`).
    """
    check_sample_size(layer_states.labels, layer_states.metric, layer_states.label_names, n_bins)
    cache = cache or DiskCache()
    recipe = metrics_recipe(layer_states, seed, n_bins)

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        n_layers, n, d = layer_states.states.shape
        work = n_layers * n * d
        told = announce(progress or no_progress, estimate("layer_metrics", work, cache.root, "cpu"),
                        f"the layer table of {n:,} examples")  # fmt: skip
        if recipe.get("route") == "streamed":  # large states: analysis.layers.streamed
            df = streamed_metrics_of(layer_states, seed, n_bins, told, executor)
        else:
            source = layer_states.stored if layer_states.stored is not None else layer_states.states
            df = layer_metrics(
                source, layer_states.labels, layer_states.metric, seed, METRICS, n_bins,
                told, executor,
            )  # fmt: skip
        values = torch.tensor(df[list(COLUMNS)].to_numpy(dtype=np.float64))  # (L+1, 6)
        meta = {k: v for k, v in df.attrs.items() if k != "probe_predictions"}
        tensors = {"values": values}
        if "probe_predictions" in df.attrs:
            tensors["probe_predictions"] = torch.tensor(df.attrs["probe_predictions"])
        seconds = time.perf_counter() - start
        return tensors, {**meta, **work_meta("layer_metrics", work, seconds, "cpu")}

    tensors, meta, hit = cache.get_or_compute("layer_metrics", recipe, compute)
    values = tensors["values"].numpy()
    df = pd.DataFrame(values, columns=list(COLUMNS))
    df.insert(0, "layer", np.arange(len(df)))
    df.attrs.update(meta)
    if "probe_predictions" in tensors:
        df.attrs["probe_predictions"] = tensors["probe_predictions"].numpy()
    return df, hit


def finite(value: object) -> object:
    """NaN / ±inf become null: strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def report(cfg: ExtractConfig, df: pd.DataFrame, hit: bool = False) -> dict[str, Any]:
    """The JSON of the CLI and the page's download: model, data, n, pooling, layers (layer, nu,
    cca, rank, probe each), l_star, zeta, rho {nu, cca, rank}, plus context. cfg: the
    ExtractConfig of the states; df: a `layer_metrics` frame. NaN / inf become null."""
    summ = summary(df)
    n_layers = int(df["layer"].max())
    rows = [
        {"layer": int(r["layer"]), **{m: finite(float(r[m])) for m in COLUMNS if m in r}}
        for r in df.to_dict("records")
    ]
    rho = {k: finite(v) for k, v in summ["rho"].items()}
    return {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "n": cfg.sample.n,
        "pooling": cfg.pooling,
        "seed": cfg.sample.seed,
        "sample": to_dict(cfg.sample),
        "max_length": cfg.max_length,
        "task_type": df.attrs.get("task_type"),
        "metric": df.attrs.get("metric"),
        "label_note": df.attrs.get("label_note", ""),
        "n_layers": n_layers,
        "layers": rows,
        "l_star": summ["l_star"],
        "zeta": finite(summ["zeta"]),
        "rho": rho,
        "abs_rho": {k: None if v is None else abs(v) for k, v in rho.items()},
        "strategies": (
            {k: [list(s) for s in v] for k, v in strategies(summ["l_star"], n_layers).items()}
            if summ["l_star"] is not None
            else None
        ),
        "cache_hit": hit,
        "seconds": df.attrs.get("seconds"),
        # analysis.layers.streamed: how the metrics were computed, and the probe's subsample
        **{
            k: df.attrs[k] for k in ("route", "probe_cap", "probe_n", "route_note") if k in df.attrs
        },
    }
