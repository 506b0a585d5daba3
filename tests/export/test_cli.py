"""``export``'s flags: the method options are the ones ``finetune`` has (made by
`add_method_options` from the method specs), ``--layers`` places a method's modules,
``--classifier-lr`` (``--head-lr`` accepted) is the classifier's rate, and a flag that does
nothing for what is exported is refused with one ``error:`` line."""

from __future__ import annotations

import json

import pytest

from analysis.heads.selection_file import HeadSelection, save_selection
from tunescope.cli import main


def export(folder, out, *argv) -> int:
    return main(["export", "--model", str(folder), "--out", str(out), *argv])


def recipe_of(out) -> dict:
    return json.loads((out / "recipe.json").read_text())


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_lora_flags_reach_the_recipe_and_peft_config(tiny_bert_dir, tmp_path):
    out = tmp_path / "lora"
    argv = ["--method", "lora", "--layers", "2", "--lora-r", "4", "--lora-alpha", "8"]
    assert export(tiny_bert_dir, out, *argv, "--classifier-lr", "0.002", "--steps", "7") == 0
    recipe = recipe_of(out)
    assert recipe["train"]["peft"]["peft_type"] == "LORA"
    assert recipe["train"]["peft"]["layers"] == [2]  # 1-based in recipe.json
    assert recipe["optimizer"]["classifier_lr"] == 0.002 and recipe["training"]["steps"] == 7
    assert recipe["optimizer"]["lr"] == 5e-4  # lora's default body rate (its spec)
    peft = json.loads((out / "adapter_config.json").read_text())
    assert (peft["r"], peft["lora_alpha"], peft["layers_to_transform"]) == (4, 8, [1])  # PEFT's
    assert recipe["provenance"]["config"]["options"]["r"] == 4


def test_per_layer_lora_ranks_from_the_cli(tiny_bert_dir, tmp_path):
    out = tmp_path / "ranks"
    argv = ["--method", "lora", "--lora-ranks", "1:2,2:6", "--lora-alphas", "2:12"]
    assert export(tiny_bert_dir, out, *argv) == 0
    peft = json.loads((out / "adapter_config.json").read_text())
    assert peft["layers_to_transform"] == [0, 1]
    assert peft["rank_pattern"] == {"layer.0.attention.self.query": 2,
                                    "layer.0.attention.self.value": 2,
                                    "layer.1.attention.self.query": 6,
                                    "layer.1.attention.self.value": 6}  # fmt: skip
    assert peft["alpha_pattern"] == {"layer.1.attention.self.query": 12,
                                     "layer.1.attention.self.value": 12}  # fmt: skip
    assert recipe_of(out)["provenance"]["config"]["options"]["ranks"] == {"1": 2, "2": 6}


def test_the_classifier_layer_and_its_old_flag(tiny_bert_dir, tmp_path):
    for flag in ("--classifier-layer", "--head-layer"):
        out = tmp_path / flag
        assert export(tiny_bert_dir, out, "--method", "lora", "--layers", "1", flag, "1") == 0
        recipe = recipe_of(out)
        assert recipe["keep_layers"] == recipe["classifier"]["layer"] == 1


def test_adapter_flags_and_the_old_head_lr_name(tiny_bert_dir, tmp_path):
    out = tmp_path / "adapter"
    argv = ["--method", "adapter", "--adapter-layers", "1", "--adapter-size", "8"]
    assert export(tiny_bert_dir, out, *argv, "--head-lr", "0.003") == 0
    recipe = recipe_of(out)
    adapters = recipe["train"]["adapters"]
    assert (adapters["size"], adapters["layers"]) == (8, [1])  # 1-based
    assert recipe["optimizer"]["classifier_lr"] == 0.003


def test_a_heads_file_alone_exports_method_heads(tiny_bert_dir, tmp_path):
    selection = HeadSelection({1: [0], 2: [1, 3]}, settings={"selector": "test"})
    path = save_selection(selection, tmp_path / "sel.json")
    assert export(tiny_bert_dir, tmp_path / "r", "--heads", str(path)) == 0
    recipe = recipe_of(tmp_path / "r")
    assert recipe["method"] == "heads"
    assert recipe["provenance"]["selection"] == {"selector": "test"}
    assert recipe["provenance"]["source"] == "heads"
    assert {m["param"].split(".")[2] for m in recipe["train"]["masks"]} == {"0", "1"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "adapter", "--lora-r", "4"], "--lora-r is an option of --method lora"),
        (["--method", "lora", "--layers", "2", "--lora-layers", "3"], "Give --layers or --lora-layers"),
        (["--method", "bitfit", "--layers", "2"], "--layers goes with --method layers or"),
        (["--lora-alpha", "4"], "Say what to export"),
        (["--run", "x", "--adapter-size", "4"], "it does nothing for --run"),
        (["--method", "lora", "--lora-r", "0"], "lora_r must be a positive whole number"),
    ],
)  # fmt: skip
def test_flags_that_do_nothing_are_refused(tiny_bert_dir, tmp_path, capsys, argv, message):
    assert export(tiny_bert_dir, tmp_path / "r", *argv) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "r").exists()
