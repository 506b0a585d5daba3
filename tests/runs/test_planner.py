"""The experiment planner on fabricated runs: the grid, sequential rounds cheapest first (the
next round, the arms not needed, their queued runs cancelled), the whole table, the seed designs,
stored experiments advanced as runs end, and failures never re-queued by a round."""

from __future__ import annotations

import os

import pytest

from analysis.config import DataSpec, ModelSpec
from analysis.finetune.config import FinetuneConfig
from analysis.runs.db import RunsDB
from analysis.runs.execute import RunRecorder
from analysis.runs.planner import (
    FIXED,
    SEQUENTIAL,
    WHOLE_TABLE,
    Experiment,
    PlannedArm,
    advance,
    next_steps,
    progress,
    seed_list,
    standings,
    start,
)
from analysis.runs.sequential import SequentialDesign

BASE = FinetuneConfig(model=ModelSpec("tiny-model"), data=DataSpec("movie-snippets"), steps=2)
DESIGN = SequentialDesign(delta=0.01, r0=3, r_max=5)


def arms() -> tuple[PlannedArm, ...]:
    return (
        PlannedArm("full fine-tuning", BASE, reference=True),
        PlannedArm("bitfit", FinetuneConfig(model=BASE.model, data=BASE.data, method="bitfit",
                                            steps=2)),
        PlannedArm("frozen", FinetuneConfig(model=BASE.model, data=BASE.data, method="frozen",
                                            steps=2)),
    )  # fmt: skip


def sequential(**kw) -> Experiment:
    """A sequential experiment under common random numbers (the mechanics read seed by seed)."""
    return Experiment(arms(), seeds=seed_list((0, 1, 2), 5), policy=SEQUENTIAL, design=DESIGN,
                      seed_design="common", **kw)  # fmt: skip


def finish(db: RunsDB, config: FinetuneConfig, score: float, sweep: str | None = None) -> str:
    run_id = db.enqueue(config, sweep_id=sweep, running_pid=os.getpid())
    db.finish(run_id, {"score": score, "metric": "accuracy"})
    return run_id


SCORES = {  # seed → score: bitfit a tenth of a point under full, frozen 10 points under
    "full fine-tuning": [0.80, 0.82, 0.81, 0.83, 0.80],
    "bitfit": [0.799, 0.8195, 0.8092, 0.8295, 0.7991],
    "frozen": [0.70, 0.72, 0.715, 0.73, 0.70],
}


def test_a_grid_queues_every_arm_and_seed_reference_first_and_reuses_what_is_done():
    grid = Experiment(arms(), seeds=(0, 1), policy=FIXED, seed_design="common")
    db = RunsDB()
    steps = next_steps(grid, db.list_runs())
    assert [(a.name, c.seed) for a, c in steps.queue] == [
        ("full fine-tuning", 0), ("full fine-tuning", 1), ("bitfit", 0), ("bitfit", 1),
        ("frozen", 0), ("frozen", 1),
    ]  # fmt: skip
    finish(db, BASE, 0.8)
    failed = db.enqueue(arms()[1].run(1), running_pid=os.getpid())
    db.fail(failed, "boom")
    runs = db.list_runs()
    queued = [(a.name, c.seed) for a, c in next_steps(grid, runs).queue]
    assert ("full fine-tuning", 0) not in queued and ("bitfit", 1) in queued  # failed: again
    assert ("bitfit", 1) not in [(a.name, c.seed) for a, c in
                                 next_steps(grid, runs, retry=False).queue]  # fmt: skip
    assert standings(grid, runs)["bitfit"][1].status == "failed"
    assert next_steps(grid, runs).cancel == []  # a grid never cancels


def test_sequential_rounds_start_cheapest_first_and_stop_once_a_cheaper_arm_holds_up():
    experiment = sequential()
    db = RunsDB()
    first = next_steps(experiment, db.list_runs())
    assert [(a.name, c.seed) for a, c in first.queue] == [
        (name, s) for name in ("full fine-tuning", "bitfit", "frozen") for s in (0, 1, 2)
    ]  # r₀ = 3 seeds each, the reference first, then the arms as ordered (cheapest first)
    ids = {(a.name, c.seed): db.enqueue(c, sweep_id="x") for a, c in first.queue}
    for name in ("full fine-tuning", "bitfit"):
        for s in (0, 1, 2):
            db.request_cancel(ids[(name, s)])
            finish(db, arms()[["full fine-tuning", "bitfit"].index(name)].run(s), SCORES[name][s])
    runs = db.list_runs()
    state = progress(experiment, runs)
    # bitfit held up (3 pairs within a tenth of a point of full), so frozen is not needed
    assert (state.decided, state.in_play, state.most_still) == (2, 2, 0)
    steps = next_steps(experiment, runs)
    # frozen, costlier, is not needed: its queued runs are cancelled, nothing more is queued
    assert sorted(steps.cancel) == sorted(ids[("frozen", s)] for s in (0, 1, 2))
    assert steps.queue == []


