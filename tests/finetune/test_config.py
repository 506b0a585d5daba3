"""FinetuneConfig and the per-method options: validation with clear messages, defaults, the stored
form (options under "options") and the flat form older configs were stored in, help texts
declared once."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from analysis.config import DataSpec, ModelSpec, help_of
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.methods.adapter import AdapterOptions
from analysis.finetune.methods.heads import HeadsOptions
from analysis.finetune.methods.lora import LoraOptions
from analysis.finetune.methods.subspace import SubspaceOptions
from analysis.finetune.registry import default_lr, method_names
from analysis.heads.selection_file import HeadSelection, SelectionError


def test_defaults_are_valid_and_lr_follows_the_method():
    for method in method_names():
        extra = {
            "layers": {"layers": (1, 2, 3)},
            "heads": {"heads": {1: [0]}},
            "subspace": {"subspace_from": "run-1"},
            "layer-set": {"set_layers": (1, 2)},
        }.get(method, {})
        cfg = flat_config(method=method, **extra)
        assert cfg.lr == default_lr(method)
    assert FinetuneConfig(lr=3e-5).lr == 3e-5
    assert default_lr("full") < default_lr("heads") < default_lr("adapter")


def test_round_trip_through_json():
    cfg = FinetuneConfig(
        model=ModelSpec("some/folder"),
        data=DataSpec("glue/mrpc", split_seed=3),
        method="heads",
        layers=(1, 2, 4),
        options=HeadsOptions(HeadSelection({2: [3, 0], 1: [1]}, model="m", settings={"k": 2})),
        steps=7,
        lr=1e-4,
        n_train=50,
        trajectory_every=2,
        zero_weights="/tmp/z.json",
    )
    payload = json.loads(json.dumps(cfg.to_dict()))
    assert payload["options"] == {"heads": {"layers": {"1": [1], "2": [0, 3]},
                                            "settings": {"k": 2}}}  # fmt: skip
    assert (payload["layers"], payload["classifier_layer"]) == ([1, 2], 4)
    back = FinetuneConfig.from_dict(payload)
    assert back == cfg  # the selection's provenance is not part of the run's identity
    assert back.option("heads").layers == ((1, (1,)), (2, (0, 3)))
    assert hash(back) == hash(cfg)
    lora = flat_config(method="lora", lora_layers=[2, 1], lora_r=4)
    assert lora.to_dict()["options"] == {"layers_to_transform": [1, 2], "r": 4, "alpha": 16,
                                         "ranks": None, "alphas": None}  # fmt: skip
    assert FinetuneConfig.from_dict(json.loads(json.dumps(lora.to_dict()))) == lora
    # Each config stores its own method's options only: the common keys are the same for all.
    assert set(lora.to_dict()) == set(FinetuneConfig().to_dict())
    assert FinetuneConfig().to_dict()["options"] == {}


def test_flat_options_still_read():
    """Options given flat (as `flat_config` takes them): another method's at its default."""
    flat = {"method": "lora", "lora_layers": [2, 3], "lora_r": 4, "lora_alpha": 16,
            "adapter_size": 64, "heads": None, "classifier_lr": 2e-3}  # fmt: skip
    cfg = FinetuneConfig.from_dict(flat)
    assert cfg.options == LoraOptions(layers_to_transform=(2, 3), r=4) and cfg.classifier_lr == 2e-3
    assert cfg == flat_config(**flat) and "lora_r" not in cfg.to_dict()
    with pytest.raises(ValueError, match="Unknown fine-tuning config keys: lora_r"):
        FinetuneConfig.from_dict({**cfg.to_dict(), "lora_r": 4})  # nested and flat: one form
    with pytest.raises(ValueError, match="has no option size"):
        FinetuneConfig.from_dict({**cfg.to_dict(), "options": {"size": 3}})


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="Unknown fine-tuning config keys: colour"):
        FinetuneConfig.from_dict({"colour": "red"})
    with pytest.raises(ValueError, match="Bad model spec"):
        FinetuneConfig.from_dict({"model": {"name": "minilm", "size": 3}})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "prune"}, "Unknown fine-tuning method 'prune'"),
        ({"method": "layers"}, "needs layers"),
        (
            {"method": "layers", "layers": (3, 2, 4)},
            r"ℓ_bottom \(3\) must not be above ℓ_top \(2\)",
        ),
        ({"method": "layers", "layers": (1, 3, 2)}, r"ℓ_cls \(2\) must not be below ℓ_top \(3\)"),
        ({"method": "layers", "layers": (0, 1, 1)}, "numbered from 1"),
        ({"method": "layers", "layers": (1, 2)}, "three whole numbers"),
        ({"steps": 0}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"lr": 0.0}, "learning rate"),
        ({"lr": -1e-3}, "learning rate"),
        ({"lr": math.nan}, "learning rate"),
        ({"lr": math.inf}, "learning rate"),
        ({"batch_size": 0}, "batch"),
        ({"max_length": 4}, "Max length"),
        ({"n_train": 1}, "n_train"),
        ({"n_eval": 0}, "n_eval"),
        ({"eval_every": 0}, "evaluation interval"),
        ({"pooling": "max"}, "Unknown pooling"),
        ({"weight_decay": -0.1}, "Weight decay"),
        ({"warmup": 1.0}, "warmup"),
        ({"trajectory_every": 0}, "trajectory_every"),
        ({"trajectory_dtype": "int8"}, "trajectory dtype"),
        ({"method": "heads"}, "needs a head selection"),
        ({"method": "full", "heads": {1: [0]}}, "only used by method 'heads'"),
        ({"method": "heads", "heads": {0: [1]}}, "numbered from 1"),
        ({"method": "heads", "heads": {1: [-1]}}, "0-based head numbers"),
        ({"method": "heads", "heads": {1: []}}, "no heads"),
        (
            {"method": "heads", "heads": {3: [0]}, "layers": (1, 2, 2)},
            "above the classifier's layer",
        ),
        (
            {"method": "adapter", "adapter_layers": (1, 4), "layers": (1, 2, 3)},
            "above the classifier's layer",
        ),
        ({"method": "adapter", "adapter_layers": (2, 2)}, "twice"),
        ({"method": "lora", "adapter_layers": (1,)}, "only used by method 'adapter'"),
        ({"method": "lora", "lora_r": 0}, "lora_r"),
        ({"method": "adapter", "adapter_size": 0}, "adapter_size"),
        ({"method": "subspace"}, "needs subspace_from"),
        ({"method": "full", "subspace_from": "r1"}, "only used by methods 'subspace'"),
        ({"device": "quantum"}, "Unknown device"),
        ({"seed": -1}, "seed"),
    ],
)
def test_invalid_configs_say_why(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flat_config(**kwargs)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LoraOptions(r=0), "lora_r"),
        (lambda: LoraOptions(alpha=-1), "lora_alpha"),
        (lambda: LoraOptions(layers_to_transform=(0,)), "numbered from 1"),
        (lambda: AdapterOptions(size=0), "adapter_size"),
        (lambda: AdapterOptions(layers_to_transform=()), "empty"),
        (lambda: SubspaceOptions(" "), "subspace_from"),
        (lambda: HeadsOptions({1: []}), "no heads"),
        (lambda: FinetuneConfig(method="full", options=LoraOptions()), "takes no options"),
        (lambda: FinetuneConfig(method="lora", options=AdapterOptions()), "takes LoraOptions"),
        (lambda: FinetuneConfig(method="heads"), "needs a head selection"),
    ],
)
def test_options_validate_themselves(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_method_options_default_and_are_typed():
    assert FinetuneConfig(method="lora").options == LoraOptions()
    assert FinetuneConfig(method="adapter").options.size == 64
    assert FinetuneConfig(method="full").options is None
    cfg = FinetuneConfig(method="heads", options=HeadsOptions({1: [0]}))
    assert cfg.options_for(HeadsOptions).heads.n_selected == 1
    with pytest.raises(TypeError, match="not LoraOptions"):
        cfg.options_for(LoraOptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.options.heads = None


def test_help_texts_are_declared_once_and_shared():
    from tunescope.cli import build_parser

    assert "LoRA rank" in help_of(LoraOptions, "r")
    finetune = build_parser()._subparsers._group_actions[0].choices["finetune"]
    helps = {a.dest: a.help for a in finetune._actions}
    assert helps["lora_r"] == help_of(LoraOptions, "r")
    assert helps["steps"] == help_of(FinetuneConfig, "steps")
    assert helps["heads"] == help_of(HeadsOptions, "heads")


def test_check_model_needs_layers_and_heads_within_the_model():
    FinetuneConfig(method="layers", layers=(1, 6, 6)).check_model(n_layers=6, n_heads=12)
    with pytest.raises(ValueError, match="this model has 6 layers"):
        FinetuneConfig(method="layers", layers=(1, 7, 7)).check_model(n_layers=6, n_heads=12)
    with pytest.raises(ValueError, match="this model has 6 layers"):
        flat_config(method="lora", lora_layers=(7,)).check_model(n_layers=6, n_heads=12)
    with pytest.raises(SelectionError, match="12 heads per layer"):
        flat_config(method="heads", heads={2: [12]}).check_model(n_layers=6, n_heads=12)


def test_placement_defaults():
    assert FinetuneConfig(method="adapter").placement(4) == (1, 2, 3, 4)
    assert FinetuneConfig(method="adapter", layers=(2, 3, 4)).placement(4) == (2, 3)
    assert flat_config(method="lora", lora_layers=(4, 1)).placement(4) == (1, 4)
    assert FinetuneConfig().resolved_layers(6) == (1, 6, 6)
    assert FinetuneConfig(layers=(1, 1, 3)).classifier_layer == 3


def test_the_classifier_has_its_own_learning_rate():
    for method in ("full", "frozen", "lora"):
        assert flat_config(method=method).classifier_lr == 1e-3  # one default for every method
    cfg = FinetuneConfig(classifier_lr=5e-3)
    assert cfg.to_dict()["classifier_lr"] == 5e-3
    assert FinetuneConfig.from_dict(cfg.to_dict()) == cfg
    old = cfg.to_dict()
    del old["classifier_lr"]  # stored before the classifier had its own rate
    assert FinetuneConfig.from_dict(old).classifier_lr == 1e-3
    for bad in (0, -1e-3, math.nan, "fast"):
        with pytest.raises(ValueError, match="classifier's learning rate"):
            FinetuneConfig(classifier_lr=bad)
    assert "classifier" in help_of(FinetuneConfig, "classifier_lr")


def test_a_heads_run_keeps_where_its_selection_came_from():
    selection = HeadSelection({1: [0, 2]}, settings={"selector": "random", "k": 2, "seed": 0})
    cfg = FinetuneConfig(method="heads", options=HeadsOptions(selection))
    stored = cfg.to_dict()["options"]["heads"]
    assert stored["layers"] == {"1": [0, 2]} and stored["settings"]["selector"] == "random"
    back = FinetuneConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.option("heads").settings["k"] == 2
    flat = {"method": "heads", "heads": {"1": [0, 2]}}  # stored flat, before provenance was kept
    assert FinetuneConfig.from_dict(flat).option("heads").settings == {}
    flat["heads_settings"] = {"selector": "random"}
    assert FinetuneConfig.from_dict(flat).option("heads").settings == {"selector": "random"}
    with pytest.raises(ValueError, match="only used by method 'heads'"):
        FinetuneConfig.from_dict({"method": "full", "heads_settings": {"selector": "random"}})


def test_the_classifier_is_stored_as_such_and_the_cli_keeps_its_old_flag():
    from tunescope.cli import build_parser

    cfg = FinetuneConfig(classifier_lr=2e-3, method="layers", layers=(1, 2, 3))
    stored = cfg.to_dict()
    assert stored["classifier_lr"] == 2e-3 and "head_lr" not in stored
    assert (stored["layers"], stored["classifier_layer"]) == ([1, 2], 3)
    assert FinetuneConfig.from_dict(stored) == cfg and cfg.classifier_layer == 3
    assert FinetuneConfig().to_dict()["classifier_layer"] is None
    # Old names are the database migration's business (analysis.runs.migration), not the reader's.
    with pytest.raises(ValueError, match="Unknown fine-tuning config keys: head_lr"):
        FinetuneConfig.from_dict({"head_lr": 2e-3})
    with pytest.raises(ValueError, match=r"layers as \[ℓ_bottom, ℓ_top\] together with"):
        FinetuneConfig.from_dict({**stored, "layers": [1, 2, 3], "classifier_layer": None})
    with pytest.raises(ValueError, match="has no option layers"):
        FinetuneConfig.from_dict({"method": "lora", "options": {"layers": [2]}})
    for flag in ("--classifier-lr", "--head-lr"):
        args = build_parser().parse_args(["finetune", flag, "3e-3"])
        assert args.classifier_lr == 3e-3
