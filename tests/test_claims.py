"""The papers' claims: plans, reuse of finished runs and verdicts on fabricated run records and
fabricated repeats (no training, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import claims
from analysis.config import DataSpec, ModelSpec
from analysis.heads.selection_file import HeadSelection
from analysis.layers.repeats import LayerRepeats
from analysis.predictions import encode_predictions

N_LAYERS = 6


def config(**kwargs) -> claims.ClaimsConfig:
    base = dict(model=ModelSpec("m"), data=DataSpec("d"), seeds=(0, 1, 2), steps=40, repeats=50)
    return claims.ClaimsConfig(**{**base, **kwargs})


def fake_repeats(
    rho_sign: float = -1.0, l_star: int = 3, bumpy: bool = False, repeats: int = 50, noise=0.01,
    seed: int = 0,
) -> LayerRepeats:  # fmt: skip
    """R repeats (and 20 jackknife values) over layers 0..6: ν lowest at ``l_star``; the probe
    mirrors ν (ρ ≈ −1) or follows it (ρ ≈ +1); ``bumpy`` adds a zig-zag (a high ζ). The
    full-sample curve is one more draw like the repeats."""
    rng = np.random.default_rng(seed)
    layers = np.arange(N_LAYERS + 1)

    def table(eps: float) -> np.ndarray:
        nu = 1.0 + 0.2 * (layers - l_star) ** 2 + rng.normal(0, eps, len(layers))
        if bumpy:
            nu = nu + 2.0 * (layers % 2)
        probe = 0.9 + rho_sign * 0.05 * (nu - nu.mean()) / nu.std() + rng.normal(0, eps, len(nu))
        return np.stack([nu, 0.5 - 0.1 * nu, 50 + nu, probe], axis=1)

    values = np.stack([table(noise) for _ in range(repeats)])
    jack = np.stack([table(noise / 5) for _ in range(20)])
    return LayerRepeats(values=values, attrs={"repeats": repeats, "n": 1000}, full=table(noise),
                        jackknife=jack)  # fmt: skip


def test_layer_claims_verdicts_from_repeats():
    inputs = claims.ClaimInputs(
        n_layers=N_LAYERS, l_star=3, mean_repeats=fake_repeats(),
        first_repeats=fake_repeats(bumpy=True),
    )  # fmt: skip
    x1, x2, x3 = claims.layer_claims(inputs)
    assert (x1.id, x1.verdict) == ("X1", "holds") and x1.ours < -0.85 and x1.repeats == 50
    assert x1.interval[0] <= x1.ours <= x1.interval[1]
    assert (x2.verdict, x2.ours) == ("holds", 3.0) and "ℓ* = 3 in 50 of 50 repeats" in x2.detail
    assert x3.verdict == "holds" and x3.interval[0] > 0
    assert x3.interval[0] <= x3.ours <= x3.interval[1]
    assert "N = 1,000, R = 50, S = 1" in x1.detail and "holds on 1 of 1 sample" in x1.detail
    edge = claims.ClaimInputs(n_layers=N_LAYERS, mean_repeats=fake_repeats(+1.0, l_star=6),
                              first_repeats=fake_repeats(l_star=6))  # fmt: skip
    x1, x2, x3 = claims.layer_claims(edge)
    assert x1.verdict == "does not hold" and x2.verdict == "does not hold"
    assert x3.verdict in ("inconclusive", "does not hold")
    assert claims.layer_claims(claims.ClaimInputs(n_layers=6), ["X1"])[0].verdict == (
        "not measured yet"
    )


def sample(label, mean, first=None):
    return claims.SampleInputs(label, 1000, 3, mean, first)


def test_samples_that_disagree_are_unstable_never_the_first_samples_verdict():
    agree = claims.ClaimInputs(
        n_layers=N_LAYERS, sample_mode="disjoint",
        # (the fakes draw the full-sample table like a repeat, so about 1 in 10 lands in its own
        # bootstrap tail and gets no interval; these seeds do not)
        samples=[sample(f"s{i}", fake_repeats(seed=i), fake_repeats(bumpy=True, seed=3 + i))
                 for i in range(3)],
    )  # fmt: skip
    x1, x2, x3 = claims.layer_claims(agree)
    assert x1.verdict == x2.verdict == x3.verdict == "holds"
    assert "holds on 3 of 3 samples" in x1.detail and "S = 3 (disjoint samples)" in x1.detail
    assert claims.claims_table([x1])["n"][0] == "N = 1,000, R = 50, S = 3 (disjoint)"
    assert len(x1.values["samples"]) == 3
    split = claims.ClaimInputs(
        n_layers=N_LAYERS, sample_mode="overlapping",
        samples=[sample("a", fake_repeats()), sample("b", fake_repeats(+1.0, l_star=6)),
                 sample("c", fake_repeats())],
    )  # fmt: skip
    x1, x2 = claims.layer_claims(split, ["X1", "X2"])
    assert x1.verdict == "unstable" and x2.verdict == "unstable"
    assert "holds on 2 of 3 samples" in x1.detail and "overlapping" in x1.detail


def test_holds_and_holds_weakly_together_hold_weakly():
    per = [claims.ClaimResult("X1", v, ours=-0.9, interval=(-0.95, -0.6), repeats=50)
           for v in ("holds", "holds weakly")]  # fmt: skip
    out = claims.combine_samples("X1", per, [sample("a", None), sample("b", None)], "disjoint")
    assert out.verdict == "holds weakly"


def test_layer_samples_are_disjoint_when_the_data_allow():
    cfg = config(n=100, samples=3, sample_seed=4)
    mode, draws = claims.layer_samples(cfg, 300)
    assert mode == "disjoint" and [b for _, b in draws] == [range(0, 100), range(100, 200),
                                                             range(200, 300)]  # fmt: skip
    assert {s for s, _ in draws} == {4}
    mode, draws = claims.layer_samples(cfg, 299)
    assert mode == "overlapping" and [s for s, _ in draws] == [4, 5, 6]
    assert claims.layer_samples(config(n=100, samples=1), 50)[0] == "one sample"
    with pytest.raises(ValueError, match="at least 1 sample"):
        config(samples=0)


def test_x3_judges_the_interval_of_the_difference_not_a_share():
    """The old rule compared a share of repeats with 1 − 0.8 (= 0.19999…) as floats; now the
    verdict rests on the interval of ζ(first) − ζ(mean) around its full-sample value."""
    smoother_first = claims.layer_claims(
        claims.ClaimInputs(n_layers=N_LAYERS, mean_repeats=fake_repeats(bumpy=True),
                           first_repeats=fake_repeats()), ["X3"])[0]  # fmt: skip
    assert smoother_first.verdict == "does not hold" and smoother_first.interval[1] < 0


SELECTIONS = {
    s: HeadSelection({1: [i, i + 1], 2: [i]}, settings={"selector": s, "k": 2})
    for i, s in enumerate(("pagerank", "random", "richness", "correlation"))
}


def fabricated(planned, score_of, step_of=lambda arm: 0.1, fingerprint="t") -> pd.DataFrame:
    """Finished runs for every planned run: score_of(arm, seed) → test accuracy, with per-example
    predictions on one shared test part of 400 examples."""
    labels = np.array([0, 1] * 200)
    rows = []
    for i, p in enumerate(planned):
        score = score_of(p.arm, p.config.seed)
        wrong = np.random.default_rng(i).permutation(400) < round((1 - score) * 400)
        preds = np.where(wrong, 1 - labels, labels)
        result = {"score": float(np.mean(preds == labels)), "metric": "accuracy",
                  "step_time_s": step_of(p.arm),
                  "test_predictions": encode_predictions(preds, labels, fingerprint, False)}  # fmt: skip
        rows.append({"id": f"run-{i}", "status": "done", "metric": "accuracy",
                     "config_json": json.dumps(p.config.to_dict()), "result_json": json.dumps(result)})  # fmt: skip
    return pd.DataFrame(rows)


def noisy(mean: float):
    return lambda seed: mean + (-0.01, 0.0, 0.01)[seed % 3]


def test_run_claims_verdicts_on_fabricated_runs(tmp_path):
    cfg = config()
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, l_star=3, selections=SELECTIONS)
    means = {"full": 0.85, "(1, 3, 3)": 0.84, "PageRank heads": 0.80, "random heads": 0.70,
             "top-k I_h heads": 0.78, "top-k correlation heads": 0.83,
             "trajectory source": 0.85, "intrinsic subspace": 0.845, "random subspace": 0.60,
             "outliers zeroed": 0.75, "random weights zeroed": 0.755}  # fmt: skip

    def score(arm, seed):
        return noisy(means[arm])(seed)

    def step(arm):
        return 0.05 if arm == "(1, 3, 3)" else 0.1

    # Stage 0: no trajectory run yet, so the subspace claims plan only it.
    planned = claims.plan_runs(cfg, inputs, root=tmp_path)
    arms = {p.arm for p in planned}
    assert "trajectory source" in arms and "intrinsic subspace" not in arms
    assert sum(p.arm == "full" for p in planned) == 3  # X4's full runs, seeds 0..2
    pagerank = [p for p in planned if p.arm == "PageRank heads"]
    assert len(pagerank) == 3 and set(pagerank[0].claims) == {"H1", "H2"}  # planned once
    assert (
        pagerank[0].config.lr == 2e-4 and pagerank[0].config.classifier_lr == 1e-3
    )  # heads' own rate
    cut = next(p for p in planned if p.arm == "(1, 3, 3)")
    assert cut.config.layers == (1, 3, 3) and cut.config.lr == 5e-5
    runs = fabricated(planned, score, step)
    results = {r.id: r for r in claims.evaluate(cfg, inputs, planned, runs)}
    assert results["X4"].verdict == "holds" and results["X4"].n_seeds == 3
    assert results["X4"].values["step_time_ratio"] == pytest.approx(0.5)
    assert results["H1"].verdict == "holds"  # +0.10 ± 0.01
    assert results["H1"].ours == pytest.approx(0.10, abs=0.01)
    assert results["H1"].comparisons[0].paired_p < 0.01
    assert results["H2"].verdict == "does not hold"  # top-k correlation beats PageRank
    assert results["S1"].verdict == "not measured yet" and "trajectory" in results["S1"].detail

    # Stage 1: the trajectory run is done; the disable files exist.
    source = claims.source_run(cfg, runs)
    assert source["status"] == "done"
    for path in (claims.outlier_file(tmp_path, source["id"]),
                 *(claims.random_file(tmp_path, source["id"], s) for s in cfg.seeds)):  # fmt: skip
        (tmp_path / "subspace" / source["id"]).mkdir(parents=True, exist_ok=True)
        Path(path).write_text("{}")
    planned = claims.plan_runs(cfg, inputs, source=source["id"], root=tmp_path)
    missing = claims.missing_runs(planned, runs)
    assert {p.arm for p in missing} == {"intrinsic subspace", "random subspace",
                                        "outliers zeroed", "random weights zeroed"}  # fmt: skip
    assert len(missing) == 12  # the full runs of S1 are X4's: reused
    runs = pd.concat([runs, fabricated(missing, score).assign(id=lambda f: f["id"] + "b")])
    results = {r.id: r for r in claims.evaluate(cfg, inputs, planned, runs)}
    assert results["S1"].verdict == "holds"  # ≈ full, ≫ random subspace
    assert len(results["S1"].comparisons) == 2
    assert results["S2"].verdict == "inconclusive"  # −0.005 ± 0.012
    payload = claims.claims_json(cfg, list(results.values()))
    assert payload["model"] == "m" and payload["data"] == "d"
    first = payload["claims"][0]
    for key in ("id", "claim", "paper", "ours", "interval", "verdict", "n_seeds", "runs"):
        assert key in first
    assert json.loads(json.dumps(payload)) == payload


def test_missing_seeds_are_not_measured_yet_and_failed_runs_are_queued_again():
    cfg = config(only=("H1",))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, selections=SELECTIONS)
    planned = claims.plan_runs(cfg, inputs)
    assert len(planned) == 6
    runs = fabricated(planned[:5], lambda arm, seed: 0.8)
    runs.loc[0, "status"] = "failed"
    result = claims.evaluate(cfg, inputs, planned, runs)[0]
    assert result.verdict == "not measured yet" and "2 of 3" in result.detail
    assert len(claims.missing_runs(planned, runs)) == 2  # the failed one and the never-run one
    queued = runs.assign(status="queued")
    assert claims.missing_runs(planned, queued) == [planned[5]]  # queued ones are waited for


def test_l_star_at_the_top_plans_no_x4_runs():
    cfg = config(only=("X4",))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, l_star=N_LAYERS)
    assert claims.plan_runs(cfg, inputs) == []
    result = claims.evaluate(cfg, inputs, [], pd.DataFrame())[0]
    assert result.verdict == "inconclusive" and "ℓ* = L" in result.detail


def test_unlike_runs_are_not_reused():
    cfg = config(only=("X4",))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, l_star=3)
    planned = claims.plan_runs(cfg, inputs)
    other_steps = claims.plan_runs(config(only=("X4",), steps=41), inputs)
    runs = fabricated(other_steps, lambda arm, seed: 0.8)
    assert len(claims.missing_runs(planned, runs)) == len(planned)


def test_parse_only_and_settings():
    assert claims.parse_only("x1, H1") == ("X1", "H1")
    assert claims.parse_only(None) == tuple(claims.CLAIMS)
    with pytest.raises(ValueError, match="Unknown claim X9"):
        claims.parse_only("X9")
    with pytest.raises(ValueError, match="Seeds"):
        config(seeds=())
    with pytest.raises(ValueError, match="repeats"):
        config(repeats=1)
    cfg = config(only=("S1",))
    assert cfg.trajectory_run().trajectory_every == 40 // 16
    assert cfg.layer_claims == () and cfg.run_claims == ("S1",)


def test_heads_comparisons_match_selectors_of_one_setting():
    cfg = config(only=("H1", "H2"))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, selections=SELECTIONS)
    planned = claims.plan_runs(cfg, inputs)
    means = {"PageRank heads": 0.8, "random heads": 0.7, "top-k I_h heads": 0.8,
             "top-k correlation heads": 0.79}  # fmt: skip
    runs = fabricated(planned, lambda arm, seed: noisy(means[arm])(seed)).assign(method="heads")
    # A random-heads run with another k is a different setting: never compared with these.
    other = claims.plan_runs(config(only=("H1",), k=5), claims.ClaimInputs(
        n_layers=N_LAYERS, selections={s: HeadSelection(
            {1: [0]}, settings={"selector": s, "k": 5}) for s in ("pagerank", "random")}))  # fmt: skip
    runs = pd.concat([runs, fabricated(other, lambda arm, seed: 0.1).assign(method="heads",
                      id=lambda f: f["id"] + "k5")])  # fmt: skip
    found = {(c.name_a, c.name_b): c for c in claims.heads_comparisons(runs)}
    assert len(found) == 4  # k = 2: PageRank vs 3 others; k = 5: PageRank vs random
    by_b = {b.split(" ")[2]: c for (a, b), c in found.items() if "×3" in a}
    assert by_b["random"].verdict.endswith("pagerank better")
    assert by_b["richness"].verdict.startswith("no difference shown")
    assert all(c.n_seeds_a == 3 for (a, _), c in found.items() if "×3" in a)


def test_a_selector_that_picks_the_pagerank_heads_is_said_so():
    same = {**SELECTIONS, "correlation": HeadSelection({1: [0, 1], 2: [0]}, settings={"k": 2})}
    cfg = config(only=("H2",))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, selections=same)
    planned = claims.plan_runs(cfg, inputs)
    runs = fabricated(planned, lambda arm, seed: noisy(0.8)(seed))
    result = claims.evaluate(cfg, inputs, planned, runs)[0]
    assert "top-k correlation heads: same heads chosen: not tested" in result.detail
    assert len(result.comparisons) == 1  # only PageRank vs top-k I_h is a comparison
    assert result.comparisons[0].name_b == "top-k I_h heads"
    both = {**same, "richness": same["pagerank"]}
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, selections=both)
    result = claims.evaluate(cfg, inputs, planned, runs)[0]
    assert result.verdict == "inconclusive" and result.detail.startswith("same heads chosen")


def test_random_heads_are_drawn_anew_for_every_training_seed():
    draws = {s: HeadSelection({1: [s], 2: [s + 1]}, settings={"selector": "random", "seed": s})
             for s in (0, 1, 2)}  # fmt: skip
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, selections=SELECTIONS, random_selections=draws)
    planned = claims.plan_runs(config(only=("H1",)), inputs)
    random_arm = [p.config.options.heads for p in planned if p.arm == "random heads"]
    # one draw per seed, not one draw for all (the arm's runs train on seeds of their own)
    assert sorted(map(repr, random_arm)) == sorted(map(repr, draws.values()))


def test_run_claims_need_three_seeds_for_a_verdict():
    # One seed per arm: the cut model is 20 points worse and twice as fast. Without a standard
    # error "no difference shown" must not read as "holds".
    cfg = config(only=("X4",), seeds=(0,))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, l_star=3)
    planned = claims.plan_runs(cfg, inputs)
    runs = fabricated(planned, lambda arm, seed: 0.7 if arm == "(1, 3, 3)" else 0.9,
                      lambda arm: 0.05 if arm == "(1, 3, 3)" else 0.1)  # fmt: skip
    result = claims.evaluate(cfg, inputs, planned, runs)[0]
    assert result.verdict == "inconclusive" and result.n_seeds == 1
    assert "needs ≥ 3 seeds per arm (here 1)" in result.detail
    assert result.ours == pytest.approx(-0.2)  # the number is still shown


def test_x4_step_times_of_different_machines_are_not_compared():
    cfg = config(only=("X4",))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, l_star=3)
    planned = claims.plan_runs(cfg, inputs)
    runs = fabricated(planned, lambda arm, seed: noisy(0.85)(seed),
                      lambda arm: 0.05 if arm == "(1, 3, 3)" else 0.1)  # fmt: skip
    same = claims.evaluate(cfg, inputs, planned, runs.assign(device="cpu"))[0]
    assert same.verdict == "holds"
    mixed = runs.assign(device="cpu")
    mixed.loc[mixed["config_json"].str.contains('"layers": \\[1, 3\\]'), "device"] = "cuda:0"
    result = claims.evaluate(cfg, inputs, planned, mixed)[0]
    assert result.verdict == "inconclusive" and "step times not comparable" in result.detail


def test_heads_comparisons_never_pair_other_learning_rates():
    cfg = config(only=("H1",))
    inputs = claims.ClaimInputs(n_layers=N_LAYERS, selections=SELECTIONS)
    planned = claims.plan_runs(cfg, inputs)
    runs = fabricated(planned, lambda arm, seed: 0.8).assign(method="heads")
    assert len(claims.heads_comparisons(runs)) == 1
    faster = runs.copy()
    for i, text in enumerate(faster["config_json"]):
        config_ = json.loads(text)
        if config_["options"]["heads"]["settings"]["selector"] == "random":
            faster.loc[i, "config_json"] = json.dumps({**config_, "lr": config_["lr"] * 2})
    assert claims.heads_comparisons(faster) == []  # PageRank at lr vs random at 2 lr: not a pair
    twice = pd.concat([runs, runs.assign(id=lambda f: f["id"] + "again")], ignore_index=True)
    (c,) = claims.heads_comparisons(twice)
    assert (c.n_seeds_a, c.n_seeds_b) == (3, 3)  # a seed trained twice counts once


def test_ours_text_gives_l_star_with_its_count():
    x2 = claims.ClaimResult("X2", "holds", ours=4.0, repeats=50,
                            values={"l_star_counts": {"4": 41, "3": 9}})  # fmt: skip
    assert claims.ours_text(x2) == "ℓ* = 4 (41 of 50 repeats)"
    assert claims.ours_text(claims.ClaimResult("X3", "holds", ours=0.75)) == "+0.75"
