"""FinetuneConfig: validation with clear messages, defaults, JSON round trip, heads files."""

from __future__ import annotations

import json
import math

import pytest

from analysis.config import DataSpec, ModelSpec
from analysis.finetune.config import (
    DEFAULT_LR,
    METHOD_NAMES,
    FinetuneConfig,
    heads_from_file,
    normalise_heads,
)


def test_defaults_are_valid_and_lr_follows_the_method():
    for method in METHOD_NAMES:
        extra = {
            "layers": {"layers": (1, 2, 3)},
            "heads": {"heads": {1: [0]}},
            "subspace": {"subspace_from": "run-1"},
        }.get(method, {})
        cfg = FinetuneConfig(method=method, **extra)
        assert cfg.lr == DEFAULT_LR[method]
    assert FinetuneConfig(lr=3e-5).lr == 3e-5
    assert DEFAULT_LR["full"] < DEFAULT_LR["heads"] < DEFAULT_LR["adapter"]


def test_round_trip_through_json():
    cfg = FinetuneConfig(
        model=ModelSpec("some/folder"),
        data=DataSpec("glue/mrpc", split_seed=3),
        method="heads",
        layers=(1, 2, 4),
        heads={2: [3, 0], 1: [1]},
        steps=7,
        lr=1e-4,
        n_train=50,
        trajectory_every=2,
        zero_weights="/tmp/z.json",
    )
    payload = json.loads(json.dumps(cfg.to_dict()))
    assert payload["heads"] == {"1": [1], "2": [0, 3]}
    assert payload["layers"] == [1, 2, 4]
    back = FinetuneConfig.from_dict(payload)
    assert back == cfg
    assert back.heads == ((1, (1,)), (2, (0, 3)))
    assert hash(back) == hash(cfg)


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
        ({"method": "layers", "layers": (1, 3, 2)}, r"ℓ_head \(2\) must not be below ℓ_top \(3\)"),
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
        ({"method": "heads", "heads": {1: [-1]}}, "numbered from 0"),
        ({"method": "heads", "heads": {1: []}}, "empty"),
        ({"method": "heads", "heads": {3: [0]}, "layers": (1, 2, 2)}, "above ℓ_head"),
        ({"method": "adapter", "adapter_layers": (1, 4), "layers": (1, 2, 3)}, "above ℓ_head"),
        ({"method": "adapter", "adapter_layers": (2, 2)}, "twice"),
        ({"method": "lora", "adapter_layers": (1,)}, "only used by method 'adapter'"),
        ({"method": "lora", "lora_r": 0}, "lora_r"),
        ({"method": "adapter", "adapter_size": 0}, "adapter_size"),
        ({"method": "subspace"}, "needs subspace_from"),
        ({"method": "full", "subspace_from": "r1"}, "only used by methods subspace"),
        ({"device": "quantum"}, "Unknown device"),
        ({"seed": -1}, "seed"),
    ],
)
def test_invalid_configs_say_why(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FinetuneConfig(**kwargs)


def test_check_model_needs_layers_and_heads_within_the_model():
    FinetuneConfig(method="layers", layers=(1, 6, 6)).check_model(n_layers=6, n_heads=12)
    with pytest.raises(ValueError, match="this model has 6 layers"):
        FinetuneConfig(method="layers", layers=(1, 7, 7)).check_model(n_layers=6, n_heads=12)
    with pytest.raises(ValueError, match="this model has 6 layers"):
        FinetuneConfig(method="lora", lora_layers=(7,)).check_model(n_layers=6, n_heads=12)
    with pytest.raises(ValueError, match="12 heads per layer"):
        FinetuneConfig(method="heads", heads={2: [12]}).check_model(n_layers=6, n_heads=12)


def test_placement_defaults():
    assert FinetuneConfig(method="adapter").placement(4) == (1, 2, 3, 4)
    assert FinetuneConfig(method="adapter", layers=(2, 3, 4)).placement(4) == (2, 3)
    assert FinetuneConfig(method="lora", lora_layers=(4, 1)).placement(4) == (1, 4)
    assert FinetuneConfig().resolved_layers(6) == (1, 6, 6)
    assert FinetuneConfig(layers=(1, 1, 3)).head_layer == 3


def test_heads_file(tmp_path):
    path = tmp_path / "heads.json"
    path.write_text(
        json.dumps({"format": "tunescope-heads/1", "layers": {"2": [3, 1], "1": [0]}, "k": 2})
    )
    assert heads_from_file(path) == ((1, (0,)), (2, (1, 3)))
    path.write_text(json.dumps({"layers": {"1": [0]}}))
    with pytest.raises(ValueError, match="not a tunescope head selection"):
        heads_from_file(path)
    with pytest.raises(ValueError, match="does not exist"):
        heads_from_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="twice"):
        normalise_heads([(1, [0]), (1, [2])])
