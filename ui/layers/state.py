"""The Layers page's cached computations: metrics per extraction, 2-D pictures per layer.

Metric tables are disk-cached by analysis.layers.table (keyed by the states' recipe and the
metric settings) and kept in a small in-process LRU here, so moving a slider never recomputes
states or metrics. The 2-D pictures and the per-example probe predictions (a cross-validated
probe: about a second per layer at N = 2,000) are st.cache_data entries keyed by the same states
key, the layer and the seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import streamlit as st

from analysis.cache import DiskCache
from analysis.config import ExtractConfig
from analysis.layers.examples import ProbePredictions, probe_predictions
from analysis.layers.metrics import DEFAULT_BINS
from analysis.layers.projection import cached_projection, project_2d, projection_recipe
from analysis.layers.repeats import LayerRepeats, cached_layer_repeats
from analysis.layers.table import cached_layer_metrics, states_key
from ui import compute_pool
from ui.compute_pool import compute
from ui.jobs import predictions_job
from ui.loaders import get_data
from ui.memo import ProgressMemo, queued

if TYPE_CHECKING:
    from analysis.extract import LayerStates

_METRICS: ProgressMemo[tuple[pd.DataFrame, bool]] = ProgressMemo(max_entries=24)
_REPEATS: ProgressMemo[tuple[LayerRepeats, bool]] = ProgressMemo(max_entries=12)


def get_layer_metrics(
    layer_states: LayerStates, seed: int, n_bins: int = DEFAULT_BINS, label: str = "Layer metrics"
) -> tuple[pd.DataFrame, bool]:
    """(df, hit) of analysis.layers.table.cached_layer_metrics, with a progress bar on a miss
    (its layers fitted in the compute workers, `ui.compute_pool`)."""

    def run(progress):
        return cached_layer_metrics(layer_states, seed=seed, n_bins=n_bins, progress=progress)

    key = (states_key(layer_states), seed, n_bins)
    df, hit = _METRICS.get(key, label, run, served=lambda value: value[1])
    return df.copy(), hit


def get_layer_repeats(
    layer_states: LayerStates, seed: int, repeats: int, n_bins: int = DEFAULT_BINS
) -> tuple[LayerRepeats, bool]:
    """(repeats, hit) of analysis.layers.repeats.cached_layer_repeats, with a progress bar that
    counts the layers done on a miss (in the compute workers, as `get_layer_metrics`)."""

    def run(progress):
        return cached_layer_repeats(
            layer_states, seed=seed, repeats=repeats, n_bins=n_bins, progress=progress
        )

    key = (states_key(layer_states), seed, repeats, n_bins)
    # The figure is already drawn without them: the repeats wait behind other views' first figures.
    label = f"{repeats} bootstrap repeats of the layer metrics"
    return _REPEATS.get(key, label, run, later=True, served=lambda value: value[1])


def _in_worker(layer_states: LayerStates) -> bool:
    """Whether a computation on these states goes to a compute worker: when the workers are on
    and the states are an extraction's (a worker finds them in the disk cache by their config)."""
    return compute_pool.enabled() and isinstance(layer_states.config, ExtractConfig)


_PICTURES: ProgressMemo[tuple[np.ndarray, bool]] = ProgressMemo(max_entries=64)


def projection(layer_states: LayerStates, layer: int, method: str, seed: int) -> np.ndarray:
    """(N, 2) picture of one layer (PCA or UMAP), cached per states, layer, method and seed: in
    this process, and on disk for states from the disk cache (a prepared lesson computes none)."""

    def run(progress):
        if layer_states.meta.get("cache_path"):
            return cached_projection(layer_states, layer, method, seed)
        return project_2d(layer_states.states[layer], method, seed), False

    key = (states_key(layer_states), layer, method, seed)
    label = f"{method.upper()} picture of layer {layer}"
    return _PICTURES.get(key, label, run, served=lambda value: value[1])[0]


def has_projection(layer_states: LayerStates, layer: int, method: str, seed: int) -> bool:
    """Whether this picture was already computed, in this session or into the disk cache (UMAP
    is drawn on request: a prepared lesson's is there)."""
    done = st.session_state.setdefault("layers_pictures", set())
    if (states_key(layer_states), layer, method, seed) in done:
        return True
    if not layer_states.meta.get("cache_path"):
        return False
    recipe = projection_recipe(layer_states, layer, method, seed)
    return DiskCache().entry_dir("projection", recipe).is_dir()


def mark_projection(layer_states: LayerStates, layer: int, method: str, seed: int) -> None:
    st.session_state.setdefault("layers_pictures", set()).add(
        (states_key(layer_states), layer, method, seed)
    )


@st.cache_data(max_entries=64, show_spinner=False)
def _predictions(
    key: str, layer: int, seed: int, metric: str, _layer_states: LayerStates
) -> ProbePredictions:
    with queued():
        if _in_worker(_layer_states):  # a probe refit per fold: in a compute worker
            return compute(predictions_job, _layer_states.config, layer, seed, metric)
        return probe_predictions(
            _layer_states.states[layer], _layer_states.labels, metric, seed=seed
        )


def predictions(layer_states: LayerStates, layer: int, seed: int) -> ProbePredictions:
    """Held-out probe predictions of every example at one layer (analysis.layers.examples),
    cached per states, layer and seed."""
    return _predictions(states_key(layer_states), layer, seed, layer_states.metric, layer_states)


def examples(layer_states: LayerStates) -> pd.DataFrame:
    """The sampled examples in the order of the states: example (0..N-1), row (in its data part),
    text (and text_pair for pairs), label (the class name, or the score)."""
    cfg = layer_states.config
    part = get_data(cfg.data).parts[cfg.sample.part]
    rows = layer_states.rows.numpy()
    frame = part.loc[rows, [c for c in ("text", "text_pair") if c in part.columns]]
    frame = frame.reset_index(drop=True)
    frame.insert(0, "row", rows)
    frame.insert(0, "example", np.arange(len(rows)))
    frame["label"] = label_names(layer_states, layer_states.labels.numpy())
    return frame


def label_names(layer_states: LayerStates, values: np.ndarray) -> list:
    """Class names of class ids (scores stay numbers for regression)."""
    if layer_states.task_type == "regression":
        return [float(v) for v in values]
    names = layer_states.label_names
    return [names[int(v)] if 0 <= int(v) < len(names) else str(v) for v in values]
