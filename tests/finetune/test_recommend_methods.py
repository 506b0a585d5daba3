"""The recommendation's arms as methods on a tiny in-process BERT: a set of whole layers (given,
random per seed, by weight SNR), the LoRA allocation as method lora with a rank per layer, LoRA
started by PEFT's EVA. Each
trains exactly what it says (everything else bit-identical) and costs what it should."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import pytest
import torch
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.engine import build_model, make_optimizer, train_step
from analysis.finetune.methods.layer_set import LayerSetOptions, chosen_layers, layer_snr
from analysis.finetune.registry import method_spec
from analysis.models import layer_modules, load_model


@pytest.fixture(autouse=True)
def _one_thread():
    # Two OpenMP threads on a crowded 2-core machine spin-wait for each other (10x slower here).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bert4(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("rec-methods"), n_layers=4)
    return load_model(ModelSpec(str(folder)), device="cpu")


def cfg_for(loaded, method: str, **kwargs) -> FinetuneConfig:
    return flat_config(model=ModelSpec("tiny"), method=method, lr=1e-2, weight_decay=0.1,
                       warmup=0.0, steps=3, **kwargs)  # fmt: skip


def take_steps(loaded, cfg: FinetuneConfig, steps: int = 3):
    """(built, state before, state after) after ``steps`` AdamW steps on one fixed batch."""
    built = build_model(cfg, loaded, n_outputs=2, device="cpu")
    before = {k: v.detach().clone() for k, v in built.model.state_dict().items()}
    optimizer, scheduler = make_optimizer(built.prepared, cfg)
    texts = ["good fun movie", "bad dull plot", "great film", "awful boring scene"] * 2
    batch = dict(loaded.tokenizer(texts, padding=True, return_special_tokens_mask=True,
                                  return_tensors="pt"))  # fmt: skip
    labels = torch.tensor([1, 0, 1, 0] * 2)
    built.model.train()
    for _ in range(steps):
        train_step(built.model, batch, labels, torch.nn.CrossEntropyLoss(), optimizer, scheduler,
                   built.prepared, None, nullcontext)  # fmt: skip
    return built, before, built.model.state_dict()


def names_of(model, params) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def classifier_names(model) -> set[str]:
    return names_of(model, model.classifier.parameters())


def check_changes(built, before, after, expected: set[str]) -> None:
    """Every expected tensor changed; every other one is bit-identical."""
    for name, old in before.items():
        changed = not torch.equal(after[name], old)
        assert changed == (name in expected), f"{name}: changed {changed}"


def test_a_given_layer_set_trains_those_whole_layers_only(bert4):
    cfg = cfg_for(bert4, "layer-set", set_layers=[1, 3])
    built, before, after = take_steps(bert4, cfg)
    model = built.model
    trained = names_of(model, [p for i in (1, 3) for p in model.layers[i - 1].parameters()])
    check_changes(built, before, after, trained | classifier_names(model))
    assert model.n_layers_kept == 4  # nothing is cut: the classifier reads layer L
    assert built.layers_backward == 4  # the gradient reaches down to layer 1
    assert "layers 1, 3 and the classifier" in built.prepared.description


def test_random_layers_are_drawn_anew_per_seed_and_alike_for_one_seed():
    options = LayerSetOptions(pick="random", k=2)
    draws = {seed: chosen_layers(options, 12, seed) for seed in range(6)}
    assert all(
        len(d) == 2 and len(set(d)) == 2 and 1 <= min(d) <= max(d) <= 12 for d in draws.values()
    )
    assert len(set(draws.values())) > 1  # the draw is part of the seed
    assert chosen_layers(options, 12, 3) == draws[3]
    with pytest.raises(ValueError, match="set_k = 5 layers asked for, but the model keeps 4"):
        chosen_layers(LayerSetOptions(pick="random", k=5), 4, 0)


def test_random_layer_runs_of_two_seeds_share_their_setting(bert4):
    from analysis.runs.record import setting_key

    a, b = (cfg_for(bert4, "layer-set", set_pick="random", set_k=2, seed=s) for s in (0, 1))
    assert setting_key(a.to_dict()) == setting_key(b.to_dict())  # seeds of one another
    built = build_model(a, bert4, 2, "cpu")
    trained = [i for i, block in enumerate(built.model.layers, 1)
               if any(p.requires_grad for p in block.parameters())]  # fmt: skip
    assert tuple(trained) == chosen_layers(a.options, 4, 0)


def test_the_snr_pick_takes_the_layers_whose_weights_carry_a_planted_signal(tmp_path):
    loaded = load_model(ModelSpec(str(make_tiny_model_dir("bert", tmp_path, n_layers=4))))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer, strength in ((2, 6.0), (4, 3.0)):  # a rank-2 spike in every matrix
            for linear in layer_modules(loaded.model.encoder.layer[layer - 1], "bert").values():
                weight = getattr(linear, "weight", None)
                if weight is None or weight.ndim != 2:
                    continue
                n, m = weight.shape
                u = torch.linalg.qr(torch.randn(n, 2, generator=generator))[0]
                v = torch.linalg.qr(torch.randn(m, 2, generator=generator))[0]
                noise = float(torch.linalg.svdvals(weight)[0])
                weight += strength * noise * (u @ v.T)
    scores = layer_snr(loaded.model.encoder.layer, "bert")
    assert scores[2] > scores[4] > max(scores[1], scores[3])
    cfg = flat_config(model=ModelSpec("tiny"), method="layer-set", set_pick="snr", set_k=2)
    built = build_model(cfg, loaded, 2, "cpu")
    assert "layers 2, 4 (highest weight signal-to-noise ratio)" in built.prepared.description


@pytest.mark.parametrize(
    ("flat", "message"),
    [({"set_pick": "random"}, "needs set_k"), ({"set_pick": "snr", "set_layers": [1], "set_k": 1},
     "drop set_layers"), ({"set_layers": [1], "set_k": 2}, "set_k goes with"),
     ({"set_pick": "best", "set_k": 2}, "set_pick must be one of")],
)  # fmt: skip
def test_a_bad_layer_set_gets_one_clear_message(flat, message):
    with pytest.raises(ValueError, match=message):
        flat_config(method="layer-set", **flat)


def test_a_lora_allocation_trains_as_method_lora_with_its_ranks_and_the_update_scale(bert4):
    from analysis.recommend.allocation import LoraAllocation

    allocation = LoraAllocation(ranks=((2, 6), (4, 2)), r=4, alpha=8.0, n_layers=4)
    cfg = dataclasses.replace(cfg_for(bert4, "lora"), options=allocation.options())
    built, before, after = take_steps(bert4, cfg)
    model = built.model
    lora = {n for n, _ in model.named_parameters() if ".lora_" in n}
    check_changes(built, before, after, lora | classifier_names(model))
    ranks = {}
    for layer in (1, 2, 3, 4):
        parts = layer_modules(model.layers[layer - 1], "bert")
        for part in ("query", "value"):
            module = parts[part]
            if not hasattr(module, "lora_A"):
                continue
            ranks.setdefault(layer, set()).add(module.lora_A["default"].weight.shape[0])
            assert module.scaling["default"] == pytest.approx(8 / 4)  # alpha_ℓ / r_ℓ = alpha / r
        assert not hasattr(parts["key"], "lora_A")
    assert ranks == {2: {6}, 4: {2}}
    d = model.d_model
    body = built.n_trainable - sum(p.numel() for p in model.classifier.parameters())
    assert body == 2 * (6 + 2) * (d + d)
    assert body == method_spec("lora").export(cfg, bert4).n_trainable  # the export's exact count


@pytest.fixture(scope="module")
def bert3_folder(tmp_path_factory):
    return make_tiny_model_dir("bert", tmp_path_factory.mktemp("eva"), n_layers=3)


def test_eva_starts_lora_from_activations_with_the_uniform_total_rank(bert3_folder):
    loaded = load_model(ModelSpec(str(bert3_folder)), device="cpu")
    base = dict(model=ModelSpec(str(bert3_folder)), steps=2, batch_size=8, max_length=32)
    eva = build_model(flat_config(method="lora-eva", eva_r=4, eva_batches=3, **base), loaded, 2)
    uniform = build_model(flat_config(method="lora", lora_r=4, **base), loaded, 2)
    assert eva.n_trainable == uniform.n_trainable  # the same total rank, redistributed
    assert "EVA" in eva.prepared.description and "ranks by layer" in eva.prepared.description
    a_rows = [m.lora_A["default"].weight for m in eva.model.modules() if hasattr(m, "lora_A")]
    b_mats = [m.lora_B["default"].weight for m in eva.model.modules() if hasattr(m, "lora_B")]
    assert a_rows and all(torch.count_nonzero(b) == 0 for b in b_mats)  # starts unchanged
    for a in a_rows:  # EVA's A: top right-singular vectors of the activations, orthonormal rows
        gram = a @ a.T
        assert torch.allclose(gram, torch.eye(len(a)), atol=1e-4)
    again = build_model(flat_config(method="lora-eva", eva_r=4, eva_batches=3, **base), loaded, 2)
    first = [m.lora_A["default"].weight for m in again.model.modules() if hasattr(m, "lora_A")]
    assert all(torch.equal(x, y) for x, y in zip(a_rows, first, strict=True))  # deterministic


def test_eva_runs_end_to_end(bert3_folder):
    from analysis.finetune.engine import run_finetune

    cfg = flat_config(
        model=ModelSpec(str(bert3_folder)), method="lora-eva", eva_r=2, eva_batches=2, steps=2,
        batch_size=8, max_length=32, n_train=64, n_eval=40, eval_every=2,
    )  # fmt: skip
    result = run_finetune(cfg)
    assert result.score is not None and result.n_trainable > 0
    assert dataclasses.asdict(cfg.options)["r"] == 2


def test_mp_median_matches_a_large_noise_matrix():
    from analysis.finetune.methods.layer_set import mp_median

    assert mp_median(1.0) == pytest.approx(0.6528, abs=1e-3)  # Gavish & Donoho (2014)
    noise = torch.randn(4000, 1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    eig = torch.linalg.svdvals(noise) ** 2 / 4000
    assert float(eig.median()) == pytest.approx(mp_median(0.25), rel=0.01)


def test_weight_snr_on_noise_and_on_a_planted_low_rank_signal():
    from analysis.finetune.methods.layer_set import weight_snr

    generator = torch.Generator().manual_seed(1)
    n, m, sigma = 600, 300, 0.05
    noise = sigma * torch.randn(n, m, generator=generator, dtype=torch.float64)
    snr, estimate, above = weight_snr(noise)
    assert estimate == pytest.approx(sigma, rel=0.03)  # the bulk's noise level, from the median
    assert above <= 1 and snr < 0.01  # nothing (or one edge value) stands out of the bulk
    u = torch.linalg.qr(torch.randn(n, 3, generator=generator, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(m, 3, generator=generator, dtype=torch.float64))[0]
    spikes = torch.tensor([40.0, 20.0, 10.0], dtype=torch.float64) * sigma * (n * m) ** 0.25
    signal = noise + u @ torch.diag(spikes) @ v.T
    snr, estimate, above = weight_snr(signal)
    values = torch.linalg.svdvals(signal)
    assert above == 3 and estimate == pytest.approx(sigma, rel=0.05)
    assert snr == pytest.approx(float(values[:3].sum() / values[3:].sum()), rel=1e-9)
    stronger = noise + 2 * u @ torch.diag(spikes) @ v.T
    assert weight_snr(stronger)[0] > snr


@pytest.mark.parametrize(
    ("method", "options", "stored", "label"),
    [("layer-set", LayerSetOptions(pick="random", k=2), {"layers": None, "pick": "random", "k": 2},
      "random ×2"),
     ("layer-set", LayerSetOptions(layers=(3, 1)), {"layers": [1, 3], "pick": "given", "k": None},
      "layers 1,3"),
     ("lora-eva", None, {"layers_to_transform": None, "r": 8, "alpha": 16, "rho": 2.0,
                   "batches": 8},
      "lora-eva r=8")],
)  # fmt: skip
def test_the_arms_store_their_options_nested_and_label_their_runs(method, options, stored, label):
    from analysis.runs.record import run_setting
    from analysis.runs.records import run_label

    cfg = FinetuneConfig(method=method, options=options)
    payload = cfg.to_dict()
    assert payload["options"] == stored
    assert not {"set_pick", "set_k", "set_layers", "eva_r", "eva_layers"} & set(payload)
    assert FinetuneConfig.from_dict(payload) == cfg
    assert run_label(payload) == label
    assert run_label(run_setting(payload)) == label  # a run group's setting leaves defaults out


def test_eva_refuses_to_export_and_says_why_while_a_layer_set_exports_its_drawn_layers(bert4):
    from analysis.export.build import build_recipe

    eva = flat_config(model=bert4.spec, method="lora-eva", eva_r=2)
    with pytest.raises(ValueError, match="cannot be exported: EVA's start is data-dependent"):
        build_recipe(eva, bert4, 2)
    drawn = flat_config(model=bert4.spec, method="layer-set", set_pick="random", set_k=2, seed=3)
    recipe = build_recipe(drawn, bert4, 2)
    layers = chosen_layers(drawn.options, 4, 3)
    trained = {int(name.split(".")[2]) + 1 for name in recipe["train"]["params"]}
    assert trained == set(layers) and recipe["train"]["peft"] is None
