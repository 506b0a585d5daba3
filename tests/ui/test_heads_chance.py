"""The Heads page gives no verdict between two selectors whose runs are all at chance level."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis import claims
from analysis.config import DataSpec, ModelSpec
from analysis.heads.selection_file import HeadSelection
from analysis.predictions import encode_predictions
from ui.heads.runs import labels_at_chance

SELECTIONS = {
    s: HeadSelection({1: [i, i + 1], 2: [i]}, settings={"selector": s, "k": 2})
    for i, s in enumerate(("pagerank", "random"))
}


def heads_runs(learns: dict[str, bool]) -> pd.DataFrame:
    cfg = claims.ClaimsConfig(model=ModelSpec("m"), data=DataSpec("d"), seeds=(0, 1, 2),
                              steps=40, repeats=5, only=("H1",))  # fmt: skip
    planned = claims.plan_runs(cfg, claims.ClaimInputs(n_layers=6, selections=SELECTIONS))
    labels = np.array([0, 1] * 50)
    rows = []
    for i, p in enumerate(planned):
        selector = p.config.options.heads.settings["selector"]
        preds = labels if learns[selector] else np.zeros(100)  # constant: one class only
        result = {"score": float(np.mean(preds == labels)), "metric": "accuracy",
                  "test_predictions": encode_predictions(preds, labels, "t", False)}  # fmt: skip
        rows.append({"id": f"run-{i}", "status": "done", "metric": "accuracy", "method": "heads",
                     "config_json": json.dumps(p.config.to_dict()),
                     "result_json": json.dumps(result)})  # fmt: skip
    return pd.DataFrame(rows)


def test_selectors_both_at_chance_are_named_and_a_learning_one_is_not():
    runs = heads_runs({"pagerank": False, "random": False})
    (comparison,) = claims.heads_comparisons(runs)
    assert {comparison.name_a, comparison.name_b} <= labels_at_chance(runs)  # withheld
    runs = heads_runs({"pagerank": True, "random": False})
    (comparison,) = claims.heads_comparisons(runs)
    at_chance = labels_at_chance(runs)
    assert comparison.name_b in at_chance and comparison.name_a not in at_chance  # shown
