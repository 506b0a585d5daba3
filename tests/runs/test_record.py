"""The typed run record: one place reads the stored JSON; a database made with schema version 2
and old-form configs is migrated and keeps loading, grouping and labelling."""

from __future__ import annotations

import json
import sqlite3

import pytest

from analysis.finetune.config import FinetuneConfig, canonical, flat_config
from analysis.runs.db import RunsDB
from analysis.runs.migration import today
from analysis.runs.record import Run, runs_frame, runs_of
from analysis.runs.results import results_table, with_groups
from analysis.runs.schema import MIGRATIONS, migrate
from analysis.workspace import Workspace


def old_config(method, layers=None, seed=0):
    """A config as stored before ``head_lr`` existed (and before (1, L, L) was queued as full)."""
    return {"model": {"name": "tiny", "trust_remote_code": False}, "data": {"name": "toy"},
            "method": method, "layers": list(layers) if layers else None, "seed": seed,
            "steps": 5, "lr": 5e-5}  # fmt: skip


def old_file(path) -> None:
    """Schema version 2 (its SQL), rows in the old form, written with plain SQL."""
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:2]) == 2
    insert = (
        "INSERT INTO runs (id, created, status, model, data, method, label, strategy, seed, "
        "config_json, result_json) VALUES (?, ?, 'done', 'tiny', 'toy', ?, ?, ?, ?, ?, ?)"
    )
    result = {"score": 0.8, "metric": "accuracy", "n_trainable": 100, "n_params": 100}
    part = {**result, "n_trainable": 10}
    rows = [  # (1, 2, 2) on a 2-layer model trained everything: the full baseline
        ("r-whole", 1.0, "layers", "(1, 2, 2)", None, 0, old_config("layers", (1, 2, 2)), result),
        ("r-full", 2.0, "full", "full", None, 1, old_config("full"), result),
        ("r-part", 3.0, "layers", "(1, 1, 2)", None, 0, old_config("layers", (1, 1, 2)), part),
    ]  # fmt: skip
    for run_id, created, method, label, strategy, seed, config, res in rows:
        conn.execute(insert, (run_id, created, method, label, strategy, seed, json.dumps(config),
                              json.dumps(res)))  # fmt: skip
    conn.close()


def test_old_configs_load_as_typed_records_and_migrate(tmp_path):
    path = tmp_path / "runs.sqlite"
    old_file(path)
    db = RunsDB(Workspace(tmp_path))
    runs = {run.id: run for run in runs_of(db.list_runs())}
    whole, full, part = runs["r-whole"], runs["r-full"], runs["r-part"]
    assert whole.method == "full" and whole.stored["layers"] is None  # one name
    assert whole.group == full.group  # one run group
    assert part.method == "layers" and part.config.layers == (1, 1, 2)
    # Stored before head_lr: the classifier trained at lr, and the record says so.
    assert whole.config.classifier_lr == whole.config.lr == 5e-5
    assert today(flat_config(method="frozen").to_dict())["classifier_lr"] == 1e-3
    assert whole.result["score"] == 0.8 and whole.status == "done" and whole.seed == 0
    table = results_table(db.list_runs())
    assert table.set_index("id").loc["r-whole", "method"] == "full"
    assert table.set_index("id").loc["r-whole", "family"] == "baseline"
    assert table.groupby("group")["id"].count().sort_values().tolist() == [1, 2]
    labels = with_groups(db.list_runs()).set_index("id")["label"]
    assert labels["r-whole"] == "full" and labels["r-part"] == "(1, 1, 2)"
    frame = runs_frame(runs.values(), columns=["score"])
    assert frame.set_index("id").loc["r-part", "score"] == 0.8


def test_a_claimed_row_is_a_run_with_its_config(tmp_path):
    db = RunsDB(Workspace(tmp_path))
    cfg = flat_config(method="lora", lora_r=4, layers=(1, 2, 2), seed=3)
    run_id = db.enqueue(cfg, family="baseline")
    run = Run.from_row(db.claim_next(worker_pid=1, device="cpu"))
    assert run.id == run_id and run.status == "running" and run.device == "cpu"
    assert run.config == cfg and run.seed == 3 and run.family == "baseline"
    assert run.result is None and run.steps == cfg.steps and run.label == "lora 1–2 @2"


def test_layers_one_to_l_is_full_fine_tuning():
    cfg = FinetuneConfig(method="layers", layers=(1, 6, 6))
    assert canonical(cfg, 6) == FinetuneConfig(method="full")
    assert canonical(cfg, 12) is cfg  # (1, 6, 6) of 12 layers cuts the model
    assert canonical(FinetuneConfig(method="layers", layers=(2, 6, 6)), 6).method == "layers"
    with pytest.raises(ValueError, match="needs layers"):
        FinetuneConfig(method="layers")
