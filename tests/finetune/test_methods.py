"""What trains, per method: exactly the intended entries change, everything else stays bit-identical.

Each case builds the model the engine builds (`build_model`), takes a few AdamW steps with a large
learning rate and weight decay (so that any leak would show), and compares every state-dict entry
before and after with torch.equal.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.extract import model_inputs
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.engine import build_model, make_optimizer, train_step
from analysis.finetune.methods.adapter import ADAPTER_SITES, houlsby_adapter
from analysis.finetune.model import EncoderClassifier, truncated_copy
from analysis.finetune.registry import method_names, method_specs
from analysis.models import encoder_layers, layer_modules, load_model, trainable_copy
from analysis.subspace.outliers import apply_zero_weights

WORDS = ["good", "great", "fun", "bad", "awful", "dull", "movie", "plot", "the", "a"]


@pytest.fixture(autouse=True)
def _one_thread():
    # Two OpenMP threads on a crowded 2-core machine spin-wait for each other (100x slower).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bert4(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("ft-methods"), n_layers=4)
    return load_model(ModelSpec(str(folder)), device="cpu")


def make_batch(tokenizer, n: int = 8, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    texts = []
    for label in labels.tolist():
        picks = torch.randint(0, 3, (4,), generator=generator).tolist()
        texts.append(" ".join(WORDS[3 * label + i] for i in picks) + " movie")
    enc = tokenizer(texts, padding=True, return_special_tokens_mask=True, return_tensors="pt")
    return dict(enc), labels


def take_steps(loaded, cfg: FinetuneConfig, steps: int = 3):
    """(built, state before, state after) after ``steps`` AdamW steps on a fixed batch."""
    built = build_model(cfg, loaded, n_outputs=2, device="cpu")
    before = {k: v.detach().clone() for k, v in built.model.state_dict().items()}
    optimizer, scheduler = make_optimizer(built.prepared, cfg)
    batch, labels = make_batch(loaded.tokenizer)
    loss_fn = torch.nn.CrossEntropyLoss()
    built.model.train()
    for _ in range(steps):
        train_step(
            built.model, batch, labels, loss_fn, optimizer, scheduler, built.prepared, None,
            nullcontext,
        )  # fmt: skip
    after = built.model.state_dict()
    return built, before, after


def cfg_for(loaded, method: str, **kwargs) -> FinetuneConfig:
    """A short run's config; method options as flat keys (heads=, lora_layers=…)."""
    return flat_config(
        model=ModelSpec("tiny"), method=method, lr=1e-2, weight_decay=0.1, warmup=0.0, steps=3,
        **kwargs,
    )  # fmt: skip


def names_of(model: EncoderClassifier, params) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def check_changes(built, before, after, expected: set[str], partial: dict[str, torch.Tensor]):
    """Every entry outside ``expected`` is bit-identical; every expected tensor changed; for a
    partly trained tensor only the entries of its mask changed."""
    params = {name for name, _ in built.model.named_parameters()}
    assert expected <= params, expected - params
    for name, old in before.items():
        new = after[name]
        if name in partial:
            mask = partial[name]
            assert torch.equal(new[~mask], old[~mask]), f"{name}: a frozen entry moved"
            assert not torch.equal(new[mask], old[mask]), (
                f"{name}: the trained entries did not move"
            )
        elif name in expected:
            assert not torch.equal(new, old), f"{name} should have changed"
        else:
            assert torch.equal(new, old), f"{name} should be bit-identical"


def classifier_names(model) -> set[str]:
    return names_of(model, model.classifier.parameters())


def test_full_trains_everything(bert4):
    built, before, after = take_steps(bert4, cfg_for(bert4, "full"))
    expected = {name for name, _ in built.model.named_parameters()}
    check_changes(built, before, after, expected, {})
    assert built.layers_backward == 4
    assert built.n_trainable == built.n_params


def test_frozen_trains_the_classifier_only(bert4):
    built, before, after = take_steps(bert4, cfg_for(bert4, "frozen"))
    check_changes(built, before, after, classifier_names(built.model), {})
    assert built.layers_backward == 0


