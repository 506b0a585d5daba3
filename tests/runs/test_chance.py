"""Chance-level runs (analysis.runs.chance): the majority-class baseline from stored test
predictions, the flags, and no verdict between two settings that are both at chance."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.predictions import encode_predictions
from analysis.runs import chance, comparisons

LABELS = np.array([0, 0, 0, 1, 1, 0, 0, 1, 0, 0])  # 7 of 10 are class 0


def result(predictions, metric: str = "accuracy", score: float | None = None) -> dict:
    predictions = np.asarray(predictions)
    if score is None:
        score = float(np.mean(predictions == LABELS))
    record = encode_predictions(predictions, LABELS, "fp", regression=False)
    return {"metric": metric, "score": score, "test_predictions": record}


def test_the_baselines_come_from_the_test_labels():
    base = chance.baseline_of(result(LABELS))
    assert base.majority == pytest.approx(0.7) and base.chance == pytest.approx(0.5)
    assert base.n_classes == 2 and base.predicted_classes == 2
    assert chance.baseline_of(result(LABELS, "mcc", 1.0)).majority == 0.0  # a constant: MCC 0
    assert chance.baseline_of(result(LABELS, "mcc", 1.0)).chance is None
    assert chance.baseline_of({"metric": "accuracy", "score": 0.5}) is None  # nothing stored
    assert chance.baseline_of({"metric": "spearman", "score": 0.5}) is None


def test_runs_at_chance_are_flagged():
    assert chance.chance_flag(result(np.zeros(10))) == chance.ONE_CLASS  # 0.7, one class
    below = np.where(np.arange(10) < 2, 1, 0)  # two ones, at the wrong places: 0.5
    assert chance.chance_flag(result(below)).startswith(chance.NOT_ABOVE)
    assert chance.chance_flag(result(LABELS)) == ""  # 1.0: it learned
    assert chance.chance_flag(None) == ""


def test_metric_ranges():
    assert chance.metric_range("accuracy") == (0.0, 1.0)
    assert chance.metric_range("mcc") == (-1.0, 1.0) and chance.metric_range("spearman")[0] == -1
    assert chance.metric_range("score") is None


def test_groups_all_of_whose_runs_are_flagged():
    table = pd.DataFrame({"group": ["a", "a", "b", "b"], "flag": ["x", "y", "x", ""]})
    assert chance.groups_at_chance(table) == {"a"}


def comparison_rows(group: str, flags_learned: list[bool]) -> list[dict]:
    rows = []
    for seed, learned in enumerate(flags_learned):
        res = result(LABELS if learned else np.zeros(10))
        rows.append({"id": f"{group}{seed}", "group": group, "seed": seed, "score": res["score"],
                     "flag": chance.chance_flag(res), "metric": "accuracy", "n_trainable": 1,
                     "setting": group, "budget": "b", "label": group, "result": res})  # fmt: skip
    return rows


def test_no_verdict_between_two_settings_both_at_chance():
    both = pd.DataFrame(comparison_rows("full", [False, False])
                        + comparison_rows("frozen", [False, False])
                        + comparison_rows("random subspace", [False, False]))  # fmt: skip
    withheld: list[str] = []
    assert comparisons.comparison_verdicts(both, withheld) == []
    assert len(withheld) == 1 and "both are at chance level" in withheld[0]
    learned = pd.DataFrame(comparison_rows("random subspace", [True, True])
                           + comparison_rows("frozen", [False, False]))  # fmt: skip
    withheld = []
    assert len(comparisons.comparison_verdicts(learned, withheld)) == 1 and not withheld


def test_a_bar_label_names_a_few_differences_not_every_setting():
    label = comparisons._role_label("full", "full · n_eval 1000 · n_train 2000 · steps 7 · x 1", {})
    assert label == "full · n_eval 1000 · n_train 2000 · + 2 more"
