"""The choices on synthetic analyses with known answers: which candidates ℓ* and the probe curve
give, what a params budget sizes, and a choice listed twice only once, with a note."""

from __future__ import annotations

import pandas as pd

from analysis.config import DataSpec, ModelSpec
from analysis.finetune.config import FinetuneConfig
from analysis.recommend.choices import propose, sizes
from analysis.recommend.config import Budget, RecommendConfig
from analysis.recommend.evidence import Evidence


def evidence(nu, probe, probe_se=0.01, l_star_counts=None) -> Evidence:
    layers = list(range(len(nu)))
    table = pd.DataFrame({"layer": layers, "nu": nu, "probe": probe, "probe_se": probe_se})
    body = table[table["layer"] >= 1]
    return Evidence(
        n_layers=len(nu) - 1, n_heads=2, d_model=8, family="bert", metric="accuracy",
        n_outputs=2, table=table, l_star=int(body.loc[body["nu"].idxmin(), "layer"]),
        repeats=50, l_star_counts=l_star_counts or {}, heads=None,
        snr={layer: float(layer % 3) for layer in layers[1:]}, block_params=100,
        encoder_params=1000,
    )  # fmt: skip


def config(**kwargs) -> RecommendConfig:
    return RecommendConfig(model=ModelSpec("m"), data=DataSpec("movie-snippets"), **kwargs)


def test_l_star_and_the_probe_plateau_give_their_layer_sets():
    # ν lowest at layer 4; the probe reaches its plateau (within 0.01 of 0.80) at layer 5
    ev = evidence(nu=[9, 5, 4, 3, 1, 2, 2], probe=[0.5, 0.6, 0.7, 0.75, 0.78, 0.795, 0.80],
                  l_star_counts={4: 41, 5: 9})  # fmt: skip
    proposal = propose(config(), ev)
    by_name = {c.name: c for c in proposal.choices}
    assert by_name["layers 2–4 (ℓ*)"].layers == (2, 4, 4)
    assert "ℓ* = 4, chosen in 41 of 50 repeats (5 in 9)" in by_name["layers 2–4 (ℓ*)"].evidence
    assert "layers 5–6 removed" in by_name["layers 2–4 (ℓ*)"].trains
    assert by_name["layers 3–5 (probe)"].layers == (3, 5, 5)
    lora = by_name["LoRA by probe gain"]
    assert lora.lora.total_rank == 8 * 6 and lora.options == lora.lora.options()
    assert lora.method == "lora" and lora.config(FinetuneConfig()).to_dict()["options"]["ranks"]
    # the alternatives match the first layer candidate's 3 layers
    assert by_name["last 3 layers"].layers == (4, 6, 6)
    assert by_name["3 random layers"].options.k == 3
    # SNR per layer 1..6 = 1, 2, 0, 1, 2, 0: the top 3 are layers 2 and 5, then 1 (a tie with 4)
    assert "layers 1, 2, 5 (highest weight" in by_name["3 SNR layers"].trains
    assert by_name["uniform LoRA r=8"].matched_to == "LoRA by probe gain"
    assert [c.role for c in proposal.choices][:1] == ["reference"]


def test_a_choice_that_another_already_is_is_listed_once_with_a_note():
    # ℓ* = L = 6: the ℓ* layers are the last 3 layers; a flat probe: LoRA by gain is uniform
    ev = evidence(nu=[9, 8, 7, 6, 5, 4, 3], probe=[0.8] * 7)
    proposal = propose(config(), ev)
    names = [c.name for c in proposal.choices]
    assert "layers 4–6 (ℓ*)" in names and "last 3 layers" not in names
    assert "LoRA by probe gain" not in names and "uniform LoRA r=8" in names
    notes = " ".join(proposal.notes)
    assert "last 3 layers is layers 4–6 (ℓ*) itself" in notes
    assert "allocation is uniform LoRA (rank 8 in every layer) itself" in notes


def test_a_params_budget_sizes_layers_and_lora_rank():
    ev = evidence(nu=[9, 5, 4, 3, 1, 2, 2], probe=[0.5, 0.6, 0.7, 0.75, 0.78, 0.795, 0.80])
    # n_params = 1000 + classifier (8·8 + 8 + 8·2 + 2 = 90) = 1090; 30 % = 327 → body ≤ 237
    sized = sizes(config(budget=Budget("params", 0.30)), ev)
    assert sized["layers"] == 2  # 2 × 100 ≤ 237 < 3 × 100
    assert sized["lora_r"] == 1  # 4 · d · r · L = 192 r
    assert sizes(config(), ev) == {"layers": 3, "heads": 2, "lora_r": 8}  # 3 heads, of 2: 2