def test_bitfit_trains_biases_only(bert4):
    built, before, after = take_steps(bert4, cfg_for(bert4, "bitfit"))
    model = built.model
    biases = {"encoder." + n for n, _ in model.encoder.named_parameters() if n.endswith("bias")}
    check_changes(built, before, after, biases | classifier_names(model), {})


def test_layers_train_only_their_span_and_cut_the_top(bert4):
    built, before, after = take_steps(bert4, cfg_for(bert4, "layers", layers=(2, 3, 3)))
    model = built.model
    assert model.n_layers_kept == 3 and model.encoder.config.num_hidden_layers == 3
    span = names_of(model, [p for i in (2, 3) for p in model.layers[i - 1].parameters()])
    check_changes(built, before, after, span | classifier_names(model), {})
    assert built.layers_backward == 2
    assert not any(".layer.3." in name for name in after)  # layer 4 is gone


def test_layers_one_l_l_is_full_fine_tuning(bert4):
    built, _, _ = take_steps(bert4, cfg_for(bert4, "layers", layers=(1, 4, 4)), steps=1)
    assert built.n_trainable == built.n_params


def heads_case(loaded, family: str, selection: dict[int, list[int]]):
    built, before, after = take_steps(loaded, cfg_for(loaded, "heads", heads=selection))
    model = built.model
    partial: dict[str, torch.Tensor] = {}
    for layer, heads in selection.items():
        parts = layer_modules(model.layers[layer - 1], family)
        for key in ("query", "key", "value"):
            linear = parts[key]
            d_head = linear.out_features // loaded.n_heads
            rows = torch.zeros(linear.out_features, dtype=torch.bool)
            for h in heads:
                rows[h * d_head : (h + 1) * d_head] = True
            (weight,) = names_of(model, [linear.weight])
            partial[weight] = rows[:, None].expand_as(linear.weight)
            if linear.bias is not None:
                (bias,) = names_of(model, [linear.bias])
                partial[bias] = rows
    check_changes(built, before, after, classifier_names(model), partial)
    no_decay = {id(p) for p in built.prepared.no_decay}
    assert all(id(p) in no_decay for p in built.prepared.grad_masks)  # out of weight decay
    return built


def test_heads_change_only_their_rows_bit_for_bit(bert4):
    built = heads_case(bert4, "bert", {2: [0, 2], 3: [1]})
    d_head = 32 // 4
    # 3 heads x (Q, K, V) x (d_head rows of 32 weights + d_head biases) + the classifier
    head_entries = 3 * 3 * (d_head * 32 + d_head)
    classifier = sum(p.numel() for p in built.model.classifier.parameters())
    assert built.n_trainable == head_entries + classifier
    assert built.layers_backward == 3  # layers 2..4


def adapter_case(loaded, family: str, layers: tuple[int, ...]):
    built, before, after = take_steps(loaded, cfg_for(loaded, "adapter", adapter_layers=layers))
    model = built.model
    params = []
    for layer in layers:
        block = model.layers[layer - 1]
        parts = layer_modules(block, family)
        params += [*block.adapter_attn.parameters(), *block.adapter_ffn.parameters()]
        params += [*parts["attn_norm"].parameters(), *parts["ffn_norm"].parameters()]
    check_changes(built, before, after, names_of(model, params) | classifier_names(model), {})
    return built


def test_adapters_train_adapters_and_their_layernorms(bert4):
    built = adapter_case(bert4, "bert", (2, 4))
    assert built.layers_backward == 3


def lora_case(loaded, layers: tuple[int, ...]):
    built, before, after = take_steps(loaded, cfg_for(loaded, "lora", lora_layers=layers))
    model = built.model
    lora = {name for name, _ in model.named_parameters() if "lora_" in name}
    assert len(lora) == 4 * len(layers)
    kept = {int(name.split(".layer.")[1].split(".")[0]) + 1 for name in lora}
    assert kept == set(layers)
    check_changes(built, before, after, lora | classifier_names(model), {})
    return built


def test_lora_trains_only_its_layers(bert4):
    built = lora_case(bert4, (1, 3))
    assert built.layers_backward == 4


