"""Fine-tuning inside a subspace: exact chain rule, only θ_j and the classifier train."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call
from transformers import AutoModel

from analysis.config import ModelSpec
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.methods.subspace import H_VECTORS
from analysis.finetune.methods.subspace import prepare as prepare_subspace
from analysis.finetune.methods.subspace_random import prepare as prepare_subspace_random
from analysis.finetune.methods.subspace_random import random_orthonormal
from analysis.finetune.model import EncoderClassifier
from analysis.finetune.prepared import MethodInputs
from analysis.subspace.outliers import find_outliers, outlier_positions_file
from analysis.subspace.spectrum import load_layer_svd
from analysis.subspace.trajectory import (
    TrajectoryRecorder,
    flatten_layer,
    layer_slots,
    open_trajectory,
)


def classifier_model(model_dir) -> EncoderClassifier:
    torch.manual_seed(0)
    return EncoderClassifier(AutoModel.from_pretrained(model_dir), "bert", 2).eval()


@pytest.fixture
def trajectory(tmp_path, tiny_bert_dir):
    """A 5-snapshot trajectory of random moves of a tiny BERT's layers."""
    model = classifier_model(tiny_bert_dir)
    rec = TrajectoryRecorder(tmp_path / "traj", model.layers, every=1)
    rec.maybe_record(0)
    g = torch.Generator().manual_seed(0)
    for step in range(1, 6):
        with torch.no_grad():
            for p in model.encoder.parameters():
                p.add_(1e-2 * torch.randn(p.shape, generator=g))
        rec.maybe_record(step)
    rec.close()
    return tmp_path / "traj"


def config(model_dir, method="subspace", source=None, seed=0) -> FinetuneConfig:
    return flat_config(
        model=ModelSpec(str(model_dir)), method=method, subspace_from=source, seed=seed
    )


def inputs(source) -> MethodInputs:
    """The source trajectory, as the engine hands it to the subspace methods."""
    return MethodInputs(open_trajectory(source) if source is not None else None)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 5, (4, 7), generator=g)  # the tiny tokenizer's vocabulary
    return ids, torch.ones(4, 7, dtype=torch.long), torch.tensor([0, 1, 0, 1])


def test_hook_gradient_equals_autograd_through_the_reparameterisation(tiny_bert_dir, trajectory):
    model = classifier_model(tiny_bert_dir)
    prepared = prepare_subspace(
        model, config(tiny_bert_dir, source=str(trajectory)), inputs(str(trajectory))
    )
    ids, mask, y = batch()
    torch.nn.functional.cross_entropy(model(ids, mask), y).backward()
    hook_grads = [sub.coords.grad.clone() for sub in model.subspace]
    assert all(p.grad is None for layer in model.layers for p in layer.parameters())

    # the same loss as an explicit function of the θ_j: θ_layer = θ_0 + V · mean_j θ_j
    coords = [sub.coords.detach().clone().requires_grad_(True) for sub in model.subspace]
    override = {}
    for number, (layer, sub, c) in enumerate(
        zip(model.layers, model.subspace, coords, strict=True), start=1
    ):
        flat = sub.theta0 + sub.V @ c.mean(dim=0)
        prefix = f"encoder.encoder.layer.{number - 1}."
        for slot in layer_slots(layer):
            override[prefix + slot.name] = flat[slot.offset : slot.offset + slot.numel].view(
                slot.shape
            )
    logits = functional_call(model, override, (ids, mask))
    torch.nn.functional.cross_entropy(logits, y).backward()
    for got, want in zip(hook_grads, [c.grad for c in coords], strict=True):
        assert got.shape == (H_VECTORS, 5)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-9)
    assert prepared.n_trainable == 2 * H_VECTORS * 5 + sum(
        p.numel() for p in model.classifier.parameters()
    )


