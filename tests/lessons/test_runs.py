"""A lesson's runs (`analysis.lessons.runs.LessonRuns`): the plan a Paper check step was
prepared with tells whether its runs are done, without computing the claims' inputs; the run a
Subspaces step shows."""

from __future__ import annotations

import os

from analysis.claims import ClaimsConfig
from analysis.claims.runs import PlannedRun
from analysis.lessons.runs import LessonRuns
from analysis.workspace import Workspace


def finish(db, cfg, result: dict) -> str:
    run_id = db.enqueue(cfg)
    assert db.claim_next(worker_pid=os.getpid())["id"] == run_id
    assert db.finish(run_id, result)
    return run_id


def test_a_claims_step_is_done_once_every_run_it_was_planned_with_is(tmp_path):
    runs = LessonRuns(Workspace(tmp_path / "cache"), say=lambda text: None)
    cfg = ClaimsConfig(seeds=(0, 1))
    planned = [PlannedRun(("X4",), "full", cfg.base_run(seed)) for seed in cfg.seeds]
    assert not runs.planned(cfg) and not runs.claim_runs_done(cfg)
    runs._remember_plan(cfg, planned, runs.db().list_runs())
    assert runs.planned(cfg) and not runs.claim_runs_done(cfg)
    db = runs.db()
    finish(db, planned[0].config, {})
    assert not runs.claim_runs_done(cfg)  # one of two
    finish(db, planned[1].config, {})
    assert runs.claim_runs_done(cfg)
    other = ClaimsConfig(seeds=(0, 1, 2))  # another step's plan is its own
    assert not runs.planned(other) and not runs.claim_runs_done(other)


def test_the_subspaces_step_shows_its_run_else_the_newest_with_a_trajectory(tmp_path):
    runs = LessonRuns(Workspace(tmp_path / "cache"), say=lambda text: None)
    base = ClaimsConfig().base_run()
    assert runs.trajectory_run(base.model.name) is None
    assert runs.trajectory_run(base.model.name, "chosen") == "chosen"
    folder = tmp_path / "trajectory"
    folder.mkdir()
    (folder / "index.json").write_text("{}")
    db = runs.db()
    with_trajectory = finish(db, base, {"trajectory_dir": str(folder)})
    finish(db, base, {"trajectory_dir": str(tmp_path / "gone")})  # newer, but nothing recorded
    assert runs.trajectory_run(base.model.name) == with_trajectory
    assert runs.trajectory_run("another-model") is None
