"""The Runs page (AppTest): rows selected in the table are compared, tagged, cancelled and
deleted together."""

from __future__ import annotations

import numpy as np
from apptest_utils import cancel_the_rest, errors, make_app

from analysis.predictions import encode_predictions
from analysis.runs.db import RunsDB
from ui.runs.selection import action_key, table_key

PAGE = "views/runs.py"
LABELS = np.array([0, 1] * 50)


def config(model_dir, **settings) -> dict:
    """A run of the tiny model (the Runs page offers a done run's recipe, built from its model)."""
    return {"model": {"name": str(model_dir)}, "data": {"name": "movie-snippets"},
            "method": "full", "steps": 3, **settings}  # fmt: skip


def finished(db: RunsDB, model_dir, method: str, seed: int, accuracy: float) -> str:
    run_id = db.enqueue(config(model_dir, method=method, seed=seed))
    db.claim_next(worker_pid=1)
    preds = np.where(np.arange(100) < accuracy * 100, LABELS, 1 - LABELS)
    db.finish(run_id, {"score": float(np.mean(preds == LABELS)), "metric": "accuracy",
                       "test_predictions": encode_predictions(preds, LABELS, "t", False)})  # fmt: skip
    return run_id


def select(at, *run_ids: str):
    """Tick the rows of ``run_ids`` in the table, as a click on their boxes does."""
    shown = at.dataframe[0].value["id"].tolist()
    rows = [shown.index(run_id) for run_id in run_ids]
    at.session_state[table_key(shown)] = {"selection": {"rows": rows, "columns": [], "cells": []}}
    return at.run()


def runs_page(model_dir, monkeypatch):
    return make_app(model_dir, monkeypatch).switch_page(PAGE).run()


def test_the_selected_runs_groups_and_the_verdict_between_two(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    frozen = [finished(db, tiny_bert_dir, "frozen", s, 0.6 + s / 100) for s in range(3)]
    full = [
        finished(db, tiny_bert_dir, "full", s, 0.9 + s / 100) for s in range(3)
    ]  # the newest, shown in full
    at = runs_page(tiny_bert_dir, monkeypatch)
    assert any("Select runs in the table" in c.value for c in at.caption)
    assert not [r for r in at.radio if r.key == "runs_action"]  # nothing selected: no actions

    select(at, *full, frozen[0])
    assert not errors(at), errors(at)
    assert at.radio(key="runs_action").value == "Compare"
    groups = next(d.value for d in at.dataframe if "n_seeds" in d.value.columns)
    assert dict(zip(groups["label"], groups["n_seeds"], strict=True)) == {"full": 3, "frozen": 1}
    verdict = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert len(verdict) == 1 and {verdict["a"].iloc[0], verdict["b"].iloc[0]} == {"full", "frozen"}
    assert abs(verdict["diff"].iloc[0]) > 0.25 and verdict["paired_p"].iloc[0] < 0.01
    assert len(at.get("plotly_chart")) >= 2  # the forest plot, and the curves below

    select(at, full[0])  # one group: its row, and no verdict
    assert not any("verdict" in d.value.columns for d in at.dataframe)
    assert any("Select the runs of two groups" in c.value for c in at.caption)


def test_a_tag_is_added_to_every_selected_run(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    a, b, c = (finished(db, tiny_bert_dir, "full", s, 0.8) for s in range(3))
    db.set_tags(a, "baseline")
    at = select(runs_page(tiny_bert_dir, monkeypatch), a, b)
    at.radio(key="runs_action").set_value("Tag").run()
    next(x for x in at.text_input if x.label == "Tag to add").input("keep")
    next(x for x in at.button if x.label == "Add to the 2 runs").click().run()
    assert not errors(at), errors(at)
    assert [db.tags(i) for i in (a, b, c)] == [["baseline", "keep"], ["keep"], []]
    assert any("Tagged 2 runs: keep" in t.value for t in at.toast)


def test_the_selected_queued_and_running_runs_are_cancelled(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    done = finished(db, tiny_bert_dir, "full", 0, 0.8)
    running = db.enqueue(config(tiny_bert_dir))
    db.claim_next(worker_pid=1)  # pid 1 is alive: never reaped
    queued, kept = (db.enqueue(config(tiny_bert_dir, seed=s)) for s in (1, 2))
    at = select(runs_page(tiny_bert_dir, monkeypatch), done, running, queued)
    at.radio(key="runs_action").set_value("Cancel").run()
    key = action_key("cancel", [done, running, queued])
    assert cancel_the_rest(at, key) == "Cancel the selected (1 queued, 1 running)"
    assert not errors(at), errors(at)
    assert db.get_run(queued)["status"] == "cancelled" and db.cancel_requested(running)
    assert db.get_run(kept)["status"] == "queued"  # not selected
    assert db.get_run(done)["status"] == "done"


def test_the_selected_finished_runs_are_deleted_once_confirmed(tiny_bert_dir, monkeypatch):
    db = RunsDB()
    a, b, keep = (finished(db, tiny_bert_dir, "full", s, 0.8) for s in range(3))
    db.log_step(a, 1, {"loss": 0.5})
    queued = db.enqueue(config(tiny_bert_dir))
    at = select(runs_page(tiny_bert_dir, monkeypatch), a, b, queued)
    at.radio(key="runs_action").set_value("Delete").run()
    assert any("1 of them are queued or running" in c.value for c in at.caption)
    assert not any(x.key == "runs_selected_delete" for x in at.button)  # not before the tick
    at.checkbox(key=action_key("sure", [a, b])).check().run()
    at.button(key="runs_selected_delete").click().run()
    assert not errors(at), errors(at)
    assert set(db.list_runs()["id"]) == {keep, queued}
    assert db.steps(a).empty
    assert set(at.dataframe[0].value["id"]) == {keep, queued}
    assert not [r for r in at.radio if r.key == "runs_action"]  # the rows changed: no selection
