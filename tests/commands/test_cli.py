import json
import subprocess
import sys

import pandas as pd
import pytest

from tunescope.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture
def csv_data(tmp_path):
    path = tmp_path / "reviews.csv"
    texts = ["good fun", "awful plot", "great music", "dull script", "loved it", "hated it"] * 6
    pd.DataFrame({"review": [f"{t} {i}" for i, t in enumerate(texts)], "y": [0, 1] * 18}).to_csv(
        path, index=False
    )
    return path


def test_info_lists_builtins_and_cache(tmp_path, capsys):
    assert (
        main(["info", "--cache", str(tmp_path / "c"), "--json", str(tmp_path / "info.json")]) == 0
    )
    out = capsys.readouterr().out
    assert "minilm" in out and "movie-snippets" in out and "trec6" in out
    assert "glue/sst2" in out and ".jsonl / .json / .parquet file" in out  # describe_builtin
    payload = json.loads((tmp_path / "info.json").read_text())
    assert "minilm" in payload["models"] and payload["cache"]["entries"] == []
    assert "glue/sst2" in payload["glue"] and "trec6" in payload["datasets"]


def test_extract_fills_the_cache_then_serves_it(tmp_path, tiny_bert_dir, csv_data, capsys):
    args = [
        "extract", "--model", str(tiny_bert_dir), "--data", str(csv_data), "--text-col", "review",
        "--label-col", "y", "--n", "12", "--seed", "1", "--pooling", "first",
        "--cache", str(tmp_path / "c"), "--json", str(tmp_path / "out.json"),
    ]  # fmt: skip
    assert main(args) == 0
    first = json.loads((tmp_path / "out.json").read_text())
    assert first["shape"] == [3, 12, 32] and first["cache_hit"] is False
    assert "computed" in capsys.readouterr().out
    assert main(args) == 0
    assert json.loads((tmp_path / "out.json").read_text())["cache_hit"] is True
    assert main(["info", "--cache", str(tmp_path / "c")]) == 0
    assert "states" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "/no/such/model"], "does not exist"),
        (["--data", "/no/such.csv"], "not found"),
        (["--pooling", "mean", "--n", "1"], "at least 2"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, capsys, extra, message):
    code = main(["extract", "--cache", str(tmp_path / "c"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and message in err
    assert "Traceback" not in err


def test_a_text_column_of_numbers_gets_one_warning(tmp_path, tiny_bert_dir, csv_data, capsys):
    frame = pd.read_csv(csv_data).assign(id=range(100, 136))
    frame.to_csv(csv_data, index=False)
    args = ["extract", "--model", str(tiny_bert_dir), "--data", str(csv_data), "--text-col", "id",
            "--label-col", "y", "--n", "12"]  # fmt: skip
    assert main(args) == 0  # a warning, not a refusal
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("warning: Column")]
    assert warned == [
        "warning: Column 'id', used as a text, holds only numbers (e.g. 100, 101, 102): are the "
        "text and label columns swapped? If so, choose the text column."
    ]


def test_module_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "tunescope", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and "extract" in done.stdout and "info" in done.stdout