def test_lora_ranks_per_layer(bert4):
    cfg = cfg_for(bert4, "lora", lora_ranks={1: 2, 3: 6}, lora_alphas={3: 3.0})
    built, before, after = take_steps(bert4, cfg)
    ranks = {int(n.split(".layer.")[1].split(".")[0]) + 1: p.shape[0]
             for n, p in built.model.named_parameters() if "lora_A" in n}  # fmt: skip
    assert ranks == {1: 2, 3: 6}
    scaling = {int(n.split(".layer.")[1].split(".")[0]) + 1: m.scaling["default"]
               for n, m in built.model.named_modules()
               if isinstance(getattr(m, "scaling", None), dict)}  # fmt: skip
    assert scaling == {1: 16 / 2, 3: 3.0 / 6}
    lora = {name for name, _ in built.model.named_parameters() if "lora_" in name}
    check_changes(built, before, after, lora | classifier_names(built.model), {})


def ia3_case(loaded, layers: tuple[int, ...]):
    built, before, after = take_steps(loaded, cfg_for(loaded, "ia3", ia3_layers=layers))
    vectors = {name for name, _ in built.model.named_parameters() if ".ia3_l." in name}
    assert len(vectors) == 3 * len(layers)  # key, value, feed-forward
    assert {int(n.split(".layer.")[1].split(".")[0]) + 1 for n in vectors} == set(layers)
    check_changes(built, before, after, vectors | classifier_names(built.model), {})
    return built


def test_ia3_trains_only_its_vectors(bert4):
    built = ia3_case(bert4, (2, 4))
    assert built.layers_backward == 3


@pytest.mark.parametrize("method", ["layers", "heads", "adapter", "lora", "ia3"])
def test_methods_on_every_family(tiny_family_dir, method):
    family, folder = tiny_family_dir
    loaded = load_model(ModelSpec(str(folder)), device="cpu")
    if method == "layers":
        built, before, after = take_steps(loaded, cfg_for(loaded, "layers", layers=(2, 2, 2)))
        span = names_of(built.model, built.model.layers[1].parameters())
        check_changes(built, before, after, span | classifier_names(built.model), {})
    elif method == "heads":
        heads_case(loaded, family, {1: [1], 2: [0, 3]})
    elif method == "adapter":
        adapter_case(loaded, family, (2,))
    elif method == "lora":
        lora_case(loaded, (2,))
    else:
        ia3_case(loaded, (2,))


def test_truncation_removes_layers_and_matches_the_full_model(bert4, tiny_family_dir):
    _, folder = tiny_family_dir
    for loaded in (bert4, load_model(ModelSpec(str(folder)), device="cpu")):
        n_layers = loaded.n_layers
        full = trainable_copy(loaded).eval()
        model = EncoderClassifier(
            trainable_copy(loaded), loaded.model_family, 2, classifier_layer=1
        ).eval()
        assert model.n_layers_kept == 1 and len(model.layers) == 1
        config = model.encoder.config
        assert getattr(config, "num_hidden_layers", getattr(config, "n_layers", None)) == 1
        per_layer = sum(p.numel() for p in model.layers[0].parameters())
        n_full = sum(p.numel() for n, p in full.named_parameters() if not n.startswith("pooler"))
        n_cut = sum(p.numel() for p in model.encoder.parameters())
        assert n_full - n_cut == (n_layers - 1) * per_layer
        batch, _ = make_batch(loaded.tokenizer)
        inputs = model_inputs(full, {k: v for k, v in batch.items() if k != "special_tokens_mask"})
        with torch.no_grad():
            expected = full(**inputs, output_hidden_states=True).hidden_states[1]
            got = model.encoder(**inputs).last_hidden_state
            assert model(**batch).shape == (8, 2)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_adapters_start_as_exact_identity(bert4):
    plain = build_model(cfg_for(bert4, "frozen"), bert4, 2, "cpu").model.eval()
    adapted = build_model(cfg_for(bert4, "adapter"), bert4, 2, "cpu").model.eval()
    sites = {name for _, name in ADAPTER_SITES}  # adapter_attn, adapter_ffn
    assert sum(name.rsplit(".", 1)[-1] in sites for name, _ in adapted.named_modules()) == 2 * 4
    batch, _ = make_batch(bert4.tokenizer)
    with torch.no_grad():
        assert torch.equal(plain(**batch), adapted(**batch))
    adapter = houlsby_adapter(16, 4)  # its hook adds the residual: x + adapter(x) = x at the start
    x = torch.randn(2, 3, 16)
    assert torch.equal(adapter(x), torch.zeros_like(x))
    assert [n for n, _ in adapter.named_parameters()] == ["down.weight", "down.bias", "up.weight",
                                                          "up.bias"]  # fmt: skip


