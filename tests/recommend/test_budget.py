"""Costs are measured once: a choice's count and step times are a disk-cache entry keyed by what
produced them, so a second measurement times nothing; finished runs' own step times refine the
ratio (known answers on fabricated runs)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from analysis.cache import DiskCache
from analysis.config import DataSpec, ModelSpec
from analysis.predictions import encode_predictions
from analysis.recommend import budget
from analysis.recommend.budget import COSTS_KIND, Cost, Costs, measure, run_step_time_ratios
from analysis.recommend.choices import REFERENCE, Choice, Proposal
from analysis.recommend.config import RecommendConfig
from analysis.recommend.outcome import planned_runs
from analysis.recommend.recommendation import Recommendation
from analysis.runs.db import RunsDB

LAYER = Choice("layer 1", "candidate", "layers", "layer 1 and the classifier", layers=(1, 1, 1))
BITFIT = Choice("BitFit", "alternative", "bitfit", "every bias", matched_to="layer 1")


# -- finished runs refine the ratio -------------------------------------------------------------


def test_run_ratios_are_medians_side_by_side_with_full_fine_tunings_runs_of_the_same_seeds():
    times = {
        "full": {0: 1.0, 1: 2.0, 2: 4.0},
        "a": {0: 0.5, 1: 1.0, 2: 2.0},  # half of full's, seed for seed: 0.5
        "b": {1: 1.5, 2: 3.0, 5: 0.1},  # seeds 1, 2 with full (median 3.0): 2.25 / 3.0
        "c": {7: 0.3},  # no seed in common with full: no ratio from runs
        "d": {0: None, 1: float("nan"), 2: 1.0},  # unusable times are left out: 1.0 / 4.0
    }
    ratios = run_step_time_ratios(times, "full")
    assert ratios["full"] == (1.0, 3)
    assert ratios["a"] == (pytest.approx(0.5), 3)
    assert ratios["b"] == (pytest.approx(2.25 / 3.0), 2)
    assert "c" not in ratios
    assert ratios["d"] == (pytest.approx(0.25), 1)
    assert run_step_time_ratios({"a": {0: 1.0}}, "full") == {}  # full has no runs yet


def test_refined_costs_take_the_runs_ratio_and_keep_the_rest():
    costs = Costs({"full": Cost(10, 10, 1.0, 1.0), "a": Cost(2, 10, 0.2, 0.4, "matched")}, 0.1)
    refined = costs.refined({"a": (0.3, 3)})
    assert refined["a"] == Cost(2, 10, 0.2, 0.3, "matched", runs=3)
    assert refined["full"] == costs["full"] and refined.drift == 0.1
    assert costs["a"].step_time_ratio == 0.4  # the measured costs are left as they were


def test_the_comparison_shows_the_ratio_of_the_finished_runs():
    cfg = RecommendConfig(model=ModelSpec("tiny-model"), data=DataSpec("movie-snippets"),
                          steps=2, n_eval=100)  # fmt: skip
    proposal = Proposal([REFERENCE, LAYER, BITFIT])
    costs = Costs({"full fine-tuning": Cost(100, 100, 1.0, 1.0), "layer 1": Cost(30, 100, 0.5, 0.5),
                   "BitFit": Cost(3, 100, 0.7, 0.7)}, 0.0)  # fmt: skip
    step = {"full fine-tuning": 0.20, "layer 1": 0.05, "BitFit": None}  # BitFit's not recorded
    db = RunsDB()
    labels = np.array([0, 1] * 50)
    for name, config in planned_runs(cfg, proposal):
        run_id = db.enqueue(config, running_pid=os.getpid())
        db.finish(run_id, {"score": 0.8, "metric": "accuracy", "step_time_s": step[name],
                           "test_predictions": encode_predictions(labels, labels, "t", False)})  # fmt: skip
    rec = Recommendation(cfg, None, proposal, costs)
    arms = {a.name: a for a in rec.outcome(db.list_runs())[0]}
    assert arms["layer 1"].run_step_time_ratio == pytest.approx(0.25)  # 0.05 / 0.20, 3 seeds
    assert arms["layer 1"].step_time_ratio == 0.5  # the timed ratio orders the arms
    assert arms["BitFit"].run_step_time_ratio is None  # no step times: the timed ratio only
    assert arms["BitFit"].step_time_ratio == 0.7
    assert arms["full fine-tuning"].run_step_time_ratio == 1.0
    assert rec.costs["layer 1"].step_time_ratio == 0.5  # the candidates keep what was timed


# -- measured once --------------------------------------------------------------------------------


@pytest.fixture
def tiny(tiny_bert_dir):
    from analysis.models import load_model

    loaded = load_model(ModelSpec(str(tiny_bert_dir)))
    cfg = RecommendConfig(model=loaded.spec, n=40, batch_size=4, max_length=32, timed_steps=1)
    return cfg, loaded


def entries() -> list[str]:
    folder = DiskCache().root / COSTS_KIND
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_second_measurement_reads_every_cost_from_the_cache_and_times_nothing(tiny, monkeypatch):
    import dataclasses

    cfg, loaded = tiny
    proposal = Proposal([REFERENCE, LAYER, BITFIT])
    first = measure(cfg, proposal, loaded)
    assert len(entries()) == 3  # one per choice
    assert first["full fine-tuning"].step_time_ratio == 1.0
    assert first["layer 1"].n_trainable < first["full fine-tuning"].n_trainable
    timed = []
    real = budget.time_steps

    def spy(cfg, reference, choices, *args):
        timed.append([c.name for c in choices])
        return real(cfg, reference, choices, *args)

    monkeypatch.setattr(budget, "time_steps", spy)
    assert measure(cfg, proposal, loaded) == first
    # the run's length and evaluation change no step: the same entries
    longer = dataclasses.replace(cfg, steps=500, n_eval=20, eval_every=7, seeds=(0, 1))
    assert measure(longer, proposal, loaded) == first
    assert timed == []
    # a new choice is timed alone, beside full fine-tuning; the others are read
    more = Proposal([REFERENCE, LAYER, BITFIT, Choice("lora", "alternative", "lora", "LoRA")])
    assert measure(cfg, more, loaded)["layer 1"] == first["layer 1"]
    assert timed == [["lora"]] and len(entries()) == 4
    # another batch size is another step: timed again
    measure(dataclasses.replace(cfg, batch_size=8), proposal, loaded)
    assert timed[-1] == ["full fine-tuning", "layer 1", "BitFit"] and len(entries()) == 7


def test_a_cost_is_keyed_by_model_method_options_batch_length_device_threads_and_version(tiny):
    from analysis.data import load_data
    from analysis.recommend.budget import COSTS_VERSION, cost_recipe

    cfg, loaded = tiny
    run = LAYER.config(cfg.base_run(0), seed=0)
    recipe = cost_recipe(run, loaded, load_data(cfg.data).fingerprint, 1, 2)
    assert recipe["run"]["model"] == loaded.identity()
    assert (
        recipe["run"]["method"] == "layers"
        and recipe["run"]["layers"] == [1, 1]
        and recipe["run"]["classifier_layer"] == 1
    )
    assert recipe["run"]["batch_size"] == 4 and recipe["run"]["max_length"] == 32
    assert "fingerprint" in recipe["run"]["data"]
    assert not {"steps", "n_eval", "eval_every", "n_train"} & set(recipe["run"])
    assert (recipe["device"], recipe["threads"], recipe["timed_steps"]) == ("cpu", 2, 1)
    assert recipe["version"] == COSTS_VERSION
