"""tunescope's analysis library: pure functions over encoders, data and tensors.

The public API is imported lazily, so ``python -m tunescope --help`` does not pay for torch::

    from analysis import nu, cca_score, rank_metric   # one layer: (N, d) states, (N,) labels
    from analysis import probe_score   # (train states, train labels, test states, test labels, metric)
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
    "ModelError": "analysis.config",
    "load_data": "analysis.data",
    "sample": "analysis.data",
    "DataError": "analysis.data",
    "task_score": "analysis.scores",
    "extract_states": "analysis.extract",
    "LayerStates": "analysis.extract",
    "DiskCache": "analysis.cache",
    "nu": "analysis.layers.metrics",
    "cca_score": "analysis.layers.metrics",
    "rank_metric": "analysis.layers.metrics",
    "zeta": "analysis.layers.metrics",
    "probe_score": "analysis.layers.probe",
    "layer_table": "analysis.layers.table:layer_metrics",
    "layer_summary": "analysis.layers.table:summary",
    "head_stats": "analysis.heads.collect",
    "analyse_heads": "analysis.heads.select",
    "pagerank": "analysis.heads.pagerank",
    "HeadSelection": "analysis.heads.selection_file",
    "load_selection": "analysis.heads.selection_file",
    "save_selection": "analysis.heads.selection_file",
    "trajectory_svd": "analysis.subspace.spectrum",
    "find_outliers": "analysis.subspace.outliers",
    "analyse_trajectory": "analysis.subspace.report",
    "FinetuneConfig": "analysis.finetune.config",
    "run_finetune": "analysis.finetune.engine",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        # "module:attribute" where the public name differs from the function's own name.
        module, _, attribute = _EXPORTS[name].partition(":")
        return getattr(importlib.import_module(module), attribute or name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
