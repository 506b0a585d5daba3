"""``python -m tunescope layers``: the JSON schema, the readable table, the metrics cache."""

from __future__ import annotations

import json
import math

import pandas as pd

from tunescope.cli import main


def run_layers(tiny_bert_dir, tmp_path, *extra: str) -> tuple[int, dict | None]:
    out = tmp_path / "layers.json"
    argv = ["layers", "--model", str(tiny_bert_dir), "--n", "40", "--json", str(out), *extra]
    code = main(argv)
    return code, json.loads(out.read_text()) if out.exists() else None


def test_cli_writes_the_documented_schema(tiny_bert_dir, tmp_path, capsys):
    code, payload = run_layers(tiny_bert_dir, tmp_path, "--seed", "3")
    assert code == 0
    assert payload["model"] == str(tiny_bert_dir)
    assert payload["data"] == "movie-snippets"
    assert payload["n"] == 40 and payload["pooling"] == "mean" and payload["seed"] == 3
    layers = payload["layers"]
    assert [row["layer"] for row in layers] == [0, 1, 2]  # tiny model: L = 2, plus embeddings
    for row in layers:
        assert set(row) == {"layer", "nu", "cca", "rank", "probe", "probe_c", "probe_se"}
        assert row["nu"] > 0 and 1 <= row["rank"] <= 20 and 0 <= row["probe"] <= 1
        assert -1 <= row["cca"] <= 1
    nus = {row["layer"]: row["nu"] for row in layers}
    assert payload["l_star"] == min((1, 2), key=nus.get)  # never layer 0
    assert payload["zeta"] is None  # two layers have no interior point
    assert set(payload["rho"]) == {"nu", "cca", "rank"}
    assert all(v is None or math.isfinite(v) for v in payload["rho"].values())
    assert payload["strategies"]["l_star_down"][0] == [1, payload["l_star"], payload["l_star"]]
    assert payload["cache_hit"] is False
    out = capsys.readouterr().out
    assert "← ℓ*" in out and "layer" in out and "ρ(metric, probe)" in out


def test_cli_rerun_is_served_from_the_cache_with_the_same_numbers(tiny_bert_dir, tmp_path):
    _, first = run_layers(tiny_bert_dir, tmp_path)
    _, second = run_layers(tiny_bert_dir, tmp_path)
    assert second["cache_hit"] is True
    assert second["layers"] == first["layers"]
    _, first_token = run_layers(tiny_bert_dir, tmp_path, "--pooling", "first")
    assert first_token["cache_hit"] is False and first_token["pooling"] == "first"
    assert first_token["layers"] != first["layers"]


def test_cli_json_to_stdout_is_pure_json(tiny_bert_dir, capsys):
    code = main(["layers", "--model", str(tiny_bert_dir), "--n", "30", "--json", "-"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["n"] == 30


def test_cli_bad_input_is_one_clear_line(tiny_bert_dir, capsys):
    code = main(["layers", "--model", str(tiny_bert_dir), "--n", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


def test_cli_regression_bins_the_scores_and_says_so(tiny_bert_dir, tmp_path, capsys):
    words = ["the", "a", "good", "bad", "movie", "film", "not", "very"]
    rows = [
        {"text": " ".join(words[(i + k) % len(words)] for k in range(5)), "score": (i % 11) * 0.47}
        for i in range(80)
    ]
    path = tmp_path / "scores.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    code, payload = run_layers(
        tiny_bert_dir, tmp_path, "--data", str(path), "--label-col", "score", "--n", "60"
    )
    assert code == 0
    assert payload["task_type"] == "regression" and payload["metric"] == "spearman"
    assert "2 quantile bins" in payload["label_note"]
    assert all(row["probe"] is None or -1 <= row["probe"] <= 1 for row in payload["layers"])
    assert "quantile bins" in capsys.readouterr().out


def test_cli_repeats_add_intervals_and_one_repeat_changes_nothing(tiny_bert_dir, tmp_path, capsys):
    _, single = run_layers(tiny_bert_dir, tmp_path)
    _, one = run_layers(tiny_bert_dir, tmp_path, "--repeats", "1")
    assert {k: v for k, v in one.items() if k not in ("cache_hit", "seconds")} == {
        k: v for k, v in single.items() if k not in ("cache_hit", "seconds")
    }
    code, payload = run_layers(tiny_bert_dir, tmp_path, "--repeats", "3")
    assert code == 0 and payload["repeats"] == 3
    for row in payload["layers"]:
        assert {"nu_se", "cca_se", "rank_se", "probe_se", "probe_c"} <= set(row)
        assert row["nu_se"] is None or row["nu_se"] >= 0
    assert payload["layers"][1]["nu"] == single["layers"][1]["nu"]  # the full-sample value
    assert set(payload["rho"]) == {"nu", "cca", "rank"}  # no bare ρ once repeats ran
    for est in payload["rho"].values():
        assert est["interval"] is None and est["note"] == "intervals need R ≥ 50"  # R = 3
    assert isinstance(payload["zeta"], dict) and "se" in payload["zeta"]
    counts = payload["l_star"]["counts"]
    assert set(counts) <= {"1", "2"} and sum(counts.values()) == 3
    out = capsys.readouterr().out
    assert "R = 3" in out and " ± " in out and "in 3 repeats" not in out
    _, cached = run_layers(tiny_bert_dir, tmp_path, "--repeats", "3")
    assert cached["rho"] == payload["rho"]  # repeats are cached / deterministic
    assert main(["layers", "--model", str(tiny_bert_dir), "--n", "40", "--repeats", "0"]) == 2


def test_too_few_examples_per_class_is_one_error_and_no_json(tiny_bert_dir, tmp_path, capsys):
    """N = 5 gave ρ = nan, an empty CCA and a confident ℓ*: now one message, exit 2."""
    out = tmp_path / "layers.json"
    argv = ["layers", "--model", str(tiny_bert_dir), "--n", "5", "--json", str(out)]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(err) == 1 and err[0].startswith("error: The layer analyses need at least 5")
    assert "5-fold" in err[0] and "Raise N" in err[0]
    assert not out.exists()


def test_cli_prints_the_suggested_strategies_and_how_sure_it_is(tiny_bert_dir, tmp_path, capsys):
    _, single = run_layers(tiny_bert_dir, tmp_path)
    out = capsys.readouterr().out
    l_star = single["l_star"]
    assert f"Suggested strategies (ℓ_bottom, ℓ_top, ℓ_cls) for ℓ* = {l_star}:" in out
    for family, key in (("ℓ*-down", "l_star_down"), ("baselines", "baselines")):
        line = next(x for x in out.splitlines() if x.strip().startswith(family))
        assert all(f"({b}, {t}, {h})" in line for b, t, h in single["strategies"][key])
    assert f"sweep --l-star {l_star}" in out
    assert "ℓ* is from one sample, unrepeated" in out and "--repeats 50" in out
    _, repeated = run_layers(tiny_bert_dir, tmp_path, "--repeats", "3")
    out = capsys.readouterr().out
    assert f"How sure: {repeated['l_star']['sentence']}" in out and "(R = 3)" in out
    assert "unrepeated" not in out and "Suggested strategies" in out
