"""The worker process: queue, cancel, one worker per device, and surviving SIGKILL mid-run."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sqlite3
from pathlib import Path

import pytest
import waiting

from analysis.config import DataSpec, ModelSpec
from analysis.runs.db import RunsDB
from analysis.runs.worker import WorkerLock, ensure_worker, lock_path, serve, worker_pid
from analysis.workspace import Workspace

pytestmark = pytest.mark.usefixtures("stop_leftover_worker")


def tiny_config(model_dir: Path, steps: int, seed: int = 0):
    from analysis.finetune.config import FinetuneConfig

    return FinetuneConfig(
        model=ModelSpec(str(model_dir)),
        data=DataSpec("movie-snippets"),
        method="layers",
        layers=(1, 1, 2),
        steps=steps,
        batch_size=4,
        n_train=32,
        n_eval=16,
        eval_every=max(steps, 1),
        seed=seed,
        device="cpu",
    )


wait_for = functools.partial(waiting.wait_for, timeout=60.0)


def reap(pid: int) -> None:
    """Collect our own child's exit status (it is ours: ensure_worker started it)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@pytest.fixture
def root(tmp_path) -> Path:
    return Path(os.environ["TUNESCOPE_CACHE"])


def test_worker_runs_the_queue_and_records_a_cancelled_run(root, tiny_bert_dir):
    db = RunsDB(Workspace(root))
    short = db.enqueue(tiny_config(tiny_bert_dir, steps=3))
    long = db.enqueue(tiny_config(tiny_bert_dir, steps=100_000))
    pid = ensure_worker(root, device="cpu", idle_timeout=1.0)
    log = root / "worker.log"
    assert ensure_worker(root, device="cpu") == pid  # one worker per device
    wait_for(lambda: db.get_run(short)["status"] == "done", what="the short run", log=log)
    result = db.get_run(short)["result"]
    assert result["run_id"] == short and result["metric"] == "accuracy"
    assert result["n_trainable"] > 0 and result["layers_forward"] == 2
    assert db.steps(short, kind="train")["step"].max() == 3
    wait_for(lambda: len(db.steps(long)) > 0, what="steps of the long run", log=log)
    assert db.request_cancel(long) == "running"
    wait_for(lambda: db.get_run(long)["status"] == "cancelled", what="the cancel", log=log)
    assert db.get_run(long)["result"] is None
    wait_for(lambda: worker_pid(root, "cpu") is None, what="the idle worker to exit", log=log)
    reap(pid)


