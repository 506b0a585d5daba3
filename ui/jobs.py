"""What the compute workers run (`ui.compute_pool`): module-level functions of picklable settings.

They live here, apart from the pages' state modules, because a worker imports the module of
every job it is sent before it can start it, and the state modules import Streamlit and its
page machinery, which a worker, drawing nothing, never needs. Each job imports what it computes
with when it runs, so that an extraction does not wait for the layer table's imports either
(`warm_worker` loads those beside it). Nothing here imports Streamlit or the rest of ``ui``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.config import ExtractConfig, ModelSpec
    from analysis.extract import LayerStates
    from analysis.heads.collect import HeadStatsConfig
    from analysis.heads.stats import HeadStats
    from analysis.layers.examples import ProbePredictions
    from analysis.recommend.config import RecommendConfig
    from analysis.recommend.recommendation import Recommendation


@functools.lru_cache(maxsize=2)
def _model(name: str, trust_remote_code: bool):
    from analysis.config import ModelSpec
    from analysis.models import load_model

    return load_model(ModelSpec(name, trust_remote_code=trust_remote_code))


def worker_model(spec: ModelSpec):
    """The model this worker has loaded for ``spec`` (loaded once per worker; in-process calls
    get the server's shared model instead, `ui.loaders.get_model`)."""
    return _model(spec.name, spec.trust_remote_code)


def warm_worker(model: str | None = None) -> None:
    """The first worker's start-up: the imports every computation needs (torch, transformers)
    and the sidebar's default model, a few seconds paid once, before the first page asks (a
    model that does not load is left to that page's own clear message). The layer tasks'
    imports then load in a thread, beside the first extraction (whose torch kernels leave the
    interpreter free), instead of before it."""
    import analysis.extract
    import analysis.heads.collect  # noqa: F401

    if model:
        with contextlib.suppress(Exception):
            _model(model, False)
    # Not a daemon: a worker's exit waits for this import (a few seconds) rather than finalising
    # the interpreter in the middle of it.
    threading.Thread(target=warm_tasks, name="tunescope-warm-imports").start()


def warm_tasks() -> None:
    """The start-up of a further worker: what a layer table's tasks import (no torch)."""
    import analysis.layers.rows  # noqa: F401


def extract_job(cfg: ExtractConfig, progress) -> bool:
    """An extraction: the states go into the disk cache (only whether they were there already
    comes back)."""
    from analysis.extract import extract_states

    states = extract_states(cfg, progress=progress, loaded=worker_model(cfg.model))
    return bool(states.meta["cache_hit"])


def worker_states(cfg: ExtractConfig) -> LayerStates:
    """The states of ``cfg``, read from the disk cache (`ui.loaders.get_states` put them there
    before any job that needs them runs)."""
    from analysis.extract import extract_states

    return extract_states(cfg, loaded=worker_model(cfg.model))


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

    return head_stats(cfg, progress=progress, loaded=worker_model(cfg.extract.model))


def recommendation_job(cfg: RecommendConfig, progress) -> Recommendation:
    """The recommendation (`analysis.recommend.recommendation.recommend`): the layer analyses
    the page ran first (fanned out over the pool) read from the disk cache, the head statistics
    and the costs (disk-cached too), the choices."""
    from analysis.recommend.recommendation import recommend

    return recommend(cfg, worker_model(cfg.model), progress=progress)
