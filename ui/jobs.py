"""What the compute workers run (`ui.compute_pool`): module-level functions of picklable settings.

They live here, apart from the pages' state modules, because a worker imports the module of
every job it is sent before it can start it, and the state modules import Streamlit and its
page machinery (0.5 s, measured after the analysis imports; this module: 3 ms), which a worker,
drawing nothing, never needs. Each job imports what it computes with when it runs, so that an
extraction does not wait for the layer table's imports either (`ui.compute_pool._warm` loads
those beside it). Nothing here imports Streamlit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ui import compute_pool

if TYPE_CHECKING:
    import pandas as pd

    from analysis.config import ExtractConfig
    from analysis.extract import LayerStates
    from analysis.heads.collect import HeadStatsConfig
    from analysis.heads.stats import HeadStats
    from analysis.layers.examples import ProbePredictions
    from analysis.layers.repeats import LayerRepeats


def extract_job(cfg: ExtractConfig, progress) -> bool:
    """An extraction: the states go into the disk cache (only whether they were there already
    comes back)."""
    from analysis.extract import extract_states

    states = extract_states(cfg, progress=progress, loaded=compute_pool.worker_model(cfg.model))
    return bool(states.meta["cache_hit"])


def worker_states(cfg: ExtractConfig) -> LayerStates:
    """The states of ``cfg``, read from the disk cache (`ui.loaders.get_states` put them there
    before any job that needs them runs)."""
    from analysis.extract import extract_states

    return extract_states(cfg, loaded=compute_pool.worker_model(cfg.model))


def metrics_job(cfg: ExtractConfig, seed: int, n_bins: int, progress) -> tuple[pd.DataFrame, bool]:
    """The layer table: (df, hit) of `cached_layer_metrics` on ``cfg``'s states."""
    from analysis.layers.table import cached_layer_metrics

    return cached_layer_metrics(worker_states(cfg), seed=seed, n_bins=n_bins, progress=progress)


def repeats_job(
    cfg: ExtractConfig, seed: int, repeats: int, n_bins: int, progress
) -> tuple[LayerRepeats, bool]:
    """The layer repeats: (repeats, hit) of `cached_layer_repeats`."""
    from analysis.layers.repeats import cached_layer_repeats

    return cached_layer_repeats(
        worker_states(cfg), seed=seed, repeats=repeats, n_bins=n_bins, progress=progress
    )


def predictions_job(
    cfg: ExtractConfig, layer: int, seed: int, metric: str, progress
) -> ProbePredictions:
    """The held-out probe predictions of one layer."""
    from analysis.layers.examples import probe_predictions

    states = worker_states(cfg)
    return probe_predictions(states.states[layer], states.labels, metric, seed=seed)


def head_stats_job(cfg: HeadStatsConfig, progress) -> tuple[HeadStats, dict]:
    """The head statistics (disk-cached by `analysis.heads.collect`)."""
    from analysis.heads.collect import head_stats

    return head_stats(cfg, progress=progress, loaded=compute_pool.worker_model(cfg.extract.model))
