"""The LoRA allocation from the layer metrics: known answers on synthetic probe curves, and a
round trip of method lora's exported PEFT LoraConfig through get_peft_model on a tiny BERT classifier."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_spec
from analysis.models import load_model
from analysis.recommend.allocation import allocate_lora, apportion, probe_gains


def test_apportion_known_answers():
    assert apportion({1: 0.0, 2: 3.0, 3: 1.0}, 6) == {2: 4, 3: 2}  # 1 each, then 4 · (3:1)
    assert apportion({1: 1.0, 2: 1.0, 3: 1.0}, 7) == {1: 3, 2: 2, 3: 2}  # a tie: the lower layer
    assert apportion({1: 0.0, 2: 0.0}, 4) == {1: 2, 2: 2}  # nothing gains: every layer alike
    assert apportion({1: 0.1, 2: 0.5, 3: 0.2}, 2) == {2: 1, 3: 1}  # fewer units than layers
    assert apportion({1: 2.0, 2: 1.0, 3: float("nan")}, 10) == {1: 6, 2: 4}
    for weights, total in (
        ({1: 0.3, 2: 0.31, 3: 0.02, 4: 0.0}, 17),
        ({i: i for i in range(1, 13)}, 96),
    ):
        ranks = apportion(weights, total)
        assert sum(ranks.values()) == total and min(ranks.values()) >= 1


def test_apportion_refuses_what_has_no_answer():
    with pytest.raises(ValueError, match="whole number ≥ 1"):
        apportion({1: 1.0}, 0)
    with pytest.raises(ValueError, match="≥ 0"):
        apportion({1: -1.0}, 3)


def test_the_probe_gain_rule_on_a_curve_with_a_known_allocation():
    # s_0..s_6: layer 2 adds 0.10, layer 3 adds 0.05, layer 5 adds 0.05, the others nothing
    probe = [0.60, 0.60, 0.70, 0.75, 0.74, 0.79, 0.79]
    assert probe_gains(probe) == pytest.approx({1: 0.0, 2: 0.10, 3: 0.05, 4: 0.0, 5: 0.05, 6: 0.0})
    alloc = allocate_lora(probe, r=4, alpha=8)
    # total 4 · 6 = 24: 1 each for layers 2, 3, 5, then 21 · (2 : 1 : 1) = 10.5, 5.25, 5.25
    assert dict(alloc.ranks) == {2: 12, 3: 6, 5: 6}
    assert alloc.total_rank == 24 and not alloc.is_uniform
    options = alloc.options()  # method lora's options: ranks, and alpha_ℓ = alpha · r_ℓ / r
    assert options.ranks == ((2, 12), (3, 6), (5, 6)) and options.layers_to_transform == (2, 3, 5)
    assert options.alphas == ((2, 24.0), (3, 12.0), (5, 12.0))
    settings = alloc.to_dict("bert")
    assert settings["layers_to_transform"] == [1, 2, 4]
    assert settings["rank_pattern"]["layer.1.attention.self.query"] == 12
    assert settings["alpha_pattern"]["layer.4.attention.self.value"] == pytest.approx(8 * 6 / 4)
    assert settings["target_modules"] == ["query", "value"]
    flat = allocate_lora([0.8, 0.79, 0.78], r=2)  # a falling curve: the uniform allocation
    assert dict(flat.ranks) == {1: 2, 2: 2} and flat.is_uniform


def test_the_exported_lora_config_round_trips_through_peft(tmp_path):
    from peft import LoraConfig, get_peft_model

    folder = make_tiny_model_dir("bert", tmp_path, n_layers=4, d_model=32)
    alloc = allocate_lora([0.5, 0.6, 0.6, 0.9, 0.95], r=3, alpha=6)  # total 12 over layers 1, 3, 4
    assert dict(alloc.ranks) == {1: 3, 3: 7, 4: 2}
    cfg = FinetuneConfig(method="lora", options=alloc.options())
    exported = method_spec("lora").export(cfg, load_model(ModelSpec(str(folder)), device="cpu"))
    assert exported.layers == (1, 3, 4)
    exported.peft.save_pretrained(tmp_path / "adapter")
    loaded = LoraConfig.from_pretrained(tmp_path / "adapter")
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    peft_model = get_peft_model(model, loaded)
    found = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            layer = int(name.split(".layer.")[1].split(".")[0]) + 1
            kind = name.rsplit(".", 1)[-1]
            found[(layer, kind)] = module.lora_A["default"].weight.shape[0]
            assert module.scaling["default"] == pytest.approx(6 / 3)  # alpha_ℓ / r_ℓ = alpha / r
    assert found == {(1, "query"): 3, (1, "value"): 3, (3, "query"): 7, (3, "value"): 7,
                     (4, "query"): 2, (4, "value"): 2}  # fmt: skip
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("classifier" in n for n in trainable)  # the classifier trains (modules_to_save)
    d = 32
    lora_count = sum(p.numel() for n, p in peft_model.named_parameters() if ".lora_" in n)
    assert lora_count == 2 * alloc.total_rank * (d + d) == exported.n_trainable
