"""The migration of stored configs from the flat form to options under "options".

``data/flat_configs.json`` holds configs exactly as ``FinetuneConfig.to_dict`` wrote them before
options were nested (commit a4f0a32: every method's option keys flat in every config), one per
method and then some (head selections with and without their provenance, a config stored before
the classifier had its own learning rate, a ``layers`` (1, L, L) run, a user's Trainer runs), with
the run-group keys, settings and labels that code gave them. A runs database of today's schema
holding them must read, group, key and label them exactly so; their nested form must keep the
same keys; and adding a method changes none of them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import dummy_method
import pytest

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import register, unregister
from analysis.runs.db import RunsDB
from analysis.runs.record import FLAT_OPTION_DEFAULTS, Run, migrate_config, run_setting, runs_of
from analysis.runs.records import run_label
from analysis.runs.results import group_key, results_table, with_groups
from analysis.runs.schema import MIGRATIONS, migrate
from analysis.workspace import Workspace

FIXTURE = json.loads((Path(__file__).parent / "data" / "flat_configs.json").read_text("utf-8"))
RUNS = {row["id"]: row for row in FIXTURE["runs"]}
IMPORTED = {run_id for run_id, row in RUNS.items() if "origin" in row["config"]}


def database(root: Path, configs: dict[str, dict]) -> RunsDB:
    """Today's schema, one done run per config, written with plain SQL (as stored then)."""
    workspace = Workspace(root)
    workspace.root.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(workspace.runs_db, isolation_level=None)
    migrate(conn, MIGRATIONS)
    insert = (
        "INSERT INTO runs (id, created, status, model, data, method, label, strategy, seed, "
        "config_json, result_json) VALUES (?, ?, 'done', 'tiny-bert', 'toy', ?, '', ?, ?, ?, ?)"
    )
    for created, (run_id, config) in enumerate(configs.items()):
        row = RUNS[run_id]
        conn.execute(insert, (run_id, float(created), config["method"], row["strategy"],
                              config.get("seed", 0), json.dumps(config, sort_keys=True),
                              json.dumps(row["result"])))  # fmt: skip
    conn.close()
    return RunsDB(workspace)


def check_against_the_fixture(db: RunsDB) -> None:
    runs = {run.id: run for run in runs_of(db.list_runs())}
    table = results_table(db.list_runs()).set_index("id")
    listed = with_groups(db.list_runs()).set_index("id")
    for run_id, row in RUNS.items():
        want, run = row["expected"], runs[run_id]
        assert group_key(run.stored) == want["group"], run_id
        assert run_setting(run.stored) == want["setting"], run_id
        assert run_label(run.stored) == want["label"] == listed.loc[run_id, "label"], run_id
        assert listed.loc[run_id, "group"] == want["group"], run_id
        got = table.loc[run_id]
        assert (got["group"], got["label"]) == (want["table_group"], want["table_label"]), run_id
        assert (got["lr_sibling"], got["budget"]) == (want["lr_sibling"], want["budget"]), run_id
        assert got["family"] == want["family"], run_id


def test_flat_configs_read_group_key_and_label_as_they_did(tmp_path):
    db = database(tmp_path / "ws", {i: row["config"] for i, row in RUNS.items()})
    check_against_the_fixture(db)
    runs = {run.id: run for run in runs_of(db.list_runs())}
    assert runs["old-whole"].method == "full"  # (1, L, L) trained everything
    assert runs["old-whole"].config.classifier_lr == runs["old-whole"].config.lr == 5e-5
    heads = runs["heads-random"].config
    assert heads.option("heads").settings == {"selector": "random", "seed": 1}
    assert runs["lora-placed"].config.options.layers == (2, 3)
    assert runs["layers"].family == "ℓ*-down"
    for run_id in set(RUNS) - IMPORTED - {"old-whole", "old-part"}:  # each loads as it was
        assert runs[run_id].config == FinetuneConfig.from_dict(RUNS[run_id]["config"]), run_id


def test_the_nested_form_keeps_every_key(tmp_path):
    nested = {}
    for run_id, row in RUNS.items():
        stored = Run.from_row({"id": run_id, "status": "done", "config": row["config"],
                               "result": row["result"]}).stored  # fmt: skip
        nested[run_id] = stored if run_id in IMPORTED else migrate_config(stored)
    for run_id, config in nested.items():
        if run_id not in IMPORTED:
            assert set(config["options"]) <= {"layers", "r", "alpha", "ranks", "alphas", "size",
                                              "heads", "source"}  # fmt: skip
            assert not set(config) & set(FLAT_OPTION_DEFAULTS) and "head_lr" not in config
            assert FinetuneConfig.from_dict(config).to_dict() == config  # stable
        assert group_key(config) == RUNS[run_id]["expected"]["group"], run_id
    check_against_the_fixture(database(tmp_path / "ws", nested))


@pytest.fixture
def dummy():
    register(dummy_method.SPEC)
    yield dummy_method.SPEC
    unregister("dummy")


def test_a_new_method_changes_no_stored_config_and_no_key(dummy, tmp_path):
    assert "dummy_scale" not in json.dumps(FinetuneConfig(method="lora").to_dict())
    db = database(tmp_path / "ws", {i: row["config"] for i, row in RUNS.items()})
    check_against_the_fixture(db)
    # A new option left at its default keeps the method's keys too (LoRA's per-layer ranks).
    lora = RUNS["lora-placed"]
    with_ranks = {**lora["config"], "lora_ranks": None, "lora_alphas": None}
    assert group_key(with_ranks) == lora["expected"]["group"]
    assert group_key({**with_ranks, "lora_ranks": {"2": 4, "3": 4}}) != lora["expected"]["group"]
