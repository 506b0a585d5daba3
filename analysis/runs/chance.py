"""Runs at chance level: the majority-class baseline of a run's test part, and which runs do not
beat it: a score means something only above what a constant answer gets
(docs/explanation/statistics.md, "Chance level").

A classification run stores its test predictions and gold labels (`analysis.predictions`), so its
baselines are computed from exactly the examples it was scored on:

- ``majority``: the run's metric (`analysis.scores.task_score`) of always answering the test part's
  most frequent class (accuracy: that class's share; MCC: 0; F1: 0 unless the positive class is
  the majority).
- ``chance``: the expected accuracy of guessing uniformly among the C classes, 1/C (accuracy only).

A run is flagged (`chance_flag`) when it predicts one class only, or when its score is not above
the majority baseline. Two run groups whose runs are all flagged get no verdict between them:
a difference between two constant answers says nothing about the methods
(`analysis.runs.comparisons`, the pages' `ui.verdicts`). Regression runs (Spearman) have no
majority class and are never flagged here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.predictions import decode_predictions
from analysis.scores import task_score

# The range of each bounded score: a figure's score axis never leaves it.
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "accuracy": (0.0, 1.0),
    "f1": (0.0, 1.0),
    "mcc": (-1.0, 1.0),
    "spearman": (-1.0, 1.0),
}
ONE_CLASS = "predicts one class only"
NOT_ABOVE = "not above the majority class"


def metric_range(metric: str | None) -> tuple[float, float] | None:
    """The bounds of ``metric`` ([0, 1] for accuracy and F1, [−1, 1] for MCC and Spearman), or
    None for an unknown one."""
    return METRIC_RANGES.get(str(metric)) if metric else None


@dataclass(frozen=True)
class Baseline:
    """What a constant or random answer scores on one test part, in the run's metric."""

    metric: str
    majority: float
    chance: float | None
    n_classes: int
    predicted_classes: int  # how many distinct classes the run predicted

    def describe(self) -> str:
        """One line, e.g. ``majority class 0.540 · chance (1/2) 0.500``."""
        text = f"majority class {self.majority:.3f}"
        if self.chance is not None:
            text += f" · chance (1/{self.n_classes}) {self.chance:.3f}"
        return text


def baseline_of(result: Mapping[str, Any] | None) -> Baseline | None:
    """The baselines of a run's test part from its stored predictions (None for a regression
    run, a run without stored predictions, or an unknown metric)."""
    if not result or result.get("metric") not in ("accuracy", "f1", "mcc"):
        return None
    decoded = decode_predictions(result.get("test_predictions"))
    if decoded is None:
        return None
    predictions, labels, _ = decoded
    if not len(labels):
        return None
    classes, counts = np.unique(labels, return_counts=True)
    constant = np.full_like(labels, classes[np.argmax(counts)])
    metric = str(result["metric"])
    return Baseline(
        metric=metric,
        majority=task_score(metric, labels, constant),
        chance=1.0 / len(classes) if metric == "accuracy" else None,
        n_classes=len(classes),
        predicted_classes=len(np.unique(predictions)),
    )


def chance_flag(result: Mapping[str, Any] | None, score: float | None = None) -> str:
    """Why a run is at chance level ("" when it is not, or cannot be told): it predicts one
    class only, or its score (default: the result's) is not above the majority class."""
    base = baseline_of(result)
    if base is None:
        return ""
    if base.predicted_classes <= 1:
        return ONE_CLASS
    value = result.get("score") if score is None else score  # type: ignore[union-attr]
    if value is not None and np.isfinite(value) and value <= base.majority:
        return f"{NOT_ABOVE} ({base.majority:.3f})"
    return ""


def page_baseline(results: Iterable[Mapping[str, Any] | None]) -> Baseline | None:
    """The baseline to draw on a figure of several runs: that of the test part most of them
    were scored on (their predictions' fingerprint), None when none can tell."""
    found: dict[str, Baseline] = {}
    counts: dict[str, int] = {}
    for result in results:
        base = baseline_of(result)
        if base is None:
            continue
        fingerprint = str((result or {}).get("test_predictions", {}).get("fingerprint"))
        found.setdefault(fingerprint, base)
        counts[fingerprint] = counts.get(fingerprint, 0) + 1
    if not counts:
        return None
    return found[max(counts, key=counts.get)]


def flags_of(ids: Iterable[str], results: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """`chance_flag` of each run id (results: run id → its result)."""
    return [chance_flag(results.get(i)) for i in ids]


def groups_at_chance(table: pd.DataFrame, group: str = "group") -> set[str]:
    """The run groups all of whose runs carry a flag (table: a ``flag`` column per run)."""
    if table.empty or "flag" not in table:
        return set()
    flagged = table.assign(_at=table["flag"].fillna("").astype(str) != "")
    every = flagged.groupby(group, sort=False)["_at"].all()
    return {str(g) for g, at in every.items() if at}


BOTH_AT_CHANCE = (
    "No verdict between {a} and {b}: both are at chance level (every run predicts one class "
    "or does not beat the majority class), so their difference says nothing about the methods. "
    "Train longer or with a larger learning rate until they learn."
)