def test_an_undecided_arm_and_full_get_one_more_seed_and_a_worse_arm_none():
    experiment = sequential(order=("frozen", "bitfit"))  # frozen ordered first: cheaper
    db = RunsDB()
    noisy = {
        "full fine-tuning": [0.80, 0.84, 0.78],
        "bitfit": [0.81, 0.80, 0.80],
        "frozen": [0.70, 0.741, 0.679],
    }  # fmt: skip  (frozen: 10 points under, seed by seed)
    for arm in arms():
        scores = noisy[arm.name]
        for s in (0, 1, 2):
            finish(db, arm.run(s), scores[s])
    steps = next_steps(experiment, db.list_runs())
    assert sorted((a.name, c.seed) for a, c in steps.queue) == [
        ("bitfit", 3),
        ("full fine-tuning", 3),
    ]  # frozen shown worse (10 points under): no more seeds
    text = progress(experiment, db.list_runs()).text()
    assert "round 1" in text and "1 of 2 arms decided" in text


def test_the_whole_table_trains_every_arm_to_r_max():
    table = Experiment(arms(), seeds=seed_list((0, 1, 2), 5), policy=WHOLE_TABLE, design=DESIGN)
    queued = next_steps(table, RunsDB().list_runs()).queue
    assert len(queued) == 3 * 5


def test_independent_seeds_give_every_arm_but_the_reference_seeds_of_its_own():
    common = Experiment(arms(), seeds=(0, 1), policy=FIXED, seed_design="common")
    apart = Experiment(arms(), seeds=(0, 1), policy=FIXED, seed_design="independent")
    same = {(a.name, c.seed) for a, c in next_steps(common, RunsDB().list_runs()).queue}
    own = {(a.name, c.seed) for a, c in next_steps(apart, RunsDB().list_runs()).queue}
    assert {s for name, s in same} == {0, 1}
    assert {s for name, s in own if name == "full fine-tuning"} == {0, 1}
    bitfit = {s for name, s in own if name == "bitfit"}
    assert len(bitfit) == 2 and not bitfit & {0, 1}
    assert bitfit != {s for name, s in own if name == "frozen"}


def test_an_experiment_round_trips_and_checks_itself():
    experiment = sequential(order=("bitfit",))
    again = Experiment.from_dict(experiment.to_dict())
    assert again.to_dict() == experiment.to_dict() and again.answers == ("bitfit",)
    with pytest.raises(ValueError, match="design"):
        Experiment(arms(), policy=SEQUENTIAL)
    with pytest.raises(ValueError, match="R_max"):
        Experiment(arms(), seeds=(0, 1, 2), policy=SEQUENTIAL, design=DESIGN)
    with pytest.raises(ValueError, match="compared arms"):
        sequential(order=("nope",))
    assert seed_list((5, 7), 4) == (5, 7, 8, 9)


def test_a_stored_experiment_takes_its_next_round_when_a_run_ends_and_not_once_stopped():
    db = RunsDB()
    experiment = sequential(order=("frozen", "bitfit"))
    noisy = {"full fine-tuning": [0.80, 0.84, 0.78], "bitfit": [0.81, 0.80, 0.80],
             "frozen": [0.70, 0.741, 0.679]}  # fmt: skip
    ids = start(db, experiment, db.list_runs(), "exp-1")
    assert len(ids) == 9 and db.experiment_spec("exp-1") is not None
    for _ in ids:
        db.claim_next(os.getpid())
    for run_id in ids:
        run = db.get_run(run_id)
        config = FinetuneConfig.from_dict(run["config"])
        name = next(a.name for a in experiment.arms if a.run(config.seed) == config)
        recorder = RunRecorder(db, run_id)
        recorder.done({"score": noisy[name][config.seed], "metric": "accuracy"})
    # the last run's end took the next round: full's and bitfit's fourth seeds
    queued = db.list_runs(status="queued")
    assert sorted(zip(queued["method"], queued["seed"], strict=True)) == [
        ("bitfit", 3), ("full", 3)
    ]  # fmt: skip
    assert advance(db, "exp-1") == []  # taken once: nothing more until those end
    assert db.stop_experiment("exp-1")
    assert advance(db, "exp-1") == [] and db.experiment_spec("exp-1") is None


def test_cancelling_the_rest_stops_the_experiment_and_its_own_cancellations_do_not():
    db = RunsDB()
    ids = start(db, sequential(), db.list_runs(), "exp-2")
    db.cancel_runs(ids[:1], stop=False)  # as the planner cancels a run it no longer needs
    assert db.experiment_spec("exp-2") is not None
    db.cancel_runs(sweep_id="exp-2")  # "Cancel the rest" (the page, `runs cancel --sweep`)
    assert db.experiment_spec("exp-2") is None and advance(db, "exp-2") == []
    assert set(db.list_runs()["status"]) == {"cancelled"}
