"""The recipe download buttons (ui/export.py): the Runs page offers a finished run as a recipe
zip whose recipe.json names that run and trains what it trained; the Layers page offers ℓ*-down."""

from __future__ import annotations

import io
import json
import zipfile

from apptest_utils import errors, make_app
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import app_test

from analysis.config import ModelSpec
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.methods.heads import HeadsOptions
from analysis.heads.selection_file import HeadSelection
from analysis.runs.db import RunsDB


def media_stores(monkeypatch) -> list[MemoryMediaFileStorage]:
    stores: list[MemoryMediaFileStorage] = []

    class Kept(MemoryMediaFileStorage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            stores.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Kept)
    return stores


def download(at, stores, label: str) -> bytes:
    button = next(b for b in at.get("download_button") if b.proto.label.startswith(label))
    return stores[-1].get_file(button.proto.url.rsplit("/", 1)[-1]).content


def test_the_runs_page_offers_a_run_as_a_recipe(tiny_bert_dir, monkeypatch):
    stores = media_stores(monkeypatch)
    cfg = FinetuneConfig(
        model=ModelSpec(str(tiny_bert_dir)), method="heads",
        options=HeadsOptions(HeadSelection({1: [0, 1]})), steps=3,
    )  # fmt: skip
    db = RunsDB()
    run_id = db.enqueue(cfg)
    db.claim_next(worker_pid=1)
    db.finish(run_id, {"score": 0.6, "metric": "accuracy", "n_trainable": 1})
    at = make_app(tiny_bert_dir, monkeypatch)
    at.switch_page("views/runs.py").run()
    assert not errors(at)
    archive = zipfile.ZipFile(io.BytesIO(download(at, stores, "This run as a recipe")))
    assert {"recipe/recipe.json", "recipe/tunescope_recipe.py", "recipe/README.md"} <= set(
        archive.namelist()
    )
    recipe = json.loads(archive.read("recipe/recipe.json"))
    assert recipe["provenance"]["run_id"] == run_id
    assert recipe["method"] == "heads"
    assert [m["param"] for m in recipe["train"]["masks"]][:2] == [
        "encoder.layer.0.attention.self.query.weight",
        "encoder.layer.0.attention.self.query.bias",
    ]


def test_the_layers_page_offers_l_star_down(tiny_bert_dir, monkeypatch):
    stores = media_stores(monkeypatch)
    at = make_app(tiny_bert_dir, monkeypatch)
    at.switch_page("views/layers.py").run()
    assert not errors(at)
    archive = zipfile.ZipFile(io.BytesIO(download(at, stores, "ℓ*-down")))
    recipe = json.loads(archive.read("recipe/recipe.json"))
    l_star = recipe["provenance"]["l_star"]
    assert recipe["method"] == "layers" and recipe["keep_layers"] == l_star


def test_the_finetune_page_offers_a_finished_run_below_its_results(tiny_bert_dir, monkeypatch):
    stores = media_stores(monkeypatch)
    cfg = FinetuneConfig(model=ModelSpec(str(tiny_bert_dir)), method="lora", steps=3)
    db = RunsDB()
    run_id = db.enqueue(cfg)
    db.claim_next(worker_pid=1)
    db.finish(run_id, {"score": 0.6, "metric": "accuracy", "n_trainable": 1})
    at = make_app(tiny_bert_dir, monkeypatch)
    at.switch_page("views/finetune.py").run()
    assert not errors(at), errors(at)
    picker = next(s for s in at.selectbox if s.label == "Take a finished run home as a recipe")
    assert picker.value == run_id
    archive = zipfile.ZipFile(io.BytesIO(download(at, stores, "This run as a recipe")))
    assert "recipe/adapter_config.json" in archive.namelist()
    recipe = json.loads(archive.read("recipe/recipe.json"))
    assert recipe["method"] == "lora" and recipe["provenance"]["run_id"] == run_id


def test_the_heads_page_offers_its_selection(tiny_bert_dir, monkeypatch):
    stores = media_stores(monkeypatch)
    at = make_app(tiny_bert_dir, monkeypatch)
    at.switch_page("views/heads.py").run()
    assert not errors(at), errors(at)
    archive = zipfile.ZipFile(io.BytesIO(download(at, stores, "These heads as a recipe")))
    recipe = json.loads(archive.read("recipe/recipe.json"))
    assert recipe["method"] == "heads" and recipe["train"]["masks"]
    assert recipe["provenance"]["source"] == "page"
    assert recipe["provenance"]["selection"]["selector"]