def test_frozen_bottom_layers_build_no_graph(bert4):
    built = build_model(cfg_for(bert4, "layers", layers=(3, 3, 4)), bert4, 2, "cpu")
    model = built.model.train()
    seen: dict[int, bool] = {}
    for i, block in enumerate(model.layers):
        block.register_forward_hook(
            lambda m, a, out, i=i: seen.__setitem__(i + 1, _first(out).requires_grad)
        )
    batch, _ = make_batch(bert4.tokenizer)
    logits = model(**batch)
    assert seen == {1: False, 2: False, 3: True, 4: True}
    assert logits.requires_grad
    assert built.layers_backward == 2


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def test_zero_weights_sets_the_named_entries(tmp_path, bert4):
    name = "encoder.layer.1.attention.self.query.weight"
    path = tmp_path / "zero.json"
    path.write_text(json.dumps({name: [[0, 1], [5, 7]], "embeddings.LayerNorm.bias": [[3]]}))
    encoder = trainable_copy(bert4)
    original = dict(encoder.named_parameters())[name].detach().clone()
    assert apply_zero_weights(encoder, path) == 3
    params = dict(encoder.named_parameters())
    assert params[name][0, 1] == 0 and params[name][5, 7] == 0
    assert params["embeddings.LayerNorm.bias"][3] == 0
    keep = torch.ones_like(original, dtype=torch.bool)
    keep[0, 1] = keep[5, 7] = False
    assert torch.equal(params[name][keep], original[keep])
    built = build_model(cfg_for(bert4, "frozen", zero_weights=str(path)), bert4, 2, "cpu")
    assert built.model.layers[1].attention.self.query.weight[5, 7] == 0
    path.write_text(json.dumps({"nope.weight": [[0, 0]]}))
    with pytest.raises(ValueError, match=r"no parameter 'nope\.weight'"):
        apply_zero_weights(encoder, path)
    path.write_text(json.dumps({name: [[0, 999]]}))
    with pytest.raises(ValueError, match="outside its shape"):
        apply_zero_weights(encoder, path)


def test_every_method_has_a_preparer_and_subspace_methods_need_their_trajectory(bert4):
    assert all(callable(spec.prepare) for spec in method_specs())
    assert set(method_names()) == {"full", "layers", "heads", "adapter", "lora", "ia3", "bitfit",
                                   "frozen", "subspace", "subspace-random", "layer-set",
                                   "lora-eva"}  # fmt: skip
    cfg = cfg_for(bert4, "subspace", subspace_from="run-7")
    with pytest.raises(ValueError, match="needs the trajectory of 'run-7'"):
        build_model(cfg, bert4, 2, "cpu")


def test_truncated_copy_leaves_the_shared_model_alone(bert4, tmp_path):
    clone = truncated_copy(bert4, 2)
    assert len(encoder_layers(clone)) == 2 and clone.config.num_hidden_layers == 2
    assert len(encoder_layers(bert4.model)) == 4 and bert4.model.config.num_hidden_layers == 4
    assert not {id(p) for p in bert4.model.parameters()} & {id(p) for p in clone.parameters()}
    assert all(p.requires_grad for p in clone.parameters()) and clone.training
    assert not any(p.requires_grad for p in bert4.model.parameters())
    # zeroing entries of a cut-away layer is skipped, not an error
    path = tmp_path / "zero.json"
    path.write_text(json.dumps({"encoder.layer.3.output.dense.weight": [[0, 0]]}))
    built = build_model(
        cfg_for(bert4, "layers", layers=(1, 2, 2), zero_weights=str(path)), bert4, 2
    )
    assert built.model.n_layers_kept == 2 and built.n_params > 2 * built.n_trainable