def test_database_survives_sigkill_mid_run(root, tiny_bert_dir):
    db = RunsDB(Workspace(root))
    run_id = db.enqueue(tiny_config(tiny_bert_dir, steps=100_000))
    pid = ensure_worker(root, device="cpu", idle_timeout=30.0)
    wait_for(
        lambda: len(db.steps(run_id, kind="train")) >= 12,
        what="recorded steps",
        log=root / "worker.log",
    )
    os.kill(pid, signal.SIGKILL)
    reap(pid)
    before = db.steps(run_id)
    assert db.get_run(run_id)["status"] == "running"  # nobody has noticed yet
    db.close()
    # A fresh connection on the file the killed process was writing.
    with sqlite3.connect(root / "runs.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    reopened = RunsDB(Workspace(root))
    after = reopened.steps(run_id)
    assert len(after) >= len(before) and after["step"].max() >= before["step"].max()
    # The next worker to start marks it failed; it never reads as a result.
    assert serve(root, device="cpu", idle_timeout=0.0, poll_s=0.01) == 0
    run = reopened.get_run(run_id)
    assert run["status"] == "failed" and "worker died" in run["error"]
    assert run["result"] is None


def test_second_worker_for_a_device_exits_and_stale_lock_is_taken_over(root):
    lock = WorkerLock(lock_path(root, "cpu"))
    assert lock.acquire()
    assert worker_pid(root, "cpu") == os.getpid()
    assert serve(root, device="cpu", idle_timeout=0.0) == -1
    lock.release()
    # A lock file left by a dead process (nobody holds the flock) does not block anyone.
    lock_path(root, "cpu").write_text("999999\n")
    assert worker_pid(root, "cpu") is None
    assert serve(root, device="cpu", idle_timeout=0.0) == 0


def test_a_run_that_crashes_is_recorded_as_failed_with_its_message(root, tiny_bert_dir):
    db = RunsDB(Workspace(root))
    cfg = tiny_config(tiny_bert_dir, steps=2).to_dict()
    cfg["layers"], cfg["classifier_layer"] = [1, 1], 5  # the tiny model has 2 layers: refused
    run_id = db.enqueue(cfg)
    assert serve(root, device="cpu", idle_timeout=0.0, poll_s=0.01) == 1
    run = db.get_run(run_id)
    assert run["status"] == "failed" and "2 layers" in run["error"] and run["result"] is None


def test_an_idle_worker_takes_its_lock_back_past_a_brief_check(root, tiny_bert_dir, monkeypatch):
    """At its idle exit the worker lets go of its lock, sees a run queued meanwhile and takes the
    lock back; a `worker_pid` check (the page polls it) holding the lock shared at that instant
    must not make it give up and strand the run."""
    import fcntl
    import threading

    db = RunsDB(Workspace(root))
    cfg = tiny_config(tiny_bert_dir, steps=2).to_dict()
    cfg["layers"], cfg["classifier_layer"] = [1, 1], 5  # refused by the engine at once
    real = RunsDB.list_runs
    queued: list[str] = []

    def list_runs(self, *args, **kwargs):
        if kwargs.get("status") == "queued" and not queued:  # the idle worker's last look
            queued.append(db.enqueue(cfg))
            fd = os.open(lock_path(root, "cpu"), os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # as worker_pid does, for 0.2 s
            threading.Timer(0.2, os.close, (fd,)).start()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RunsDB, "list_runs", list_runs)
    assert serve(root, device="cpu", idle_timeout=0.0, poll_s=0.01) == 1
    assert db.get_run(queued[0])["status"] == "failed"  # claimed and run, not stranded


def test_the_runner_closes_before_the_lock_is_let_go(root, monkeypatch):
    """The Ray runner removes its status file on close: that must happen while the worker still
    holds its lock, or it could remove the status of the next worker."""
    from analysis.runs import worker

    held_at_close = []

    class FakeRunner:
        device_label = "ray"

        def __init__(self, *args, **kwargs):
            pass

        def free_slots(self):
            return 1

        def busy(self):
            return False

        def pump(self, timeout):
            pass

        def close(self, reason=None):
            held_at_close.append(worker_pid(root, "ray"))

    monkeypatch.setattr(worker, "RayRunner", FakeRunner)
    assert serve(root, executor="ray", idle_timeout=0.0, poll_s=0.01) == 0
    assert held_at_close and all(pid == os.getpid() for pid in held_at_close), held_at_close


def _state(pid: int) -> str | None:
    """The process state letter of ``pid`` (Z: a zombie), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_a_finished_worker_is_reaped_not_left_defunct(root):
    pid = ensure_worker(root, device="cpu", idle_timeout=0.2)  # nothing queued: it exits soon
    log = root / "worker.log"
    wait_for(lambda: worker_pid(root, "cpu") is None, what="the idle worker to exit", log=log)
    # Nobody here waits for it: the launch path must collect its status itself.
    wait_for(lambda: _state(pid) is None, what="the finished worker to be reaped", log=log)


# --- packing runs onto the CPU's cores ----------------------------------------------------------


def test_cpu_packing_follows_the_model_size_and_the_setting(monkeypatch):
    from analysis.runs.worker import CPU_WORKERS_ENV, SMALL_MODEL_PARAMS, cpu_packing

    monkeypatch.delenv(CPU_WORKERS_ENV, raising=False)
    assert cpu_packing(22_700_000, cores=2) == (2, 1)  # MiniLM: one worker per core
    assert cpu_packing(SMALL_MODEL_PARAMS, cores=4) == (4, 1)
    assert cpu_packing(110_000_000, cores=2) == (1, 2)  # BERT-base: one worker, every core
    assert cpu_packing(None, cores=2) == (1, 2)  # unknown size: the safe choice
    assert cpu_packing(22_700_000, cores=2, workers=1) == (1, 2)  # the setting wins
    assert cpu_packing(110_000_000, cores=8, workers=3) == (3, 2)
    assert cpu_packing(22_700_000, cores=2, workers=9) == (2, 1)  # never more than the cores
    monkeypatch.setenv(CPU_WORKERS_ENV, "2")
    assert cpu_packing(110_000_000, cores=2) == (2, 1)


def test_estimated_size_of_a_tiny_model_is_its_parameter_count(tiny_bert_dir):
    from analysis.models import load_model
    from analysis.runs.worker import estimate_params

    estimate = estimate_params(ModelSpec(str(tiny_bert_dir)))
    actual = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu").n_params
    assert estimate is not None and abs(estimate - actual) / actual < 0.1
    assert estimate_params(ModelSpec(str(tiny_bert_dir / "missing"))) is None


def test_start_workers_packs_small_models_onto_the_cores(root, tiny_bert_dir, monkeypatch):
    """The queued model's size chooses the packing; ``cpu_workers`` overrides it."""
    from analysis.runs import worker
    from analysis.runs.executor import ExecutorChoice

    started = []
    monkeypatch.delenv(worker.CPU_WORKERS_ENV, raising=False)
    monkeypatch.setattr(worker, "all_devices", lambda: ["cpu"])
    monkeypatch.setattr(worker, "usable_cores", lambda: 2)
    monkeypatch.setattr(
        worker, "ensure_worker", lambda r, d, i=None, t=None: started.append((d, t)) or len(started)
    )
    RunsDB(Workspace(root)).enqueue(tiny_config(tiny_bert_dir, steps=1))
    assert worker.start_workers(ExecutorChoice(), root).startswith("2 CPU workers × 1 thread")
    assert started == [("cpu", 1), ("cpu-1", 1)]
    started.clear()
    worker.start_workers(ExecutorChoice(cpu_workers=1), root)
    assert started == [("cpu", None)]  # one worker, torch's default threads (every core)
    with pytest.raises(ValueError, match="CPU workers"):
        ExecutorChoice(cpu_workers=0)


def test_a_second_cpu_slot_trains_on_the_cpu_with_its_own_lock(root, tiny_bert_dir):
    """A worker for slot ``cpu-1`` trains on torch's CPU device beside the ``cpu`` one, with its
    own lock (and pid in `worker_pids`)."""
    from analysis.runs.worker import worker_pids

    db = RunsDB(Workspace(root))
    cfg = tiny_config(tiny_bert_dir, steps=2)
    run_id = db.enqueue(dataclasses_replace(cfg, device=None))
    pid = ensure_worker(root, device="cpu-1", idle_timeout=1.0, threads=1)
    log = root / "worker.log"
    assert lock_path(root, "cpu-1").name == "worker-cpu-1.lock"
    wait_for(lambda: "cpu-1" in worker_pids(root), what="the slot's worker pid", log=log)
    wait_for(lambda: db.get_run(run_id)["status"] == "done", what="the run", log=log)
    run = db.get_run(run_id)
    assert run["device"] == "cpu-1" and run["result"]["metric"] == "accuracy"
    wait_for(lambda: worker_pid(root, "cpu-1") is None, what="the idle worker to exit", log=log)
    reap(pid)


def dataclasses_replace(cfg, **changes):
    import dataclasses

    return dataclasses.replace(cfg, **changes)


def test_cpu_workers_flag_is_a_local_choice():
    import argparse

    from tunescope.commands.options import add_executor_options, executor_from_args

    parser = argparse.ArgumentParser()
    add_executor_options(parser)
    assert executor_from_args(parser.parse_args(["--cpu-workers", "2"])).cpu_workers == 2
    assert executor_from_args(parser.parse_args([])).cpu_workers is None
    with pytest.raises(ValueError, match="goes with --executor local"):
        executor_from_args(parser.parse_args(["--executor", "ray", "--cpu-workers", "2"]))
    with pytest.raises(ValueError, match="whole number ≥ 1"):
        executor_from_args(parser.parse_args(["--cpu-workers", "0"]))
