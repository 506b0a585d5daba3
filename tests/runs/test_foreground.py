"""Runs followed in the foreground: SIGTERM cancels a foreground Ray `finetune` (as Ctrl-C does), a
local foreground run names its device, and a run that ends early says where it ended."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import waiting

from analysis.runs.db import RunsDB
from analysis.runs.execute import RunRecorder
from tunescope.cli import main

ROOT = Path(__file__).resolve().parents[2]
# Deadlines, not durations: Ray's processes start slowly on a busy machine.
wait_for = functools.partial(waiting.wait_for, timeout=300.0)


def test_a_run_that_ends_early_says_where_it_ended(tiny_bert_dir):
    from analysis.config import DataSpec, ModelSpec
    from analysis.finetune.config import FinetuneConfig

    db = RunsDB()
    cfg = FinetuneConfig(model=ModelSpec(str(tiny_bert_dir)), data=DataSpec("movie-snippets"))
    failing, stopped = db.enqueue(cfg, running_pid=os.getpid()), db.enqueue(cfg)
    recorder = RunRecorder(db, failing, progress_every_s=0.0)
    for step in range(1, 19):
        recorder.step(step, {"loss": 1.0 / step})
        if step == 13:
            recorder.progress(0.1, "Step 13/120")  # the last note before it failed
    assert recorder.failed("CUDA error") == "failed"
    run = db.get_run(failing)
    assert (run["message"], run["error"]) == ("failed at step 18", "CUDA error")
    assert run["progress"] == pytest.approx(0.1)
    RunRecorder(db, stopped).cancelled()
    assert db.get_run(stopped)["message"] == "cancelled before step 1"


def test_a_local_foreground_run_names_its_device(tiny_bert_dir, tmp_path):
    argv = [
        "finetune", "--model", str(tiny_bert_dir), "--method", "layers", "--layers", "1,1,2",
        "--steps", "2", "--batch-size", "4", "--n-train", "16", "--n-eval", "8",
        "--json", str(tmp_path / "run.json"),
    ]  # fmt: skip
    assert main(argv) == 0
    run_id = json.loads((tmp_path / "run.json").read_text())["run_id"]
    assert RunsDB().get_run(run_id)["device"] == "cpu"  # (no GPU on the test machines)


@pytest.mark.usefixtures("stop_leftover_ray_worker")
def test_sigterm_cancels_a_foreground_ray_finetune(ray_cluster, tiny_bert_dir):
    """``finetune --executor ray`` in the foreground, then SIGTERM: the run is cancelled on the
    cluster (not left queued or running) and the command exits 130, as with Ctrl-C."""
    argv = [
        sys.executable, "-m", "tunescope", "finetune", "--model", str(tiny_bert_dir),
        "--method", "layers", "--layers", "1,1,2", "--steps", "100000", "--batch-size", "4",
        "--n-train", "16", "--n-eval", "8", "--device", "cpu",
        "--executor", "ray", "--ray-address", ray_cluster,
    ]  # fmt: skip
    db = RunsDB()
    command = subprocess.Popen(
        argv, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        run_id = wait_for(lambda: next(iter(db.list_runs()["id"]), None), what="the queued run")
        wait_for(lambda: len(db.steps(run_id, kind="train")) >= 2, what="steps on Ray")
        command.send_signal(signal.SIGTERM)
        _, err = command.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            command.kill()
    assert command.returncode == 130, err[-2000:]
    assert "cancelled by the user" in err
    run = db.get_run(run_id)
    assert run["status"] == "cancelled" and run["error"] == "cancelled by the user", run
