"""``python -m tunescope heads``: the JSON schema, the selection file and clear errors."""

from __future__ import annotations

import json

import numpy as np

from analysis.heads.selection_file import load_selection
from tunescope.cli import main


def run_heads(tiny_bert_dir, tmp_path, *extra: str) -> tuple[int, dict | None]:
    out = tmp_path / "heads.json"
    argv = ["heads", "--model", str(tiny_bert_dir), "--n", "6", "--json", str(out), *extra]
    code = main(argv)
    return code, json.loads(out.read_text()) if out.exists() else None


def test_cli_writes_the_documented_schema(tiny_bert_dir, tmp_path, capsys):
    selection_path = tmp_path / "sel.json"
    code, payload = run_heads(
        tiny_bert_dir, tmp_path, "--k", "2", "--selection-out", str(selection_path)
    )
    assert code == 0
    settings = payload["settings"]
    assert settings["k"] == 2 and settings["xi"] == 0.9 and settings["damping"] == 0.85
    assert settings["variant"] == "paper" and settings["sample"]["n"] == 6
    assert payload["model"]["n_heads"] == 4 and payload["model"]["n_layers"] == 2
    layers = payload["layers"]
    assert [row["layer"] for row in layers] == [1, 2]
    for row in layers:
        assert len(row["richness"]) == 4
        assert np.array(row["correlation"]).shape == (4, 4)
        assert abs(sum(row["pagerank"]) - 1) < 1e-9
        assert len(row["selected"]) == 2 and all(0 <= h < 4 for h in row["selected"])
    assert payload["n_trainable"] == 2 * 2 * 3 * (8 * 32 + 8)
    assert 0 < payload["share"] < 1

    selection = load_selection(selection_path)
    assert selection.as_dict() == {row["layer"]: row["selected"] for row in layers}
    assert selection.n_heads == 4 and selection.settings["k"] == 2
    assert "layer  1: heads" in capsys.readouterr().out


def test_cli_mid_top_and_ablation_selector(tiny_bert_dir, tmp_path):
    code, payload = run_heads(
        tiny_bert_dir, tmp_path, "--scope", "mid-top", "--selector", "richness-lowest", "--k", "1"
    )
    assert code == 0
    assert payload["layers"][0]["selected"] == []  # layer 1 is below the middle
    assert len(payload["layers"][1]["selected"]) == 1
    assert payload["settings"]["selector"] == "richness-lowest"


def test_cli_errors_are_one_clear_line(tiny_bert_dir, tmp_path, capsys):
    code, payload = run_heads(tiny_bert_dir, tmp_path, "--k", "5")
    assert code == 2 and payload is None
    err = capsys.readouterr().err
    assert "k = 5 heads per layer" in err and "Traceback" not in err
    code, _ = run_heads(tiny_bert_dir, tmp_path, "--xi", "1.5")
    assert code == 2
    assert "ξ" in capsys.readouterr().err


def test_heads_offers_no_precision_and_the_config_refuses_one(tiny_bert_dir, tmp_path, capsys):
    """Head statistics are computed in float32 only: ``--precision`` would be silently ignored
    (and not part of the cache key), so the parser does not offer it and the config refuses it."""
    import dataclasses

    import pytest

    from analysis.config import ExtractConfig, ModelSpec
    from analysis.heads.collect import HeadStatsConfig

    with pytest.raises(SystemExit) as exit_info:
        main(["heads", "--model", str(tiny_bert_dir), "--precision", "bfloat16"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --precision" in capsys.readouterr().err
    extract = dataclasses.replace(ExtractConfig(ModelSpec("minilm")), precision="float16")
    with pytest.raises(ValueError, match="float32 only"):
        HeadStatsConfig(extract)