def test_only_theta_j_and_classifier_train(tiny_bert_dir, trajectory):
    model = classifier_model(tiny_bert_dir)
    prepared = prepare_subspace(
        model, config(tiny_bert_dir, source=str(trajectory)), inputs(str(trajectory))
    )
    frozen_before = {
        n: p.detach().clone() for n, p in model.named_parameters() if "embeddings" in n
    }
    coords_before = [sub.coords.detach().clone() for sub in model.subspace]
    theta0 = [sub.theta0.clone() for sub in model.subspace]
    head_before = model.classifier.out.weight.detach().clone()
    optimizer = torch.optim.AdamW(prepared.param_groups(0.01), lr=1e-2)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    encoder_ids = {id(p) for p in model.encoder.parameters()}
    assert not trained & encoder_ids  # no encoder tensor is in the optimizer
    ids, mask, y = batch()
    for _ in range(3):
        torch.nn.functional.cross_entropy(model(ids, mask), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        prepared.after_step()
    for name, before in frozen_before.items():
        assert torch.equal(dict(model.named_parameters())[name], before), name
    assert not torch.equal(model.classifier.out.weight, head_before)
    for layer, sub, c0, t0 in zip(model.layers, model.subspace, coords_before, theta0, strict=True):
        assert not torch.equal(sub.coords, c0)  # the θ_j moved
        assert torch.equal(sub.theta0, t0)  # θ_0 is kept as it was
        moved = flatten_layer(layer) - t0  # effective weights moved, inside span(V)
        assert moved.norm() > 1e-4
        torch.testing.assert_close(moved, sub.V @ sub.coords.detach().mean(0), atol=1e-6, rtol=0)
    # a saved state restores the θ_j with the weights (and carries no copy of V)
    state = model.state_dict()
    assert "subspace.0.coords" in state and not any(k.endswith(".V") for k in state)


def test_random_subspace_has_the_intrinsic_shape_and_is_orthonormal(tiny_bert_dir, trajectory):
    basis = random_orthonormal(5000, 12, torch.Generator().manual_seed(0))
    torch.testing.assert_close(basis.T @ basis, torch.eye(12), atol=1e-5, rtol=0)
    again = random_orthonormal(5000, 12, torch.Generator().manual_seed(0))
    assert torch.equal(basis, again)
    model = classifier_model(tiny_bert_dir)
    prepare_subspace_random(
        model, config(tiny_bert_dir, "subspace-random", str(trajectory)), inputs(str(trajectory))
    )
    intrinsic = classifier_model(tiny_bert_dir)
    prepare_subspace(
        intrinsic, config(tiny_bert_dir, source=str(trajectory)), inputs(str(trajectory))
    )
    for rand, real in zip(model.subspace, intrinsic.subspace, strict=True):
        assert rand.V.shape == real.V.shape
        assert (rand.V.T @ real.V).abs().max() < 0.2  # unrelated directions
    fallback = classifier_model(tiny_bert_dir)
    prepare_subspace_random(fallback, config(tiny_bert_dir, "subspace-random"), inputs(None))
    assert fallback.subspace[0].V.shape[1] == 32


def test_subspace_from_another_model_is_refused(tmp_path, trajectory):
    from tiny import make_tiny_model_dir

    other = make_tiny_model_dir("bert", tmp_path, d_model=16)
    model = EncoderClassifier(AutoModel.from_pretrained(other), "bert", 2)
    with pytest.raises(ValueError, match="different model"):
        prepare_subspace(model, config(other, source=str(trajectory)), inputs(str(trajectory)))


def test_engine_records_then_trains_in_the_subspace_and_zeroes_weights(tmp_path, tiny_bert_dir):
    from analysis.finetune.engine import run_finetune

    def cfg(**kw) -> FinetuneConfig:
        base = dict(
            model=ModelSpec(str(tiny_bert_dir)), steps=4, batch_size=4, n_train=32, n_eval=16,
            eval_every=4, device="cpu",
        )  # fmt: skip
        return flat_config(**{**base, **kw})

    full = run_finetune(cfg(method="full", trajectory_every=1), run_dir=tmp_path / "full")
    traj = open_trajectory(full.trajectory_dir)
    assert traj.t == 4 and traj.layers == [1, 2] and traj.family == "bert"
    assert full.trajectory["bytes_per_snapshot"] == traj.bytes_per_snapshot

    sub = run_finetune(
        cfg(method="subspace", subspace_from=full.trajectory_dir, steps=3, trajectory_every=3),
        run_dir=tmp_path / "sub",
    )
    ranks = [load_layer_svd(traj, layer)[0].V.shape[1] for layer in traj.layers]
    n_classifier = sub.n_trainable - H_VECTORS * sum(ranks)
    assert 0 < n_classifier < 32 * 32 + 100  # dense + out of a d_model-32 classifier
    moved = open_trajectory(sub.trajectory_dir)
    for layer in moved.layers:  # the subspace run's update lies in the first run's subspace
        V = load_layer_svd(traj, layer)[0].V
        u = moved.delta(moved.t, layer)
        assert u.norm() > 0
        torch.testing.assert_close(V @ (V.T @ u), u, atol=1e-6, rtol=1e-3)

    # the disable experiment: the engine zeroes exactly the positions our file names
    planted = torch.zeros(traj.n_params(2))
    planted[[7, 300, 2500, 8000]] = 1.0
    lo = find_outliers(planted, traj, 2)
    outlier_positions_file(traj, [lo], tmp_path / "zero.json")
    zeroed = run_finetune(
        cfg(method="frozen", zero_weights=str(tmp_path / "zero.json"), steps=1, trajectory_every=1),
        run_dir=tmp_path / "zeroed",
    )
    theta0 = open_trajectory(zeroed.trajectory_dir).theta0(2)
    assert lo.n_outliers == 4 and torch.all(theta0[lo.indices] == 0)
    assert torch.equal(theta0 != traj.theta0(2), (planted == 1) & (traj.theta0(2) != 0))


def test_comparison_configs_per_seed(tiny_bert_dir):
    from analysis.runs.comparisons import comparison_configs

    base = FinetuneConfig(model=ModelSpec(str(tiny_bert_dir)), method="full", steps=7, lr=3e-5)
    configs = comparison_configs(base, "run-a", [0, 1], "/z/out.json", lambda s: f"/z/r{s}.json")
    assert len(configs) == 12
    by = {(g, c.seed): c for g, c in configs}
    sub = by[("intrinsic subspace", 1)]
    assert sub.method == "subspace" and sub.option("run") == "run-a"
    assert sub.lr == 1e-2  # the method's default learning rate
    assert all(c.trajectory_every is None for _, c in configs)  # no trajectory unless asked
    assert by[("random subspace", 0)].method == "subspace-random"
    assert by[("random weights zeroed", 1)].zero_weights == "/z/r1.json"
    assert by[("outliers zeroed", 0)].zero_weights == "/z/out.json"
    assert by[("full", 0)].zero_weights is None and by[("frozen", 0)].method == "frozen"
    assert all(c.steps == 7 for _, c in configs)
    asked = comparison_configs(base, "run-a", [0], record_ends=True)
    every = {g: c.trajectory_every for g, c in asked}
    assert every == {"full": None, "intrinsic subspace": 7, "random subspace": 7, "frozen": None}


def test_a_subspace_found_on_one_dataset_trains_on_another(tmp_path, tiny_bert_dir):
    """The paper's inductive setting: movie snippets (2 classes) → TREC (6 classes)."""
    from analysis.config import DataSpec
    from analysis.finetune.engine import run_finetune

    common = dict(
        model=ModelSpec(str(tiny_bert_dir)), batch_size=4, n_train=32, n_eval=24, device="cpu"
    )
    source = run_finetune(
        FinetuneConfig(
            **common,
            data=DataSpec("movie-snippets"),
            method="full",
            steps=4,
            eval_every=4,
            trajectory_every=1,
        ),
        run_dir=tmp_path / "source",
    )
    target = run_finetune(
        flat_config(
            **common,
            data=DataSpec("trec6"),
            method="subspace",
            steps=3,
            eval_every=3,
            subspace_from=source.trajectory_dir,
        ),
        run_dir=tmp_path / "target",
    )
    assert target.metric == "accuracy" and 0.0 <= target.score <= 1.0
    assert target.n_trainable < source.n_trainable
    assert target.config["data"]["name"] == "trec6"
