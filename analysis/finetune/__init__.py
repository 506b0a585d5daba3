"""The fine-tuning engine (SPEC.md, "Strategies" and "Heads").

    from analysis.finetune import FinetuneConfig, run_finetune
    result = run_finetune(FinetuneConfig(method="layers", layers=(1, 3, 3)))
    result.score, result.n_trainable, result.step_time_s

Layout: ``config`` (what a run is), ``model`` (the truncated encoder + classifier), ``adapters``
(Houlsby adapters), ``methods`` (what trains, per method), ``engine`` (the training loop).
"""

from __future__ import annotations

from analysis.finetune.config import (
    DEFAULT_LR,
    METHOD_NAMES,
    FinetuneConfig,
    heads_from_file,
    normalise_heads,
)
from analysis.finetune.engine import FinetuneResult, run_finetune
from analysis.finetune.methods import METHODS, Prepared, prepare_method
from analysis.finetune.model import EncoderClassifier

__all__ = [
    "DEFAULT_LR",
    "METHODS",
    "METHOD_NAMES",
    "EncoderClassifier",
    "FinetuneConfig",
    "FinetuneResult",
    "Prepared",
    "heads_from_file",
    "normalise_heads",
    "prepare_method",
    "run_finetune",
]
