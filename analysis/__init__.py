"""tunescope's analysis library: pure functions over encoders, data and tensors.

The public API is imported lazily, so ``python -m analysis --help`` does not pay for torch::

    from analysis import nu, cca_score, rank_metric      # per-layer metrics, (N, d) states, (N,) labels
    from analysis import layer_table, layer_summary      # every metric for every layer; ℓ*, ζ, ρ
    from analysis import load_model, load_data, extract_states
    from analysis import head_stats, analyse_heads, pagerank   # per-head richness, correlation, PageRank
    from analysis import FinetuneConfig, run_finetune          # selective fine-tuning runs
    from analysis import trajectory_svd, find_outliers         # fine-tuning subspaces
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelSpec": "analysis.config",
    "DataSpec": "analysis.config",
    "SampleSpec": "analysis.config",
    "ExtractConfig": "analysis.config",
    "load_model": "analysis.models",
    "ModelError": "analysis.models",
    "load_data": "analysis.data",
    "sample": "analysis.data",
    "DataError": "analysis.data",
    "task_score": "analysis.scores",
    "extract_states": "analysis.extract",
    "LayerStates": "analysis.extract",
    "DiskCache": "analysis.cache",
    "nu": "analysis.layer_metrics",
    "cca_score": "analysis.layer_metrics",
    "rank_metric": "analysis.layer_metrics",
    "probe_score": "analysis.layer_metrics",
    "zeta": "analysis.layer_metrics",
    "layer_table": "analysis.layer_metrics:layer_metrics",
    "layer_summary": "analysis.layer_metrics:summary",
    "head_stats": "analysis.heads_collect",
    "analyse_heads": "analysis.heads",
    "pagerank": "analysis.heads",
    "load_selection": "analysis.heads_selection",
    "save_selection": "analysis.heads_selection",
    "trajectory_svd": "analysis.subspace",
    "find_outliers": "analysis.subspace",
    "analyse_trajectory": "analysis.subspace",
    "FinetuneConfig": "analysis.finetune",
    "run_finetune": "analysis.finetune",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        # "module:attribute" where the public name differs (a function may not share its
        # module's name: importing the module would shadow it on this package).
        module, _, attribute = _EXPORTS[name].partition(":")
        return getattr(importlib.import_module(module), attribute or name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
