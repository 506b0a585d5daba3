"""LoRA with a rank and an alpha per layer: the options validate themselves, the export writes
PEFT's ``rank_pattern`` / ``alpha_pattern`` / ``layers_to_transform`` (0-based, in
adapter_config.json only), ``LoraConfig.from_pretrained`` + ``get_peft_model`` build exactly
the ranks asked for, and the export hook counts the trainable entries exactly, before any model
is built."""

from __future__ import annotations

import json

import pytest
import transformers as tf
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.export.build import build_recipe, write_recipe
from analysis.finetune.config import flat_config
from analysis.finetune.methods.lora import LoraOptions
from analysis.finetune.registry import method_spec
from analysis.models import load_model


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": {0: 4}}, "layers are numbered from 1"),
        ({"ranks": {2: 0}}, "layer 2 needs a positive whole number"),
        ({"ranks": {2: 2.5}}, "layer 2 needs a positive whole number"),
        ({"ranks": {}}, "lora_ranks is empty"),
        ({"ranks": [(2, 4), (2, 8)]}, "lists layer 2 twice"),
        ({"ranks": "2:4"}, "must map layers to numbers"),
        ({"alphas": {2: 8}}, "lora_alphas needs the layers that get LoRA named"),
        ({"alphas": {2: -1.0}, "layers_to_transform": (2,)}, "layer 2 needs a positive number"),
        (
            {"ranks": {3: 4}, "layers_to_transform": (1, 2)},
            "lora_ranks names layer 3, which gets no LoRA",
        ),
        ({"alphas": {4: 8}, "ranks": {1: 2}}, "lora_alphas names layer 4, which gets no LoRA"),
    ],
)
def test_per_layer_options_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoraOptions(**kwargs)


def test_a_rank_allocation_places_lora_and_is_stored_one_based():
    options = LoraOptions(ranks={"4": 2, 2: 8}, alphas={4: 1.5})
    assert options.layers_to_transform == (2, 4) and options.ranks == ((2, 8), (4, 2))
    assert (
        options.rank(2) == 8 and LoraOptions(layers_to_transform=(1, 2), ranks={2: 4}).rank(1) == 8
    )
    cfg = flat_config(method="lora", lora_ranks={2: 8, 4: 2}, lora_alphas={4: 1.5})
    assert cfg.options == options
    stored = cfg.to_dict()["options"]
    assert stored["ranks"] == {"2": 8, "4": 2} and stored["alphas"] == {"4": 1.5}
    assert stored["layers_to_transform"] == [2, 4]
    with pytest.raises(ValueError, match="above the classifier's layer"):
        flat_config(method="lora", lora_ranks={4: 2}, layers=(1, 3, 3))


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def model(request, tmp_path_factory):
    folder = make_tiny_model_dir(request.param, tmp_path_factory.mktemp("ranks"), n_layers=4)
    return folder, load_model(ModelSpec(str(folder)), device="cpu")


def test_rank_patterns_round_trip_through_peft(model, tmp_path):
    from peft import LoraConfig, get_peft_model

    folder, loaded = model
    ranks, alphas = {1: 2, 3: 6, 4: 4}, {3: 12.0}
    cfg = flat_config(model={"name": str(folder)}, method="lora", lora_ranks=ranks,
                      lora_alphas=alphas, lora_alpha=8)  # fmt: skip
    exported = method_spec("lora").export(cfg, loaded)  # no model built
    recipe = build_recipe(cfg, loaded, n_outputs=2)
    write_recipe(recipe, tmp_path / "recipe")
    assert recipe["train"]["peft"]["layers"] == [1, 3, 4]
    assert "rank_pattern" not in json.dumps(recipe["train"])  # PEFT's indices stay in its file
    written = json.loads((tmp_path / "recipe" / "adapter_config.json").read_text())
    assert written["layers_to_transform"] == [0, 2, 3]

    config = LoraConfig.from_pretrained(str(tmp_path / "recipe"))
    hf = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    hf = get_peft_model(hf, config)
    got_ranks, got_scaling = {}, {}
    for name, module in hf.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            layer = int(name.split(".layer.")[1].split(".")[0]) + 1
            got_ranks.setdefault(layer, set()).add(module.lora_A["default"].weight.shape[0])
            got_scaling.setdefault(layer, set()).add(module.scaling["default"])
    assert got_ranks == {layer: {r} for layer, r in ranks.items()}  # query and value alike
    assert got_scaling == {1: {8 / 2}, 3: {12.0 / 6}, 4: {8 / 4}}
    n_lora = sum(p.numel() for n, p in hf.named_parameters() if p.requires_grad and "lora_" in n)
    assert n_lora == exported.n_trainable == recipe["train"]["n_trainable_body"]
