"""What the export refuses, each with one clear message: an unknown run id, what cannot be
expressed (subspace methods, zeroed weights, a family without a mapping, a PEFT without a
field), and a LoRA recipe applied without PEFT (a recipe for another model:
test_portable.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import transformers as tf
from exported import import_recipe_module
from tiny import make_tiny_model_dir

import analysis.hf_names as hf_names
from analysis.config import ModelSpec
from analysis.export.build import build_recipe, write_recipe
from analysis.finetune.config import flat_config
from analysis.models import load_model
from tunescope.cli import main


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("bad-export"))
    return folder, load_model(ModelSpec(str(folder)), device="cpu")


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_an_unknown_run_id(tmp_path, capsys):
    assert main(["export", "--run", "nope", "--out", str(tmp_path / "r")]) == 2
    assert "'nope' matches no run" in error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_subspace_methods_are_refused_with_the_reason(tmp_path, capsys):
    assert main(["export", "--method", "subspace-random", "--out", str(tmp_path / "r")]) == 2
    assert "cannot be exported: random-subspace training re-parameterises" in error_line(capsys)


def test_a_stored_subspace_run_is_refused(tmp_path, capsys, bert):
    from analysis.runs.db import RunsDB

    folder, _ = bert
    config = flat_config(model={"name": str(folder)}, method="subspace", subspace_from="x-y-z")
    run_id = RunsDB().enqueue(config)
    assert main(["export", "--run", run_id, "--out", str(tmp_path / "r")]) == 2
    assert "Method 'subspace' cannot be exported" in error_line(capsys)


def test_zeroed_weights_are_refused(bert, tmp_path):
    folder, loaded = bert
    cfg = flat_config(model={"name": str(folder)}, zero_weights=str(tmp_path / "z.json"))
    with pytest.raises(ValueError, match="zeroed weights"):
        build_recipe(cfg, loaded, 2)


def test_a_family_without_a_mapping(bert, monkeypatch):
    folder, loaded = bert
    monkeypatch.delitem(hf_names.HF_CLASSIFIERS, "bert")
    with pytest.raises(ValueError, match="bert family has no export mapping"):
        build_recipe(flat_config(model={"name": str(folder)}), loaded, 2)


@dataclasses.dataclass
class OlderLoraConfig:
    """A LoraConfig as an older PEFT has it: no per-layer rank and alpha patterns."""

    r: int = 8
    lora_alpha: float = 8
    lora_dropout: float = 0.0
    bias: str = "none"
    target_modules: Any = None
    layers_to_transform: Any = None
    layers_pattern: Any = None
    task_type: Any = None
    modules_to_save: Any = None


def test_a_peft_without_a_field(bert, monkeypatch):
    """Refused before any model is built: that PEFT would write an adapter_config.json that
    says less than what the run trains."""
    import peft

    folder, loaded = bert
    monkeypatch.setattr(peft, "LoraConfig", OlderLoraConfig)
    cfg = flat_config(model={"name": str(folder)}, method="lora")
    with pytest.raises(ValueError, match=r"cannot be exported: peft .* has no LoraConfig field "
                                         r"rank_pattern, alpha_pattern: .* upgrade peft"):  # fmt: skip
        build_recipe(cfg, loaded, 2)


def test_a_lora_recipe_needs_peft_first(bert, tmp_path):
    folder, loaded = bert
    cfg = flat_config(model={"name": str(folder)}, method="lora")
    write_recipe(build_recipe(cfg, loaded, 2), tmp_path / "r")
    tr = import_recipe_module(tmp_path / "r")
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    with pytest.raises(tr.RecipeError, match="get_peft_model"):
        tr.apply_recipe(model, tr.load_recipe(tmp_path / "r"))
