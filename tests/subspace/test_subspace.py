"""Trajectory recording, the Gram-route SVD, outliers and the disable-experiment files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from analysis.cache import DiskCache
from analysis.runs import comparisons
from analysis.subspace import outliers, spectrum, trajectory


def toy_layers(n_layers: int = 2) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5)) for _ in range(n_layers)]


@torch.no_grad()
def set_flat(layer: nn.Module, vector: torch.Tensor) -> None:
    """Write θ (in the recorder's order) into the layer's parameters."""
    params = dict(layer.named_parameters())
    for slot in trajectory.layer_slots(layer):
        params[slot.name].copy_(vector[slot.offset : slot.offset + slot.numel].view(slot.shape))


def record(tmp_path, thetas: list[list[torch.Tensor]], layers, dtype="float32", every=1):
    """Record θ_j of every layer (thetas[j][layer index]) as steps 0, every, 2·every, …"""
    rec = trajectory.TrajectoryRecorder(tmp_path / "traj", layers, every=every, dtype=dtype)
    for j, per_layer in enumerate(thetas):
        for layer, theta in zip(layers, per_layer, strict=True):
            set_flat(layer, theta)
        assert rec.maybe_record(j * every)
    return rec.close(), trajectory.open_trajectory(tmp_path / "traj")


def random_thetas(layers, t: int, scale: float = 1e-2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    theta0 = [trajectory.flatten_layer(layer).clone() for layer in layers]
    return [theta0] + [
        [th + scale * torch.randn(th.shape, generator=g) for th in theta0] for _ in range(t)
    ]


def test_recorder_round_trip_values_dtype_and_bytes(tmp_path):
    layers = toy_layers()
    thetas = random_thetas(layers, t=4)
    info, traj = record(tmp_path, thetas, layers, dtype="float16")
    dim = 6 * 5 + 5 + 5 + 5  # Linear weight + bias, LayerNorm weight + bias
    assert info["n_params"] == [dim, dim] and info["n_snapshots"] == 5
    assert traj.t == 4 and traj.layers == [1, 2] and traj.n_params(1) == dim
    assert [s.name for s in traj.slots[1]] == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert info["bytes_per_snapshot"] == (tmp_path / "traj" / traj.files[1]).stat().st_size
    assert 2 * 2 * dim <= info["bytes_per_snapshot"] < 2 * 2 * dim + 400  # float16 + header
    torch.testing.assert_close(traj.theta0(2), thetas[0][1], rtol=0, atol=0)  # θ_0 is float32
    for j in (1, 4):
        exact = thetas[j][0] - thetas[0][0]
        stored = traj.delta(j, 1)
        assert stored.dtype == torch.float32
        torch.testing.assert_close(stored, exact.half().float(), rtol=0, atol=0)
        torch.testing.assert_close(traj.theta(j, 1), thetas[j][0], rtol=0, atol=1e-4)


def test_recorder_every_k_and_final_step(tmp_path):
    layers = toy_layers(1)
    rec = trajectory.TrajectoryRecorder(tmp_path / "t", layers, every=3)
    written = [rec.maybe_record(step) for step in range(8)]
    assert written == [True, False, False, True, False, False, True, False]
    info = rec.close()
    assert info["steps"] == [0, 3, 6]  # multiples of every only
    index = json.loads((tmp_path / "t" / "index.json").read_text())
    assert [s["step"] for s in index["snapshots"]] == [0, 3, 6]
    with pytest.raises(RuntimeError, match="closed"):
        rec.maybe_record(9)
    assert not list((tmp_path / "t").glob(".tmp-*"))
    with pytest.raises(ValueError, match="already holds"):
        trajectory.TrajectoryRecorder(tmp_path / "t", layers, every=3)
    with pytest.raises(ValueError, match="dtype"):
        trajectory.TrajectoryRecorder(tmp_path / "u", layers, every=1, dtype="int8")
    with pytest.raises(ValueError, match="positive"):
        trajectory.TrajectoryRecorder(tmp_path / "v", layers, every=0)


def test_open_trajectory_refuses_too_short(tmp_path):
    layers = toy_layers(1)
    rec = trajectory.TrajectoryRecorder(tmp_path / "t", layers, every=5)
    rec.maybe_record(0)
    rec.close()
    with pytest.raises(trajectory.TrajectoryError, match="at least one trained snapshot"):
        trajectory.open_trajectory(tmp_path / "t")
    with pytest.raises(trajectory.TrajectoryError, match=r"index\.json"):
        trajectory.open_trajectory(tmp_path / "nothing")


@pytest.mark.parametrize("centre", [False, True])
def test_gram_route_equals_direct_svd(tmp_path, centre):
    layers = toy_layers(1)
    thetas = random_thetas(layers, t=7)
    _, traj = record(tmp_path, thetas, layers)
    W = torch.stack([thetas[j][0] - thetas[0][0] for j in range(1, 8)]).double()  # (t, D)
    if centre:
        W = W - W.mean(dim=0, keepdim=True)
    _, s_direct, vh = torch.linalg.svd(W, full_matrices=False)
    # a tiny block forces many column blocks, so block seams are exercised
    s, V, evr = spectrum.trajectory_svd(traj, 1, centre=centre, block_bytes=8 * 7 * 3)
    r = V.shape[1]
    assert r == (6 if centre else 7)  # centring removes one dimension
    torch.testing.assert_close(s[:r], s_direct[:r], rtol=1e-5, atol=1e-9)
    assert torch.all(s[r:] == 0)
    cos = (V.double().T @ vh[:r].T).abs()  # columns equal up to sign
    torch.testing.assert_close(
        cos.diagonal(), torch.ones(r, dtype=torch.float64), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(evr.sum().item(), 1.0)
    torch.testing.assert_close(V.T @ V, torch.eye(r), atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_known_k_dim_subspace_gives_k_nonzero_singular_values(tmp_path, dtype):
    layers = toy_layers(1)
    theta0 = trajectory.flatten_layer(layers[0]).clone()
    g = torch.Generator().manual_seed(3)
    k, t = 3, 9
    basis = torch.linalg.qr(torch.randn(theta0.numel(), k, generator=g))[0]  # (D, k)
    coords = torch.randn(t, k, generator=g) * torch.tensor([1.0, 0.3, 0.05])
    thetas = [[theta0]] + [[theta0 + 0.01 * basis @ coords[j]] for j in range(t)]
    _, traj = record(tmp_path, thetas, layers, dtype=dtype)
    s, V, _ = spectrum.trajectory_svd(traj, 1)
    assert int((s > 0).sum()) == k and V.shape == (theta0.numel(), k)
    overlap = torch.linalg.svdvals(V.double().T @ basis.double())  # principal angles' cosines
    assert overlap.min() > 0.99


def test_spectrum_all_layers_cached_and_90_percent(tmp_path):
    layers = toy_layers(2)
    _, traj = record(tmp_path, random_thetas(layers, t=5), layers)
    cache = DiskCache(tmp_path / "cache")
    seen = []
    spectra = spectrum.spectrum_all_layers(traj, cache=cache, progress=lambda f, m: seen.append(f))
    assert [sp.layer for sp in spectra] == [1, 2] and seen[-1] == 1.0
    assert all(len(sp.singular_values) == 5 and sp.rank == 5 for sp in spectra)
    _, hit = spectrum.load_layer_svd(traj, 2, cache=cache)
    assert hit
    sp = spectrum.LayerSpectrum(1, 10, [3, 2, 1, 0], [0.6, 0.25, 0.1, 0.05], 4)
    assert sp.n_directions(0.9) == 3 and sp.n_directions(0.6) == 1


def bert_layer_trajectory(tmp_path, tiny_bert_dir):
    from transformers import AutoModel

    from analysis.models import encoder_layers

    model = AutoModel.from_pretrained(tiny_bert_dir)
    layers = encoder_layers(model)
    rec = trajectory.TrajectoryRecorder(
        tmp_path / "traj", layers, every=1, prefixes=trajectory.layer_prefixes(model, layers)
    )
    rec.maybe_record(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3)
    rec.maybe_record(1)
    rec.close()
    return model, trajectory.open_trajectory(tmp_path / "traj")


def test_planted_outlier_maps_back_to_its_parameter_entry(tmp_path, tiny_bert_dir):
    model, traj = bert_layer_trajectory(tmp_path, tiny_bert_dir)
    assert traj.family == "bert" and traj.prefixes[2] == "encoder.layer.1."
    g = torch.Generator().manual_seed(0)
    u = 0.01 * torch.randn(traj.n_params(2), generator=g)
    plants = {
        ("attention.output.dense.weight", (5, 7)): 1.0,  # W[out=d_model, in]: hidden = row
        ("attention.self.query.weight", (3, 11)): -0.9,  # W[heads, in=d_model]: hidden = col
        ("output.LayerNorm.bias", (19,)): 0.8,
        ("intermediate.dense.bias", (2,)): 0.7,  # d_ff space: no hidden index
    }
    for (name, entry), value in plants.items():
        u[traj.flat_index(2, name, entry)] = value
    lo = outliers.find_outliers(u, traj, 2, top_k=4)
    assert 4 <= lo.n_outliers < 20
    got = {(e["param"], e["row"], e["col"]): e for e in lo.top}
    a = got[("attention.output.dense.weight", 5, 7)]
    assert a["kind"] == "attention output" and a["hidden_dim"] == 5 and a["value"] == 1.0
    assert a["name"] == "encoder.layer.1.attention.output.dense.weight"
    q = got[("attention.self.query.weight", 3, 11)]
    assert q["kind"] == "query" and q["hidden_dim"] == 11
    ln = got[("output.LayerNorm.bias", 19, None)]
    assert ln["kind"] == "LayerNorm" and ln["hidden_dim"] == 19
    b = got[("intermediate.dense.bias", 2, None)]
    assert b["kind"] == "bias" and b["hidden_dim"] is None
    assert lo.top[0]["param"] == "attention.output.dense.weight"  # ordered by |u|
    # the named entry of the real model is the one the flat index points at
    params = dict(model.named_parameters())
    flat = trajectory.flatten_layer(model.encoder.layer[1])
    idx = traj.flat_index(2, "attention.output.dense.weight", (5, 7))
    assert flat[idx] == params[a["name"]][5, 7]


def test_recurring_dims_counts_each_layer_once():
    def lo(layer, dims):
        top = [{"hidden_dim": d} for d in dims]
        return outliers.LayerOutliers(layer, 100, 0.0, 1.0, 3.0, torch.arange(len(dims)), top)

    rows = outliers.recurring_dims([lo(1, [7, 7, 3, None]), lo(2, [7, 5]), lo(3, [3, 7])])
    assert rows[0] == {"hidden_dim": 7, "n_layers": 3, "layers": [1, 2, 3]}
    assert rows[1] == {"hidden_dim": 3, "n_layers": 2, "layers": [1, 3]}
    assert rows[2]["hidden_dim"] == 5


def test_disable_files_zero_exactly_the_named_weights(tmp_path, tiny_bert_dir):
    model, traj = bert_layer_trajectory(tmp_path, tiny_bert_dir)
    found = []
    for layer in traj.layers:
        u = torch.zeros(traj.n_params(layer))
        u[torch.tensor([3, 400, 1000 + layer])] = torch.tensor([5.0, -4.0, 6.0])
        found.append(outliers.find_outliers(u, traj, layer))
    info = outliers.outlier_positions_file(traj, found, tmp_path / "zero.json")
    assert info["n_weights"] == 6
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flat_before = [trajectory.flatten_layer(layer).clone() for layer in model.encoder.layer]
    assert outliers.apply_zero_weights(model, tmp_path / "zero.json") == 6
    for i, layer in enumerate(model.encoder.layer):
        flat = trajectory.flatten_layer(layer)
        changed = torch.nonzero(flat != flat_before[i]).flatten().tolist()
        planted = sorted([3, 400, 1000 + i + 1])
        assert set(changed) <= set(planted) and torch.all(flat[planted] == 0)
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert "embeddings.word_embeddings.weight" in unchanged
    # the random control: same count per layer, seeded, different positions
    rand_a = outliers.random_positions_like(traj, found, seed=1, path=tmp_path / "rand.json")
    rand_b = outliers.random_positions_like(traj, found, seed=1)
    assert rand_a == rand_b == outliers.read_zero_weights(tmp_path / "rand.json")
    assert sum(map(len, rand_a.values())) == 6
    assert rand_a != outliers.random_positions_like(traj, found, seed=2)


def test_apply_zero_weights_refuses_foreign_names(tiny_bert_dir):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_bert_dir)
    with pytest.raises(ValueError, match="no parameter"):
        outliers.apply_zero_weights(model, {"encoder.layer.9.x.weight": [[0, 0]]})
    with pytest.raises(ValueError, match="outside"):
        outliers.apply_zero_weights(model, {"encoder.layer.0.output.dense.weight": [[0, 999]]})


def test_infer_family_and_abs_profile():
    assert trajectory.infer_family(["attention.q_lin.weight", "ffn.lin1.weight"]) == "distilbert"
    assert trajectory.infer_family(["attention.self.query.weight"]) == "bert"
    profile = outliers.abs_profile(torch.tensor([0.0, -5.0, 1.0, 1.0, 2.0, 0.0]), n_bins=3)
    assert profile.tolist() == [5.0, 1.0, 2.0]


def test_comparison_groups_and_summary():
    import pandas as pd

    def run(i, seed, score, **config):
        config = {"method": "full", "zero_weights": None, "subspace_from": None, **config}
        return {"id": f"r{i}", "status": "done", "seed": seed, "score": score,
                "metric": "accuracy", "n_trainable": 10, "config_json": json.dumps(config)}  # fmt: skip

    runs = pd.DataFrame(
        [
            run(0, 0, 0.90),
            run(1, 1, 0.80),
            run(2, 0, 0.85, method="subspace", subspace_from="src"),
            run(3, 0, 0.55, method="subspace", subspace_from="other-run"),  # not ours
            run(4, 0, 0.60, method="subspace-random", subspace_from="/traj/src"),
            run(5, 0, 0.50, method="frozen"),
            run(6, 0, 0.70, zero_weights="/z/outliers.json"),
            run(7, 0, 0.88, zero_weights="/z/random-0.json"),
            run(8, 0, 0.10, zero_weights="/z/unrelated.json"),  # not ours
            {**run(9, 2, 0.99), "status": "running"},
        ]
    )
    table = comparisons.comparison_table(
        runs, ("src", "/traj/src"), "/z/outliers.json", ["/z/random-0.json"]
    )
    assert dict(zip(table["id"], table["group"], strict=True)) == {
        "r0": "full", "r1": "full", "r2": "intrinsic subspace", "r4": "random subspace",
        "r5": "frozen", "r6": "outliers zeroed", "r7": "random weights zeroed",
    }  # fmt: skip
    summary = comparisons.summarise_comparison(table)
    assert summary["group"].tolist() == list(comparisons.COMPARISON_GROUPS)
    full = summary.iloc[0]
    assert full["n_seeds"] == 2 and full["score"] == pytest.approx(0.85)
    assert full["score_sem"] == pytest.approx(np.std([0.9, 0.8], ddof=1) / np.sqrt(2))
    assert np.isnan(summary.iloc[1]["score_sem"])  # one seed: no error bar


def test_comparison_never_pools_unlike_runs_and_gives_verdicts():
    import pandas as pd

    def run(i, seed, score, **config):
        config = {"method": "full", "seed": seed, **config}
        return {"id": f"r{i}", "status": "done", "seed": seed, "score": score,
                "metric": "accuracy", "n_trainable": 10, "config_json": json.dumps(config)}  # fmt: skip

    runs = pd.DataFrame(
        [
            # the example: seed-0 full runs of 30, 100 and 150 steps are not 3 seeds
            run(0, 0, 0.70, steps=30), run(1, 0, 0.75, steps=100), run(2, 0, 0.82, steps=150),
            run(3, 1, 0.76, steps=100),
            run(4, 0, 0.60, steps=100, zero_weights="/z/outliers.json"),
            run(5, 1, 0.62, steps=100, zero_weights="/z/outliers.json"),
            run(6, 0, 0.74, steps=100, zero_weights="/z/random-0.json"),
            run(7, 1, 0.75, steps=100, zero_weights="/z/random-1.json"),
        ]
    )  # fmt: skip
    table = comparisons.comparison_table(
        runs, ("src",), "/z/outliers.json", ["/z/random-0.json", "/z/random-1.json"]
    )
    summary = comparisons.summarise_comparison(table).set_index("label")
    full = summary[summary["group"] == "full"]
    assert sorted(full.index) == ["full · steps 100", "full · steps 150", "full · steps 30"]
    assert full.loc["full · steps 100", "n_seeds"] == 2 and sorted(full["n_seeds"]) == [1, 1, 2]
    # the random control draws its weights per seed: one setting, two seeds
    assert summary.loc["random weights zeroed", "n_seeds"] == 2
    verdicts = comparisons.comparison_verdicts(table)
    assert [(c.name_a, c.name_b) for c in verdicts] == [
        ("outliers zeroed", "random weights zeroed")
    ]
    assert verdicts[0].verdict == "random weights zeroed better"  # −0.135 ± 0.011
