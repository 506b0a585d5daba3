"""The comparison and the sentence on synthetic data: every branch of the δ rule, the budget,
runs matched to their arm by run group and seed (never averaged across settings), the planned
experiment's order and rounds, and the --json schema, key by key."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest

from analysis.config import DataSpec, ModelSpec
from analysis.predictions import encode_predictions
from analysis.recommend.budget import Cost, Costs, match_note
from analysis.recommend.choices import Choice, Proposal
from analysis.recommend.config import Budget, RecommendConfig
from analysis.recommend.outcome import (
    ArmOutcome,
    arm_outcomes,
    decide,
    experiment_of,
    recommendation_json,
)
from analysis.runs.db import RunsDB
from analysis.runs.planner import next_steps, standings


def arm(name, diff, margin, ratio, share=0.1, n=3, role="alternative", verdict=None):
    verdict = verdict or f"no difference shown (n seeds = {n}, 3)"
    return ArmOutcome(name, role, "x", n, mean=0.8 + diff, se=0.01, diff=diff, margin=margin,
                      verdict=verdict, step_time_ratio=ratio, trainable_share=share)  # fmt: skip


FULL = ArmOutcome("full fine-tuning", "reference", "full", 3, mean=0.8, se=0.01,
                  verdict="reference", step_time_ratio=1.0, trainable_share=1.0)  # fmt: skip


def test_the_cheapest_arm_that_held_up_is_recommended():
    arms = [
        FULL,
        arm("a", -0.002, 0.005, 0.6),  # held up: lower end −0.7 points ≥ −1
        arm("b", -0.001, 0.004, 0.3),  # held up and cheaper: the answer
        arm("c", +0.000, 0.030, 0.1),  # cheapest, but its interval reaches −3 points
        arm("d", +0.010, 0.001, 1.2),
    ]  # fmt: skip  (better, but dearer than full)
    decision = decide(arms, 1.0, trains={"b": "layers 2–4"})
    assert decision.branch == "recommend" and decision.candidate == "b"
    assert decision.sentence.startswith("Tune layers 2–4 (b): 0.30× full's step time")
    assert "-0.1 ± 0.4 points [-0.5, +0.3] against full fine-tuning" in decision.sentence
    assert "n seeds = 3, 3" in decision.sentence and "δ = 1 point" in decision.sentence


def test_the_sentence_says_when_the_runs_cost_other_than_the_timing():
    import dataclasses

    timed_cheap = dataclasses.replace(arm("b", -0.001, 0.004, 0.73), run_step_time_ratio=1.08)
    decision = decide([FULL, timed_cheap], 1.0, trains={"b": "3 random layers"})
    assert "1.08× full's step time in its runs (0.73× timed)" in decision.sentence
    same = dataclasses.replace(timed_cheap, run_step_time_ratio=0.731)
    assert "0.73× full's step time," in decide([FULL, same], 1.0, trains={"b": "x"}).sentence


def test_ties_in_step_time_go_to_the_smaller_trainable_share():
    arms = [FULL, arm("big", 0.0, 0.005, 0.5, share=0.3), arm("small", 0.0, 0.005, 0.5, share=0.1)]
    assert decide(arms).candidate == "small"


def test_undecided_arms_get_more_seeds_and_say_so_once_the_design_is_spent():
    arms = [
        FULL,
        arm("wide", -0.01, 0.03, 0.4),  # −4 .. +2 points: could still hold up
        arm("worse", -0.05, 0.01, 0.3),  # −6 .. −4: shown worse
        arm("one seed", -0.001, math.nan, 0.2, n=1),
    ]  # fmt: skip  (no interval at all)
    going = decide(arms, final=False, looks=8)
    assert going.branch == "in progress" and going.candidate is None and not going.final
    assert going.waiting == ("one seed", "wide")
    assert going.sentence.startswith("Not decided yet: one seed no interval yet")
    assert "adjusted for 8 looks" in going.sentence
    spent = decide(arms, final=True, looks=8)
    assert spent.branch == "undecided" and spent.sentence.startswith("Undecided after 3 seeds")
    assert "wide -1.0 ± 3.0 points [-4.0, +2.0]" in spent.sentence
    assert "a larger test part or a larger δ could settle it" in spent.sentence


def test_no_cheaper_choice_held_up():
    arms = [FULL, arm("worse", -0.05, 0.01, 0.3), arm("also worse", -0.03, 0.005, 0.5)]
    decision = decide(arms)
    assert decision.branch == "none held up" and decision.candidate is None
    assert decision.sentence.startswith(
        "No cheaper choice held up within δ = 1 point: fine-tune the whole model"
    )
    assert "the best, also worse, -3.0 ± 0.5 points [-3.5, -2.5]" in decision.sentence


def test_a_wider_delta_lets_an_arm_hold_up():
    arms = [FULL, arm("near", -0.02, 0.005, 0.3)]  # lower end −2.5 points
    assert decide(arms, 1.0).branch == "none held up"
    assert decide(arms, 3.0).candidate == "near"


def test_the_budget_leaves_out_what_does_not_fit():
    arms = [FULL, arm("fast", 0.0, 0.005, 0.3, share=0.5), arm("slow", 0.0, 0.005, 0.8, share=0.01)]
    assert decide(arms, budget=Budget("params", 0.1)).candidate == "slow"
    assert decide(arms, budget=Budget("time", 0.5)).candidate == "fast"
    assert "within the budget" in decide(arms, budget=Budget("time", 0.2)).sentence


def test_not_tested_and_full_at_chance():
    assert decide([]).branch == "not tested"
    unrun = ArmOutcome("full fine-tuning", "reference", "full", 0)
    assert decide([unrun, arm("a", 0, 0.001, 0.5)]).branch == "not tested"
    chance = ArmOutcome("full fine-tuning", "reference", "full", 3, mean=0.5, se=0.0,
                        verdict="reference", at_chance=True)  # fmt: skip
    decision = decide([chance, arm("a", 0.0, 0.001, 0.5)])
    assert decision.branch == "full at chance" and "chance level" in decision.sentence


def test_budget_parsing_and_its_messages():
    assert Budget.parse("params=10%") == Budget("params", 0.1)
    assert Budget.parse("time=0.5") == Budget("time", 0.5)
    assert Budget.parse("") == Budget.parse("auto") == Budget()
    for text, message in (("speed=0.5", "params=SHARE or time=SHARE"),
                          ("params=abc", "is not a number"), ("time=150%", r"share in \(0, 1\]")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            Budget.parse(text)


def test_match_notes_say_when_and_by_how_much():
    assert match_note(105, 100, "X") == "matched to X (+5.0 %)"
    assert match_note(80, 100, "X") == "not matched: 20 % fewer trainable parameters than X"


# -- runs matched to arms, and the JSON --------------------------------------------------------


def small_proposal() -> tuple[RecommendConfig, Proposal, Costs]:
    cfg = RecommendConfig(model=ModelSpec("tiny-model"), data=DataSpec("movie-snippets"),
                          steps=2, n_eval=100)  # fmt: skip
    proposal = Proposal([
        Choice("full fine-tuning", "reference", "full", "everything"),
        Choice("layer 1", "candidate", "layers", "layer 1 and the classifier", "ν", layers=(1, 1, 1)),
        Choice("BitFit", "alternative", "bitfit", "every bias", "small"),
    ])  # fmt: skip
    costs = Costs({"full fine-tuning": Cost(100, 100, 1.0, 1.0),
                   "layer 1": Cost(30, 100, 0.5, 0.5),
                   "BitFit": Cost(3, 100, 0.7, 0.7, "not matched: 90 % fewer", "layer 1")}, 0.0)  # fmt: skip
    return cfg, proposal, costs


def finish(db: RunsDB, config, accuracy: float) -> str:
    labels = np.array([0, 1] * 50)
    preds = np.where(np.arange(100) < round(accuracy * 100), labels, 1 - labels)
    run_id = db.enqueue(config, running_pid=os.getpid())
    db.finish(run_id, {"score": accuracy, "metric": "accuracy", "peak_mem_mb": 100.0 * accuracy,
                       "test_predictions": encode_predictions(preds, labels, "t", False)})  # fmt: skip
    return run_id


def planned(cfg, proposal, costs):
    """(arm name, config) of every arm × seed of the first round."""
    return [(arm.name, config) for arm, config in
            next_steps(experiment_of(cfg, proposal, costs), RunsDB().list_runs()).queue]  # fmt: skip


def outcomes(cfg, proposal, costs, runs):
    stands = standings(experiment_of(cfg, proposal, costs), runs)
    return arm_outcomes(cfg, proposal, costs, stands)


def test_runs_are_matched_by_run_group_and_seed_and_never_averaged_across_settings():
    import dataclasses

    cfg, proposal, costs = small_proposal()
    db = RunsDB()
    first = planned(cfg, proposal, costs)
    assert len(first) == 9  # r₀ = 3 seeds of each of the three arms
    # cheapest first after the reference: layer 1 (0.5×) before BitFit (0.7×)
    assert [name for name, _ in first[::3]] == ["full fine-tuning", "layer 1", "BitFit"]
    score = {"full fine-tuning": 0.8, "layer 1": 0.78, "BitFit": 0.6}
    for k, (name, config) in enumerate(first):  # k % 3: the seed's index, whatever its seed
        i = k % 3
        finish(db, config, score[name] + 0.01 * i + (0.002 if name == "layer 1" and i == 1 else 0))
    # a run of another setting (more steps) and a second run of one seed: neither counts
    other = dataclasses.replace(first[0][1], steps=50)
    finish(db, other, 0.99)
    finish(db, first[0][1], 0.80)  # seed 0 of full again, newest
    runs = db.list_runs()
    arms = {a.name: a for a in outcomes(cfg, proposal, costs, runs)}
    full = arms["full fine-tuning"]
    assert full.n_seeds == 3 and full.mean == pytest.approx(np.mean([0.80, 0.81, 0.82]))
    assert arms["BitFit"].status == "shown worse" and arms["BitFit"].verdict == "shown worse"
    layer = arms["layer 1"]
    assert layer.diff == pytest.approx(-0.02 + 0.002 / 3) and layer.n_seeds == 3
    assert layer.test == "welch"  # the seed design's test (independent seeds)
    assert layer.lo <= layer.diff <= layer.hi  # the interval belongs to the value beside it
    assert arms["BitFit"].peak_mem_mb == pytest.approx(61.0)
    assert [a.name for a in outcomes(cfg, proposal, costs, runs) if a.frontier] == [
        "full fine-tuning",
        "layer 1",
    ]  # fmt: skip  (BitFit costs more than layer 1 and scores less)


def test_the_json_has_exactly_the_schema():
    cfg, proposal, costs = small_proposal()
    db = RunsDB()
    empty = recommendation_json(cfg, proposal, costs, None, decide([]))
    assert set(empty) == {"model", "data", "budget", "design", "candidates", "runs_trained",
                          "recommendation"}  # fmt: skip
    assert empty["design"] == {
        "kind": "sequential", "r0": 3, "max_seeds": 10, "alpha": 0.025, "delta": 1.0,
        "test": "welch",
        "boundary": "Bonferroni over 8 looks: c = t(1 − α/8, Welch–Satterthwaite df)",
    }  # fmt: skip
    assert empty["runs_trained"] == 0
    assert [c["name"] for c in empty["candidates"]] == ["layer 1"]
    assert set(empty["candidates"][0]) == {"name", "method", "trains", "trainable_share",
                                           "step_time_ratio", "evidence", "lora"}  # fmt: skip
    assert empty["candidates"][0]["trainable_share"] == pytest.approx(0.3)
    assert set(empty["recommendation"]) == {"candidate", "sentence", "branch", "final"}
    for k, (name, config) in enumerate(planned(cfg, proposal, costs)):
        # layer 1 within a tenth of a point of full on every seed: it holds up at δ = 1
        i = k % 3  # the seed's index
        finish(db, config, {"full fine-tuning": 0.8, "layer 1": 0.8, "BitFit": 0.5}[name]
               + 0.001 * i + (0.0005 if name == "layer 1" and i == 2 else 0))  # fmt: skip
    arms = outcomes(cfg, proposal, costs, db.list_runs())
    decision = decide(arms, cfg.delta, cfg.budget)
    payload = recommendation_json(cfg, proposal, costs, arms, decision)
    assert list(payload) == ["model", "data", "budget", "design", "candidates", "comparison",
                             "runs_trained", "recommendation"]  # fmt: skip
    assert payload["runs_trained"] == 9
    for row in payload["comparison"]:
        assert set(row) == {"arm", "mean", "se", "n_seeds", "diff_vs_full", "margin", "lo", "hi",
                            "test", "status", "verdict", "step_time_ratio",
                            "run_step_time_ratio", "trainable_share"}  # fmt: skip
    rows = {r["arm"]: r for r in payload["comparison"]}
    assert rows["full fine-tuning"]["diff_vs_full"] is None
    assert rows["layer 1"]["diff_vs_full"] == pytest.approx(0.0005 / 3)
    assert rows["layer 1"]["status"] == "held up" and rows["layer 1"]["test"] == "welch"
    assert rows["layer 1"]["lo"] <= rows["layer 1"]["diff_vs_full"] <= rows["layer 1"]["hi"]
    assert rows["full fine-tuning"]["status"] is None
    assert payload["recommendation"]["candidate"] == "layer 1"
    pd.Series(payload)  # plain JSON types throughout
    import json

    json.dumps(payload, allow_nan=False)
