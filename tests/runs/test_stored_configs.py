"""Configs stored flat, through the migration to schema version 3.

``data/flat_configs.json`` holds configs exactly as ``FinetuneConfig.to_dict`` wrote them before
options were nested (commit a4f0a32: every method's option keys flat in every config), one per
method and then some (head selections with and without their provenance, a config stored before
the classifier had its own learning rate, a ``layers`` (1, L, L) run, a user's Trainer runs), with
the run-group keys and labels that code gave them. A runs database of schema version 2 holding
them, opened by today's code, must group, key and label them exactly so, hold them in today's
stored form, and keep doing so when a method is added.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import dummy_method
import pytest

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import flat_defaults, register, unregister
from analysis.runs.db import RunsDB
from analysis.runs.record import runs_of, setting_key
from analysis.runs.records import run_label
from analysis.runs.results import results_table, with_groups
from analysis.runs.schema import MIGRATIONS, migrate
from analysis.workspace import Workspace

FIXTURE = json.loads((Path(__file__).parent / "data" / "flat_configs.json").read_text("utf-8"))
RUNS = {row["id"]: row for row in FIXTURE["runs"]}
IMPORTED = {run_id for run_id, row in RUNS.items() if "origin" in row["config"]}


def database(root: Path) -> RunsDB:
    """Schema version 2, one done run per config, written with plain SQL (as stored then), opened
    (and so migrated) by today's code."""
    workspace = Workspace(root)
    workspace.root.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(workspace.runs_db, isolation_level=None)
    migrate(conn, MIGRATIONS[:2])
    insert = (
        "INSERT INTO runs (id, created, status, model, data, method, label, strategy, seed, "
        "config_json, result_json) VALUES (?, ?, 'done', 'tiny-bert', 'toy', ?, '', ?, ?, ?, ?)"
    )
    for created, (run_id, row) in enumerate(RUNS.items()):
        config = row["config"]
        conn.execute(insert, (run_id, float(created), config["method"], row["strategy"],
                              config.get("seed", 0), json.dumps(config, sort_keys=True),
                              json.dumps(row["result"])))  # fmt: skip
    conn.close()
    return RunsDB(workspace)


def check_against_the_fixture(db: RunsDB) -> None:
    runs = {run.id: run for run in runs_of(db.list_runs())}
    table = results_table(db.list_runs()).set_index("id")
    listed = with_groups(db.list_runs()).set_index("id")
    siblings = {}
    for run_id, row in RUNS.items():
        want, run = row["expected"], runs[run_id]
        assert run.group == listed.loc[run_id, "group"] == want["group"], run_id
        assert run_label(run.stored) == want["label"] == listed.loc[run_id, "label"], run_id
        got = table.loc[run_id]
        table_label = want["table_label"].replace("head_lr", "classifier_lr")
        assert (got["group"], got["label"]) == (want["table_group"], table_label), run_id
        assert got["budget"] == want["budget"] and got["family"] == want["family"], run_id
        siblings.setdefault(want["lr_sibling"], set()).add(got["lr_sibling"])
    assert all(len(now) == 1 for now in siblings.values())  # learning-rate grids as they were
    assert len({s for now in siblings.values() for s in now}) == len(siblings)


def test_flat_configs_keep_their_groups_and_labels_in_todays_form(tmp_path):
    db = database(tmp_path / "ws")
    check_against_the_fixture(db)
    runs = {run.id: run for run in runs_of(db.list_runs())}
    assert runs["old-whole"].method == "full"  # (1, L, L) trained everything
    assert runs["old-whole"].config.classifier_lr == runs["old-whole"].config.lr == 5e-5
    heads = runs["heads-random"].config
    assert heads.option("heads").settings == {"selector": "random", "seed": 1}
    assert runs["lora-placed"].config.options.layers_to_transform == (2, 3)
    assert runs["lora-placed"].config.layers == (2, 3, 3)
    assert runs["layers"].family == "ℓ*-down"
    for run_id, run in runs.items():
        stored = run.stored
        assert "head_lr" not in stored and len(stored.get("layers") or ()) in (0, 2), run_id
        if run_id in IMPORTED:  # a config that does not load keeps its keys, renamed
            continue
        assert not set(stored) & set(flat_defaults()), run_id
        assert FinetuneConfig.from_dict(stored).to_dict() == stored, run_id  # stable
        assert set(stored["options"]) <= {"layers_to_transform", "r", "alpha", "ranks",
                                          "alphas", "size", "heads", "source"}  # fmt: skip


def test_a_new_seed_of_a_flat_setting_joins_its_group(tmp_path):
    db = database(tmp_path / "ws")
    for run_id in ("full-0", "lora-placed", "heads-random", "old-part", "trainer-lora"):
        new = db.enqueue({**db.get_run(run_id)["config"], "seed": 11})
        assert db.get_run(new)["group_key"] == RUNS[run_id]["expected"]["group"], run_id


@pytest.fixture
def dummy():
    register(dummy_method.SPEC)
    yield dummy_method.SPEC
    unregister("dummy")


def test_a_new_method_changes_no_stored_config_and_no_key(dummy, tmp_path):
    assert "dummy_scale" not in json.dumps(FinetuneConfig(method="lora").to_dict())
    check_against_the_fixture(database(tmp_path / "ws"))
    # A new option left at its default keeps the method's keys too (LoRA's per-layer ranks).
    lora = FinetuneConfig(method="lora", layers=(2, 3, 3)).to_dict()
    without = {**lora, "options": {k: v for k, v in lora["options"].items() if k != "ranks"}}
    assert setting_key(without) == setting_key(lora)
    assert setting_key({**lora, "options": {**lora["options"], "ranks": {"2": 4}}}) != setting_key(
        lora
    )
