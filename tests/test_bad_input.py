"""The bad-input matrix (docs/explanation/bad-input.md, "The matrix"): each row gets one clear
line from the CLI (exit 2, no traceback), and nothing is written to the cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from tunescope.cli import main


def _texts(n: int) -> list[str]:
    return [f"the movie was good number {i}" for i in range(n)]


def write(tmp: Path, name: str, kind: str) -> Path:
    path = tmp / name
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "header-only":
        path.write_text("text,label\n")
    elif kind == "wrong-delimiter":
        path.write_text("text;label\n" + "".join(f"good {i};{i % 2}\n" for i in range(20)))
    elif kind == "no-label-column":
        pd.DataFrame({"text": _texts(20), "target": [0, 1] * 10}).to_csv(path, index=False)
    elif kind == "one-class":
        pd.DataFrame({"text": _texts(20), "label": [1] * 20}).to_csv(path, index=False)
    elif kind == "class-with-one-example":
        pd.DataFrame({"text": _texts(21), "label": [0] * 10 + [1] * 10 + [2]}).to_csv(
            path, index=False
        )
    elif kind == "nan-texts":
        pd.DataFrame({"text": [None, "", "  "] * 7, "label": [0, 1, 0] * 7}).to_csv(
            path, index=False
        )
    elif kind == "non-utf8":
        path.write_bytes(
            b"text,label\n" + b"".join(b"caf\xe9 %d,%d\n" % (i, i % 2) for i in range(20))
        )
    elif kind == "nested-parquet":
        pd.DataFrame({"text": [["a", "b"]] * 20, "label": [0, 1] * 10}).to_parquet(path)
    elif kind == "regression-non-numeric":
        pd.DataFrame({"text": _texts(30), "label": [0.5 * i for i in range(29)] + ["high"]}).to_csv(
            path, index=False
        )
    return path


FILE_ROWS = [
    ("empty.csv", "empty", "empty"),
    ("header.csv", "header-only", "no rows"),
    ("semicolon.csv", "wrong-delimiter", "column"),
    ("nolabel.csv", "no-label-column", "label"),
    ("oneclass.csv", "one-class", "class"),
    ("single.csv", "class-with-one-example", "single example"),
    ("nan.csv", "nan-texts", "usable rows"),
    ("latin1.csv", "non-utf8", "UTF-8"),
    ("nested.parquet", "nested-parquet", "nested"),
    ("reg.csv", "regression-non-numeric", "numeric"),
]


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("name, kind, words", FILE_ROWS, ids=[r[1] for r in FILE_ROWS])
def test_bad_files(tmp_path, capsys, tiny_bert_dir, name, kind, words):
    path = write(tmp_path, name, kind)
    cache = tmp_path / "cache"
    code, err = run_cli(
        capsys, "extract", "--model", str(tiny_bert_dir), "--data", str(path), "--n", "10",
        "--cache", str(cache),
    )  # fmt: skip
    assert code == 2, err
    assert err.startswith("error:") and words.lower() in err.lower(), err
    assert not any(cache.rglob("*.safetensors"))


def test_file_over_the_size_limit(tmp_path, capsys, tiny_bert_dir, monkeypatch):
    monkeypatch.setenv("TUNESCOPE_MAX_FILE_MB", "1")
    path = tmp_path / "big.csv"
    pd.DataFrame({"text": ["x" * 1000] * 1200, "label": [0, 1] * 600}).to_csv(path, index=False)
    code, err = run_cli(capsys, "extract", "--model", str(tiny_bert_dir), "--data", str(path))
    assert code == 2 and "MB" in err


def test_one_megabyte_single_text_is_truncated_not_refused(tmp_path, capsys, tiny_bert_dir):
    path = tmp_path / "long.csv"
    texts = ["good movie " * 100_000, *_texts(19)]
    pd.DataFrame({"text": texts, "label": [0, 1] * 10}).to_csv(path, index=False)
    out = tmp_path / "out.json"
    code, err = run_cli(
        capsys, "extract", "--model", str(tiny_bert_dir), "--data", str(path), "--n", "16",
        "--max-length", "32", "--cache", str(tmp_path / "c"), "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out.read_text())["shape"] == [3, 16, 32]


MODEL_ROWS = ["missing-path", "no-weights", "decoder-only", "corrupt-weights", "not-a-folder"]


@pytest.mark.parametrize("kind", MODEL_ROWS)
def test_bad_models(tmp_path, capsys, tiny_bert_dir, kind):
    import transformers as tf

    folder = tmp_path / kind
    if kind == "no-weights":
        folder.mkdir()
        (folder / "config.json").write_bytes((tiny_bert_dir / "config.json").read_bytes())
    elif kind == "decoder-only":
        tf.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=100).save_pretrained(folder)
    elif kind == "corrupt-weights":
        folder.mkdir()
        for f in tiny_bert_dir.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    elif kind == "not-a-folder":
        folder = tmp_path / "weights.bin"
        folder.write_bytes(b"0")
    code, err = run_cli(capsys, "extract", "--model", str(folder), "--n", "10")
    assert code == 2 and err.startswith("error:"), err
    assert folder.name in err or "encoder" in err, err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--n", "1"], "at least 2"),
        (["--n", "100000"], "more than the train part holds"),
        (["--scheme", "share", "--share", "1.5"], "between 0 and 1"),
        (["--max-length", "2"], "max length"),
    ],
)
def test_bad_settings(capsys, tiny_bert_dir, args, words):
    code, err = run_cli(capsys, "extract", "--model", str(tiny_bert_dir), *args)
    assert code == 2 and words.lower() in err.lower(), err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--k", "99"], "k"),
        (["--xi", "0"], "ξ"),
        (["--xi", "1.5"], "ξ"),
    ],
    ids=["k-larger-than-H", "xi-zero", "xi-above-one"],
)
def test_bad_head_settings(tmp_path, capsys, tiny_bert_dir, args, words):
    code, err = run_cli(
        capsys, "heads", "--model", str(tiny_bert_dir), "--n", "20", "--cache", str(tmp_path / "c"),
        *args,
    )  # fmt: skip
    assert code == 2 and err.startswith("error:") and words in err, err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--method", "layers", "--layers", "2,1,2"], "ℓ_bottom"),
        (["--method", "layers", "--layers", "1,2,1"], "ℓ_cls"),
        (["--method", "full", "--steps", "0"], "steps"),
        (["--method", "full", "--lr", "0"], "learning rate"),
        (["--method", "full", "--lr", "nan"], "learning rate"),
        (["--method", "full", "--lora-r", "4"], "--lora-r is an option of --method lora"),
        (["--method", "lora", "--heads", "h.json"], "--heads is an option of --method heads"),
        (["--method", "full", "--adapter-layers", "1"], "--adapter-layers is an option of"),
        (["--method", "adapter", "--lora-layers", "1"], "--lora-layers is an option of"),
        (
            ["--method", "lora", "--subspace-from", "r1"],
            "--subspace-from is an option of --method subspace or --method subspace-random",
        ),
    ],
    ids=[
        "bottom-above-top",
        "classifier-below-top",
        "zero-steps",
        "lr-zero",
        "lr-nan",
        "lora-r-for-full",
        "heads-for-lora",
        "adapter-layers-for-full",
        "lora-layers-for-adapter",
        "subspace-from-for-lora",
    ],
)
def test_bad_finetune_settings(tmp_path, capsys, tiny_bert_dir, args, words):
    code, err = run_cli(
        capsys, "finetune", "--model", str(tiny_bert_dir), "--cache", str(tmp_path / "c"), *args
    )
    assert code == 2 and err.startswith("error:") and words.lower() in err.lower(), err


def test_out_of_memory_is_recorded_as_a_failed_run_with_advice(
    tmp_path, capsys, tiny_bert_dir, monkeypatch
):
    """A run that hits out-of-memory (simulated) fails with a clear message and no result."""
    import torch

    import analysis.finetune.engine as finetune
    from analysis.runs.db import RunsDB
    from analysis.workspace import Workspace

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(finetune, "run_finetune", out_of_memory)
    cache = tmp_path / "c"
    code, err = run_cli(
        capsys, "finetune", "--model", str(tiny_bert_dir), "--method", "frozen", "--steps", "2",
        "--cache", str(cache),
    )  # fmt: skip
    assert code == 1 and "out of memory" in err and "batch size" in err, err
    runs = RunsDB(Workspace(cache)).list_runs()
    assert list(runs["status"]) == ["failed"]
    assert RunsDB(Workspace(cache)).get_run(runs["id"][0])["result"] is None


@pytest.mark.parametrize("failure", ["disk-full", "read-back"])
def test_cache_failures_are_one_clear_line(tmp_path, capsys, tiny_bert_dir, monkeypatch, failure):
    """Not enough disk space, or an entry that cannot be read back after writing: `error: …`,
    exit 2, no traceback (the cache raises CacheError, an OSError)."""
    import shutil

    from analysis.cache import DiskCache

    if failure == "disk-full":
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 5))
        words = "GB free"
    else:
        monkeypatch.setattr(DiskCache, "load", lambda self, kind, recipe: None)
        words = "could not be read back"
    code, err = run_cli(
        capsys, "extract", "--model", str(tiny_bert_dir), "--n", "10", "--cache", str(tmp_path)
    )
    last = [line for line in re.split(r"[\r\n]", err) if line.strip()][-1]  # after the bar
    assert code == 2 and last.startswith("error:") and words in last, err


def test_a_sweep_refuses_a_flag_of_a_method_it_does_not_run(tmp_path, capsys, tiny_bert_dir):
    argv = [
        "sweep", "--model", str(tiny_bert_dir), "--cache", str(tmp_path / "c"), "--dry-run",
        "--strategies", "baselines,bitfit", "--lora-r", "4",
    ]  # fmt: skip
    code, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith("error: --lora-r is an option of --method lora"), err
    assert "the strategies baselines, bitfit" in err


def test_method_flags_reach_their_method():
    """--lora-r given: the LoRA runs get it; not given: LoraOptions' own default."""
    from analysis.finetune.methods.lora import LoraOptions
    from tunescope.cli import build_parser
    from tunescope.commands.options import method_options

    parse = build_parser().parse_args
    assert method_options(parse(["finetune", "--lora-r", "4"]), "lora").r == 4
    assert method_options(parse(["finetune"]), "lora").r == LoraOptions().r
