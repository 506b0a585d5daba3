"""The migration to schema version 3, from a runs database as schema version 2 stored it.

``data/schema_v2_runs.json`` holds the rows of such a database (every column, as that code wrote
them: configs of every method in the nested form, LoRA / adapter / IA³ / EVA placements, head
selections, subspaces, flat configs with ``head_lr`` and without any classifier rate, a
``layers`` (1, L, L) run, imported runs, arm names in the ``strategy`` column) and the run group
and label that code listed for each. Opened by today's code, every run keeps its group and label,
its config reads in today's stored form, a new seed of an old setting joins the old group, and a
new setting's key holds its own method's options only.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from analysis.config import DataSpec, ModelSpec
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.methods.eva import EvaOptions
from analysis.finetune.methods.heads import HeadsOptions
from analysis.finetune.methods.lora import LoraOptions
from analysis.finetune.methods.subspace import SubspaceOptions
from analysis.finetune.registry import flat_defaults
from analysis.heads.selection_file import HeadSelection
from analysis.runs.db import RunsDB
from analysis.runs.record import run_setting, runs_of, setting_key
from analysis.runs.results import group_of, results_table, with_groups
from analysis.runs.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from analysis.workspace import Workspace

FIXTURE = json.loads((Path(__file__).parent / "data" / "schema_v2_runs.json").read_text("utf-8"))
ROWS = {run["row"]["id"]: run["row"] for run in FIXTURE["runs"]}
EXPECTED = {run["row"]["id"]: run["expected"] for run in FIXTURE["runs"]}
BASE = dict(model=ModelSpec("tiny-bert"), data=DataSpec("toy"), steps=20, eval_every=10)


@pytest.fixture
def db(tmp_path) -> RunsDB:
    """The fixture's rows in a file of schema version 2 (its SQL), opened by today's code."""
    workspace = Workspace(tmp_path / "ws")
    workspace.root.mkdir(parents=True)
    conn = sqlite3.connect(workspace.runs_db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:2]) == FIXTURE["schema_version"] == 2
    for row in ROWS.values():
        names = ", ".join(row)
        conn.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' * len(row))})",
                     list(row.values()))  # fmt: skip
    conn.close()
    return RunsDB(workspace)


def test_every_run_keeps_its_group_and_label(db):
    assert db.pragma("user_version") == SCHEMA_VERSION == 4
    stored = db.list_runs().set_index("id")["group_key"]
    listed = with_groups(db.list_runs()).set_index("id")
    for run_id, want in EXPECTED.items():
        assert stored[run_id] == listed.loc[run_id, "group"] == want["group"], run_id
        assert listed.loc[run_id, "label"] == want["label"], run_id
    table = results_table(db.list_runs(), l_star=3, n_layers=4).set_index("id")
    for run_id in table.index:
        assert table.loc[run_id, "group"] == EXPECTED[run_id]["group"], run_id
        assert table.loc[run_id, "method"] == EXPECTED[run_id]["method"], run_id
    # Today's formula alone would have moved runs to other groups: the stored keys keep them.
    moved = [i for i in ROWS if setting_key(db.get_run(i)["config"]) != EXPECTED[i]["group"]]
    assert len(moved) > len(ROWS) // 2


def test_configs_are_stored_under_todays_names(db):
    with sqlite3.connect(db.path) as conn:
        columns = [c[1] for c in conn.execute("PRAGMA table_info(runs)")]
        stored = dict(conn.execute("SELECT id, config_json FROM runs").fetchall())
    assert "strategy" not in columns and {"family", "group_key", "setting_key"} <= set(columns)
    renamed = 0
    for run_id, text in stored.items():
        assert "head_lr" not in text, run_id
        config = json.loads(text)
        before = json.loads(ROWS[run_id]["config_json"])
        assert len(config.get("layers") or ()) in (0, 2), run_id
        if "origin" not in config:
            assert FinetuneConfig.from_dict(config).to_dict() == config, run_id  # today's form
            assert not set(config) & set(flat_defaults()), run_id
        renamed += sum(name in before for name in ("head_lr", *flat_defaults()))
        renamed += len(before.get("layers") or ()) == 3
        renamed += "layers" in (before.get("options") or {}) and run_id != "layer-set"
    assert renamed >= 20
    runs = {run.id: run for run in runs_of(db.list_runs())}
    assert runs["lora-placed"].config.options.layers_to_transform == (2, 3)
    assert runs["lora-placed"].stored["layers"] == [2, 3]
    assert runs["lora-placed"].stored["classifier_layer"] == 3
    assert runs["flat-lora-head-lr"].config == runs["lora-placed"].config
    assert runs["eva"].config.options.layers_to_transform == (3, 4)
    assert runs["layer-set"].config.options.layers == (2, 4)  # a layer set, not a placement
    assert runs["no-classifier-rate"].config.classifier_lr == runs["no-classifier-rate"].config.lr
    assert (
        runs["whole-layers"].method == "full"
        and runs["whole-layers"].group == runs["full-s0"].group
    )
    assert runs["trainer-custom"].stored["origin"]["kind"] == "trainer-import"


def test_the_family_column_holds_families_only(db):
    families = {run.id: run.family for run in runs_of(db.list_runs())}
    assert families["layers-s0"] == "ℓ*-down" and families["layers-up"] == "ℓ*-up"
    assert families["full-s0"] == "baseline"
    for arm in ("lora-ranks", "lora-uniform", "eva", "layer-set", "heads-pagerank", "subspace"):
        assert families[arm] is None, arm  # "recommend …", "claims …", a comparison's group


def test_a_new_seed_of_an_old_setting_joins_its_group(db):
    selection = HeadSelection({1: [0, 1], 2: [3]}, settings={"selector": "pagerank", "k": 2,
                                                             "xi": 0.5})  # fmt: skip
    again = {
        "full-s0": FinetuneConfig(**BASE, method="full"),
        "layers-s0": FinetuneConfig(**BASE, method="layers", layers=(1, 3, 3)),
        "lora-placed": FinetuneConfig(**BASE, method="lora", layers=(2, 3, 3),
                                      options=LoraOptions(layers_to_transform=(2, 3))),
        "lora-ranks": FinetuneConfig(**BASE, method="lora",
                                     options=LoraOptions(ranks=((2, 4), (3, 16)))),
        "eva": FinetuneConfig(**BASE, method="lora-eva",
                              options=EvaOptions(layers_to_transform=(3, 4), r=4)),
        "heads-pagerank": FinetuneConfig(**BASE, method="heads", options=HeadsOptions(selection)),
        "subspace": FinetuneConfig(**BASE, method="subspace", options=SubspaceOptions("full-s0")),
        "whole-layers": FinetuneConfig(**BASE, method="layers", layers=(1, 4, 4)),
    }  # fmt: skip
    runs = db.list_runs()
    for run_id, cfg in again.items():
        planned = dataclasses.replace(cfg, seed=9)
        assert group_of(planned.to_dict(), runs) == EXPECTED[run_id]["group"], run_id
        new = db.enqueue(planned)
        assert db.get_run(new)["group_key"] == EXPECTED[run_id]["group"], run_id
    assert EXPECTED["whole-layers"]["group"] == EXPECTED["full-s0"]["group"]


def test_a_new_setting_hashes_only_what_it_is(db):
    cfg = FinetuneConfig(**BASE, method="lora", options=LoraOptions(r=2), classifier_lr=2e-3)
    run = db.get_run(db.enqueue(cfg))
    assert run["group_key"] == run["setting_key"] == setting_key(cfg.to_dict())
    setting = run_setting(cfg.to_dict())
    assert setting["lora_r"] == 2 and setting["classifier_lr"] == 2e-3
    others = set(flat_defaults()) - {"lora_r"}
    assert not others & set(setting) and "head_lr" not in setting and "options" not in setting
    assert setting_key(cfg.to_dict()) not in {want["group"] for want in EXPECTED.values()}
