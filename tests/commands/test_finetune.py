"""The finetune / sweep / runs subcommands end to end on a tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from analysis.runs.db import RunsDB
from tunescope.cli import main

ROOT = Path(__file__).resolve().parents[2]


def tiny_args(model_dir: Path, *extra: str) -> list[str]:
    return [
        "--model", str(model_dir), "--data", "movie-snippets",
        "--batch-size", "4", "--n-train", "32", "--n-eval", "16", "--device", "cpu", *extra,
    ]  # fmt: skip


def test_finetune_writes_the_json_schema_and_records_the_run(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "result.json"
    argv = ["finetune", *tiny_args(tiny_bert_dir, "--method", "layers", "--layers", "1,1,2")]
    assert (
        main([*argv, "--steps", "3", "--eval-every", "2", "--seed", "1", "--json", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    for key in ("score", "metric", "n_trainable", "n_params", "wall_s", "peak_mem_mb", "config"):
        assert key in result, key
    assert result["metric"] == "accuracy" and 0.0 <= result["score"] <= 1.0
    assert 0 < result["n_trainable"] < result["n_params"]
    assert (result["config"]["layers"], result["config"]["classifier_layer"]) == ([1, 1], 2)
    assert result["config"]["seed"] == 1
    assert [step for step, _ in result["curves"]["train_loss"]] == [1, 2, 3]
    assert [step for step, _ in result["curves"]["dev"]] == [2, 3]
    run = RunsDB().get_run(result["run_id"])
    assert run["status"] == "done" and run["result"]["score"] == result["score"]
    assert "accuracy" in capsys.readouterr().out

    # runs list / show / export / cancel
    assert main(["runs", "list"]) == 0
    assert result["run_id"] in capsys.readouterr().out
    assert main(["runs", "show", result["run_id"][-6:], "--json", str(tmp_path / "r.json")]) == 0
    shown = json.loads((tmp_path / "r.json").read_text())
    assert shown["steps"] and shown["result"]["run_id"] == result["run_id"]
    assert main(["runs", "export", "--csv", str(tmp_path / "a.csv"), "--method", "layers"]) == 0
    assert result["run_id"] in (tmp_path / "a.csv").read_text()
    assert main(["runs", "export", "--json", str(tmp_path / "a.json")]) == 0
    exported = json.loads((tmp_path / "a.json").read_text())[0]
    assert exported["id"] == result["run_id"]
    assert exported["group"] == run["group_key"] and exported["label"] == "(1, 1, 2)"
    assert main(["runs", "cancel", result["run_id"]]) == 0  # done stays done
    assert RunsDB().get_run(result["run_id"])["status"] == "done"
    assert main(["runs", "show", "no-such-run"]) == 2


def test_bad_input_is_one_clear_line(tiny_bert_dir, capsys):
    argv = ["finetune", *tiny_args(tiny_bert_dir, "--method", "layers", "--layers", "1,x")]
    assert main(argv) == 2
    assert "--layers" in capsys.readouterr().err


def test_sweep_plans_from_computed_l_star_and_runs_in_the_foreground(tiny_bert_dir, tmp_path):
    plan = tmp_path / "plan.json"
    argv = ["sweep", *tiny_args(tiny_bert_dir), "--strategies", "down,up,baselines,bitfit"]
    assert main([*argv, "--n", "40", "--seeds", "0,1", "--dry-run", "--json", str(plan)]) == 0
    payload = json.loads(plan.read_text())
    assert payload["n_layers"] == 2 and payload["l_star"] in (1, 2)
    labels = [r["label"] for r in payload["runs"]]
    assert len(labels) == 2 * len(set(labels)) and "bitfit" in labels
    assert RunsDB().list_runs().empty  # a dry run queues nothing

    out = tmp_path / "sweep.json"
    argv = ["sweep", *tiny_args(tiny_bert_dir), "--strategies", "down", "--l-star", "1"]
    assert main([*argv, "--seeds", "0", "--steps", "2", "--foreground", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["status"] for r in runs] == ["done", "done"]  # (1, 1, 1) and (1, 1, 2)
    table = RunsDB().list_runs(sweep_id=json.loads(out.read_text())["sweep_id"])
    assert sorted(table["label"]) == ["(1, 1, 1)", "(1, 1, 2)"]
    assert set(table["family"]) == {"ℓ*-down"}


def test_ctrl_c_records_the_run_as_cancelled(tiny_bert_dir):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "tunescope", "finetune", *tiny_args(tiny_bert_dir)]
    command += ["--method", "frozen", "--steps", "100000", "--eval-every", "100000"]
    child = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    db = RunsDB()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = db.list_runs()
            if not runs.empty and len(db.steps(runs["id"].iloc[0])) > 0:
                break
            time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err[-2000:]
    run = db.get_run(db.list_runs()["id"].iloc[0])
    assert run["status"] == "cancelled" and run["result"] is None


def test_sweep_learning_rate_grid_is_chosen_on_dev(tiny_bert_dir, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    argv = ["sweep", *tiny_args(tiny_bert_dir), "--strategies", "frozen,bitfit", "--seeds", "0"]
    assert main([*argv, "--lr-grid", "--head-lr", "2e-3", "--dry-run", "--json", str(plan)]) == 0
    runs = json.loads(plan.read_text())["runs"]
    # BitFit at ×½, ×1, ×2 of its 1e-3; frozen has no body, so one rate.
    assert sorted((r["label"], r["lr"]) for r in runs) == [
        ("bitfit", 5e-4), ("bitfit", 1e-3), ("bitfit", 2e-3), ("frozen", 1e-3),
    ]  # fmt: skip
    assert "chosen on the dev part" in capsys.readouterr().out
    assert main([*argv, "--lr-grid", "0,1", "--dry-run"]) == 2

    out = tmp_path / "sweep.json"
    argv = ["sweep", *tiny_args(tiny_bert_dir), "--strategies", "bitfit", "--seeds", "0"]
    assert (
        main([*argv, "--lr-grid", "1,10", "--steps", "2", "--foreground", "--json", str(out)]) == 0
    )
    payload = json.loads(out.read_text())
    choices = payload["lr_choices"]
    assert sorted(c["lr"] for c in choices) == [1e-3, 1e-2]
    chosen = [c for c in choices if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["dev_score"] == max(c["dev_score"] for c in choices)
    configs = [RunsDB().get_run(r["run_id"])["config"] for r in payload["runs"]]
    assert {c["classifier_lr"] for c in configs} == {1e-3}  # the classifier's rate stays fixed


def test_queued_runs_name_local_files_by_absolute_path(
    tiny_bert_dir, tmp_path, monkeypatch, capsys
):
    """The worker trains in the project's folder, not the user's: a relative data file, model
    folder or zero-weights file is queued as an absolute path; built-in data, hub ids and paths
    already absolute (a symlink included: cache keys stay) are queued as given."""
    import analysis.runs.worker

    monkeypatch.setattr(analysis.runs.worker, "start_workers", lambda *a, **k: "no worker")
    here = tmp_path / "here"
    here.mkdir()
    texts = [f"review {i}" for i in range(20)]
    (here / "my.csv").write_text(
        "text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(texts))
    )
    (here / "zero.json").write_text("{}")
    (here / "model").symlink_to(tiny_bert_dir)
    monkeypatch.chdir(here)

    def queued(*extra: str) -> dict:
        argv = ["finetune", "--method", "full", "--steps", "2", "--queue", *extra]
        assert main(argv) == 0, capsys.readouterr().err
        runs = RunsDB().list_runs()
        return RunsDB().get_run(runs["id"].iloc[0])["config"]

    config = queued("--model", "model", "--data", "my.csv", "--zero-weights", "zero.json")
    assert config["model"]["name"] == str(here / "model")
    assert config["data"]["name"] == str(here / "my.csv")
    assert config["zero_weights"] == str(here / "zero.json")
    listing = tmp_path / "list.json"
    assert main(["runs", "list", "--data", "my.csv", "--json", str(listing)]) == 0
    assert len(json.loads(listing.read_text())["runs"]) == 1  # the filter finds it as typed
    config = queued("--model", str(here / "model"), "--data", "movie-snippets")
    assert config["model"]["name"] == str(here / "model")  # absolute: kept, not resolved
    assert config["data"]["name"] == "movie-snippets" and config["zero_weights"] is None
    config = queued("--model", "org/no-such-model", "--data", "glue/sst2")
    assert config["model"]["name"] == "org/no-such-model" and config["data"]["name"] == "glue/sst2"
