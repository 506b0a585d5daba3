"""The Ray executor on a local 2-CPU Ray cluster: a sweep through the CLI, the same numbers as the
local executor, cancel, a killed Ray worker, an unreachable address, and the pure pieces."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import torch
import waiting

from analysis.config import DataSpec, ModelSpec
from analysis.runs import ray_executor
from analysis.runs.db import RunsDB
from analysis.runs.executor import ExecutorChoice
from analysis.runs.ray_executor import (
    LOCAL_CLUSTER,
    ClusterInfo,
    RayRunner,
    RayUnavailable,
    check_address,
    probe_cluster,
    resolve_address,
)
from analysis.runs.ray_task import train_stream
from analysis.runs.record import Run
from analysis.runs.worker import RAY, last_choice, serve, start_workers, worker_pid
from analysis.workspace import Workspace
from tunescope.cli import main

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
# The device column: ray:HOST/ADDRESS/NODE-ID-PREFIX DEVICE (the local cluster is on loopback).
ON_THIS_NODE = re.compile(rf"ray:{re.escape(HOST)}/127\.0\.0\.1/[0-9a-f]{{8}} cpu")

pytestmark = pytest.mark.usefixtures("stop_leftover_ray_worker")


def tiny_config(model_dir: Path, steps: int, seed: int = 0, data: str = "movie-snippets", **kw):
    from analysis.finetune.config import FinetuneConfig

    return FinetuneConfig(
        model=ModelSpec(str(model_dir)),
        data=DataSpec(data, **kw),
        method="layers",
        layers=(1, 1, 2),
        steps=steps,
        batch_size=4,
        n_train=32,
        n_eval=16,
        eval_every=2,
        seed=seed,
        device="cpu",
    )


# Deadlines, not durations: Ray's processes start slowly on a busy machine.
wait_for = functools.partial(waiting.wait_for, timeout=300.0)


@pytest.fixture
def root() -> Path:
    return Path(os.environ["TUNESCOPE_CACHE"])


@contextlib.contextmanager
def serving_in_a_thread(root: Path, **kwargs):
    """`serve` with the Ray executor in a thread of this process (connected to the session's
    cluster); yields a list that holds its return value (or exception) once it ended."""
    outcome: list = []

    def target():
        try:
            outcome.append(serve(root, executor=RAY, poll_s=0.05, **kwargs))
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(timeout=300)
        assert not thread.is_alive(), "the Ray worker loop did not end"
        if outcome and isinstance(outcome[0], BaseException):
            raise outcome[0]


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_losses(db: RunsDB, run_id: str) -> list[float]:
    steps = db.steps(run_id, kind="train")
    return steps[steps["key"] == "loss"]["value"].tolist()


# -- end to end --------------------------------------------------------------------------------


def test_sweep_and_finetune_through_the_cli_train_on_ray(
    ray_cluster, root, tiny_bert_dir, tmp_path, monkeypatch
):
    """``sweep --executor ray --ray-address …``: queued, trained by a Ray worker process that
    connects to the cluster, results in the database; the local data file's bytes travel to the
    tasks. Then ``finetune --executor ray`` follows its run on the same worker to the end."""
    monkeypatch.setenv("TUNESCOPE_WORKER_IDLE_S", "60")  # one Ray worker for both commands
    data = tmp_path / "reviews.csv"
    texts = ["good fun", "awful plot", "great music", "dull script", "loved it", "hated it"] * 8
    pd.DataFrame({"review": [f"{t} {i}" for i, t in enumerate(texts)], "y": [0, 1] * 24}).to_csv(
        data, index=False
    )
    common = [
        "--model", str(tiny_bert_dir), "--data", str(data), "--text-col", "review",
        "--label-col", "y", "--steps", "3", "--eval-every", "2", "--batch-size", "4",
        "--n-train", "24", "--n-eval", "8", "--device", "cpu",
        "--executor", "ray", "--ray-address", ray_cluster,
    ]  # fmt: skip
    sweep = ["sweep", "--strategies", "down", "--l-star", "1", "--seeds", "0"]
    assert main([*sweep, *common, "--json", str(tmp_path / "sweep.json")]) == 0
    payload = json.loads((tmp_path / "sweep.json").read_text())
    ids = [r["run_id"] for r in payload["runs"]]
    assert len(ids) == 2  # (1, 1, 1) and (1, 1, 2)
    db = RunsDB()
    log = root / "worker.log"
    pid = worker_pid(root, RAY)
    assert pid is not None and last_choice(root).executor == RAY
    wait_for(
        lambda: all(db.get_run(i)["status"] == "done" for i in ids),
        what="the sweep on Ray",
        log=log,
    )
    for run_id in ids:
        run = db.get_run(run_id)
        assert ON_THIS_NODE.fullmatch(run["device"]), run["device"]
        assert run["result"]["run_id"] == run_id and run["result"]["metric"] == "accuracy"
        assert run["result"]["config"]["data"]["name"] == str(data)  # as queued
        assert db.steps(run_id, kind="train")["step"].max() == 3
        assert sorted(db.steps(run_id, kind="dev")["step"].unique()) == [2, 3]
    assert f"Ray cluster: {ray_cluster}: 1 node, 2 CPUs" in log.read_text()

    out = tmp_path / "run.json"
    finetune = ["finetune", "--method", "layers", "--layers", "1,1,2", "--seed", "5"]
    assert main([*finetune, *common, "--json", str(out)]) == 0, log.read_text()[-3000:]
    result = json.loads(out.read_text())
    assert worker_pid(root, RAY) == pid  # the same Ray worker trained it
    assert ON_THIS_NODE.fullmatch(db.get_run(result["run_id"])["device"])
    assert [step for step, _ in result["curves"]["train_loss"]] == [1, 2, 3]

    os.kill(pid, signal.SIGTERM)  # stopped while idle: it disconnects and exits cleanly
    wait_for(lambda: worker_pid(root, RAY) is None, what="the Ray worker to exit", log=log)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    assert "exiting after 3 runs" in log.read_text()


def test_a_run_on_ray_gives_the_same_numbers_as_the_local_executor(
    ray_cluster, root, tiny_bert_dir
):
    from analysis.runs.execute import execute_run

    db = RunsDB(Workspace(root))
    cfg = tiny_config(tiny_bert_dir, steps=4, seed=3)
    local = db.enqueue(cfg, running_pid=os.getpid(), device="cpu")
    with one_thread():  # as the Ray task does with 1 CPU per run
        assert execute_run(db, local, cfg) == "done"
    remote = db.enqueue(cfg)
    with serving_in_a_thread(root, idle_timeout=0.0) as outcome:
        pass
    assert outcome == [1]
    a, b = db.get_run(local), db.get_run(remote)
    assert b["status"] == "done" and ON_THIS_NODE.fullmatch(b["device"])
    for key in ("score", "dev_score", "n_trainable", "n_params", "best_step", "n_train"):
        assert a["result"][key] == b["result"][key], key
    assert train_losses(db, local) == train_losses(db, remote)
    assert db.curves(local)["dev"] == db.curves(remote)["dev"]


def test_cancel_stops_the_remote_run_and_records_it_cancelled(ray_cluster, root, tiny_bert_dir):
    db = RunsDB(Workspace(root))
    run_id = db.enqueue(tiny_config(tiny_bert_dir, steps=100_000))
    with serving_in_a_thread(root, idle_timeout=0.0):
        wait_for(lambda: len(db.steps(run_id, kind="train")) >= 3, what="steps streamed back")
        assert db.get_run(run_id)["status"] == "running"
        assert main(["runs", "cancel", run_id]) == 0
        wait_for(lambda: db.get_run(run_id)["status"] == "cancelled", what="the cancel")
    run = db.get_run(run_id)
    assert run["result"] is None and run["error"] == "cancelled by the user"
    assert len(db.steps(run_id, kind="train")) >= 3  # the streamed steps stay


def test_a_run_stays_queued_while_the_cluster_has_no_room(ray_cluster, root, tiny_bert_dir):
    """Another job holds both CPUs of the cluster: the run is not claimed (claimed, it would show
    ``running`` with the claim as its start while it waits in Ray's queue). Once the CPUs are
    free it is claimed and trains, its start after that moment."""
    import ray

    db = RunsDB(Workspace(root))
    other_job = ray.remote(num_cpus=2, max_retries=0)(lambda: time.sleep(600)).remote()
    freed = None
    try:
        wait_for(lambda: ray.available_resources().get("CPU", 0) == 0, what="the CPUs taken")
    except BaseException:
        ray.cancel(other_job, force=True)
        raise
    run_id = db.enqueue(tiny_config(tiny_bert_dir, steps=2))
    with serving_in_a_thread(root, idle_timeout=3.0):
        try:
            wait_for(lambda: ray_executor.status_path(root).exists(), what="the cluster read")
            deadline = time.monotonic() + 3.0  # many turns of the queue loop (0.05 s each)
            while time.monotonic() < deadline:
                assert db.get_run(run_id)["status"] == "queued"
                time.sleep(0.1)
        finally:
            freed = time.time()
            ray.cancel(other_job, force=True)
        wait_for(lambda: db.get_run(run_id)["status"] == "done", what="the run, once free")
    started = datetime.fromisoformat(db.get_run(run_id)["started"]).timestamp()
    assert started >= freed


def test_a_killed_ray_worker_fails_its_run_and_the_sweep_goes_on(ray_cluster, root, tiny_bert_dir):
    """Kill the process running the task: that run is failed "Ray worker died on HOST" with its
    steps kept; the runs after it still train. (2 CPUs per run: one run at a time.)"""
    db = RunsDB(Workspace(root))
    doomed = db.enqueue(tiny_config(tiny_bert_dir, steps=100_000))
    after = [db.enqueue(tiny_config(tiny_bert_dir, steps=2, seed=s)) for s in (1, 2)]
    with serving_in_a_thread(root, idle_timeout=0.0, cpus_per_run=2):
        wait_for(lambda: len(db.steps(doomed, kind="train")) >= 3, what="steps of the doomed run")
        training = wait_for(
            lambda: [p for p in _task_processes() if p != os.getpid()], what="the task's process"
        )
        assert len(training) == 1
        kept = len(db.steps(doomed))
        os.kill(training[0], signal.SIGKILL)
        wait_for(lambda: db.get_run(doomed)["status"] == "failed", what="the failure")
        wait_for(lambda: all(db.get_run(i)["status"] == "done" for i in after), what="the rest")
    run = db.get_run(doomed)
    assert (
        run["error"].startswith(f"Ray worker died on {HOST}/127.0.0.1/") and run["result"] is None
    )
    assert len(db.steps(doomed)) >= kept


def _task_processes() -> list[int]:
    """Pids of the Ray worker processes running our task (Ray titles them ``ray::<function>``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cmdline").read_bytes().startswith(b"ray::train_stream"):
                    pids.append(int(entry.name))
    return pids


def test_unreachable_address_is_one_clear_message_and_nothing_is_lost(root, tiny_bert_dir, capsys):
    closed = _closed_port()
    argv = [
        "finetune", "--model", str(tiny_bert_dir), "--method", "layers", "--layers", "1,1,2",
        "--steps", "2", "--device", "cpu", "--executor", "ray", "--ray-address", closed,
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: Cannot reach the Ray cluster at {closed}")
    db = RunsDB()
    assert db.list_runs().empty  # checked before anything was queued
    # A Ray worker that cannot connect exits (status 2) and leaves the queue as it was.
    queued = db.enqueue(tiny_config(tiny_bert_dir, steps=2))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "analysis.runs.worker", "--executor", "ray"]
    done = subprocess.run(
        [*command, "--ray-address", closed], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "Cannot reach the Ray cluster" in done.stdout
    assert db.get_run(queued)["status"] == "queued"


def test_a_ray_worker_on_another_cluster_refuses_before_anything_is_queued(
    root, tiny_bert_dir, capsys
):
    """A live Ray worker of this queue trains on cluster X; launching on a reachable cluster Y
    is refused before any run is queued or the choice remembered (the CLI's `launch`, and
    `check_executor` with the default root as `claims.queue_runs` and the page call it)."""
    from analysis.runs.ray_executor import write_status
    from analysis.runs.worker import WorkerLock, check_executor, lock_path

    lock = WorkerLock(lock_path(root, RAY))  # the live worker (this process holds its lock)
    assert lock.acquire()
    try:
        write_status(root, {"address": "10.9.9.9:6379", "state": "running"})
        with socket.socket() as listener:  # cluster Y: something answers at its address
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            other = f"127.0.0.1:{listener.getsockname()[1]}"
            argv = [
                "finetune", "--model", str(tiny_bert_dir), "--method", "layers", "--layers",
                "1,1,2", "--steps", "2", "--device", "cpu", "--executor", "ray",
                "--ray-address", other,
            ]  # fmt: skip
            assert main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "already trains this queue" in err[0], err
            assert "10.9.9.9:6379" in err[0]
            assert RunsDB().list_runs().empty
            assert not (root / "executor.json").exists() and last_choice(root) == ExecutorChoice()
            with pytest.raises(ValueError, match="already trains this queue"):
                check_executor(ExecutorChoice(RAY, other))
    finally:
        lock.release()


def _closed_port() -> str:
    with socket.socket() as sock:  # a port nobody listens on (bound, then released)
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_probe_asks_the_cluster_from_another_process(ray_cluster):
    info = probe_cluster(ray_cluster, cpus_per_run=2)
    assert (info.address, info.nodes, info.cpus, info.gpus) == (ray_cluster, 1, 2.0, 0.0)
    assert info.slots == 1 and "trains 1 run at once (2 CPUs each)" in info.describe()


def test_a_run_needing_this_machine_fails_clearly_when_its_node_has_no_cpus(
    ray_cluster, root, tiny_bert_dir
):
    """A local model folder pins a run to this machine's node; a head node started with
    ``--num-cpus 0`` could never run it, so it fails at once instead of waiting forever."""
    db = RunsDB(Workspace(root))
    run_id = db.enqueue(tiny_config(tiny_bert_dir, steps=2))
    runner = RayRunner(db, log=lambda message: None)
    runner.cluster.this_node = {"CPU": 0.0, "GPU": 0.0}
    runner.submit(Run.from_row(db.claim_next(os.getpid(), runner.device_label)))
    run = db.get_run(run_id)
    assert run["status"] == "failed" and "offers 0 CPUs" in run["error"]
    assert not runner.busy()


def test_a_refresh_blocked_on_the_gcs_holds_up_neither_the_queue_loop_nor_close(
    ray_cluster, root, monkeypatch
):
    """Once the head node is gone, Ray's calls to its GCS block for a minute. The cluster is re-read
    in a thread of its own, so the queue loop's calls return meanwhile (on the last reading), close
    returns at once, and the late refresh writes no status file after close removed it."""
    db = RunsDB(Workspace(root))
    runner = RayRunner(db, log=lambda message: None, refresh_s=0.05, status_root=root)
    assert ray_executor.status_path(root).exists()
    blocked, release = threading.Event(), threading.Event()

    def stuck(address, cpus_per_run):
        blocked.set()
        release.wait(30)
        return ClusterInfo(address, 1, 99.0, 0.0, cpus_per_run)

    monkeypatch.setattr(ray_executor, "current_cluster", stuck)
    assert blocked.wait(5)
    started = time.monotonic()
    for _ in range(20):
        assert runner.free_slots() == 2  # the session cluster's 2 CPUs, 1 per run
        runner.pump(0.01)
    runner.close()
    assert time.monotonic() - started < 3
    assert not ray_executor.status_path(root).exists()
    release.set()
    runner.cluster._refresher.join(5)
    assert not runner.cluster._refresher.is_alive()
    assert not ray_executor.status_path(root).exists()


def test_rays_own_processes_print_one_line_per_note(ray_cluster, capsys):
    """As this driver (connected by `connect`) gets them: a raylet's crash dump from its log file
    stays in that file, a dead node's note of many lines from Ray's error channel prints as one
    line, and a task's own traceback prints whole."""
    from ray._private.worker import print_to_stdstream

    token = os.urandom(4).hex()  # (Ray drops a line it printed a moment ago)
    dump = [
        f"*** SIGSEGV received at time={token} on cpu 1 ***",
        "PC: @     0x7f744a526f36  (unknown)  epoll_wait",
        "    @     0x5632eddebcf4       5488  main",
    ]
    note = f"Raylet {token} is terminated.\nLast 20 lines of the Raylet logs:\n    [state-dump] a"
    traceback = ["Traceback (most recent call last):", f'  File "x{token}.py"', "ValueError: y"]
    print_to_stdstream({"pid": "raylet", "ip": "127.0.0.1", "lines": dump, "is_err": True}, False)
    print_to_stdstream({"pid": "raylet", "lines": [note], "is_err": False}, False)
    task = {"pid": 4242, "ip": "127.0.0.1", "task_name": "train_stream", "is_err": True}
    print_to_stdstream({**task, "lines": traceback}, False)
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"(raylet) Raylet {token} is terminated. (+2 lines in Ray's logs)"
    ]
    err = captured.err.splitlines()
    assert [line.split(") ", 1)[1] for line in err] == traceback, err


# -- the pure pieces ---------------------------------------------------------------------------


def test_a_data_file_trains_from_its_shipped_bytes_alone(tmp_path, tiny_bert_dir, ray_cluster):
    """The task never opens the data file: it builds the task from the bytes Ray hands it."""
    data = tmp_path / "gone.csv"
    frame = pd.DataFrame({"text": [f"text {i}" for i in range(40)], "label": [0, 1] * 20})
    raw = frame.to_csv(index=False).encode()
    cfg = tiny_config(tiny_bert_dir, steps=2, data=str(data))  # the path does not exist here
    with one_thread():
        stream = train_stream(cfg.to_dict(), data_file=str(data), data_bytes=raw)
        events = list(stream)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done", events[-1]
    assert kinds.count("step") == 2 and kinds.count("eval") == 1
    assert events[-1]["result"]["config"]["data"]["name"] == str(data)


def test_cluster_slots_resources_and_addresses(monkeypatch):
    assert ClusterInfo("a:1", 3, 48, 4).slots == 4  # one GPU per run
    assert ClusterInfo("a:1", 2, 16, 0, cpus_per_run=4).slots == 4
    assert "trains 4 runs at once (one GPU each)" in ClusterInfo("a:1", 3, 48, 4).describe()
    with pytest.raises(RayUnavailable, match="fewer than the 4 CPUs"):
        ClusterInfo("a:1", 1, 2, 0, cpus_per_run=4).check()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None) == LOCAL_CLUSTER
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert resolve_address(None) == "10.0.0.5:6379" and resolve_address("h:1") == "h:1"
    with pytest.raises(RayUnavailable, match="Ray Client"):
        check_address("ray://h:10001")
    with pytest.raises(RayUnavailable, match="not HOST:PORT"):
        check_address("h:port")
    monkeypatch.setattr(ray_executor.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RayUnavailable, match="Ray is not installed"):
        check_address("h:1")


def test_executor_choice_is_validated_and_remembered(root, capsys):
    with pytest.raises(ValueError, match="Ray assigns one GPU per run"):
        ExecutorChoice("ray", device="cuda:1")
    with pytest.raises(ValueError, match="at least 1"):
        ExecutorChoice("ray", cpus_per_run=0)
    with pytest.raises(ValueError, match="Unknown executor"):
        ExecutorChoice("slurm")
    assert last_choice(root) == ExecutorChoice()
    assert main(["finetune", "--ray-address", "h:1", "--steps", "1"]) == 2
    assert "--ray-address and --ray-cpus-per-run go with --executor ray" in capsys.readouterr().err
    # start_workers records the choice, so a queue left without a worker gets the same kind.
    root.mkdir(parents=True, exist_ok=True)
    from analysis.runs import worker

    started = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker, "ensure_ray_worker", lambda *a, **k: started.append(a) or 4242)
        line = start_workers(ExecutorChoice("ray", "h:1", cpus_per_run=2), root)
    assert line == "Ray worker pid 4242, on h:1" and started == [(root, "h:1", 2, None)]
    assert last_choice(root) == ExecutorChoice("ray", "h:1", cpus_per_run=2)


def test_a_comparisons_rounds_fan_out_onto_the_cluster_and_go_on_as_runs_end(
    ray_cluster, root, tiny_bert_dir, monkeypatch
):
    """A planned experiment launched with the Ray executor: its first round trains on the
    cluster, and the worker that records a run's end queues the next round, which the same Ray
    worker trains — nothing else drives it. (The rule is pinned here — one more seed for every
    arm once two are in, up to three — since two steps on a toy decide nothing.)"""
    import dataclasses

    from analysis.runs import planner
    from analysis.runs.launch import launch_experiment
    from analysis.runs.planner import SEQUENTIAL, Experiment, PlannedArm, seed_list
    from analysis.runs.sequential import SequentialDesign

    base = tiny_config(tiny_bert_dir, steps=2)
    arms = (PlannedArm("full", dataclasses.replace(base, method="full", layers=None),
                       reference=True),
            PlannedArm("layer 1", base))  # fmt: skip
    design = SequentialDesign(delta=0.01, r0=2, r_max=3)
    experiment = Experiment(arms, seeds=seed_list((0, 1), 3), policy=SEQUENTIAL, design=design)

    def pinned(exp, stands):
        done = min(len(planner.scores(by_seed)) for by_seed in stands.values())
        return {arm.name: 2 if done < 2 else 3 for arm in exp.arms}

    monkeypatch.setattr(planner, "wanted", pinned)
    db = RunsDB(Workspace(root))
    executor = ExecutorChoice(executor=RAY, ray_address=ray_cluster)
    # the Ray worker runs in a thread here (below), where the planner's pinned rule holds
    monkeypatch.setattr("analysis.runs.worker.start_workers", lambda executor, root: "a thread")
    launched = launch_experiment(db, experiment, db.list_runs(), executor, "exp-ray")
    assert len(launched.ids) == 4  # two seeds of each arm
    with serving_in_a_thread(root, idle_timeout=1.0) as outcome:
        pass
    assert outcome == [6]  # the Ray worker trained the first round and the one it queued
    runs = db.list_runs()
    assert len(runs) == 6 and set(runs["status"]) == {"done"}
    seeds = runs.groupby("method")["seed"].apply(sorted).to_dict()
    assert seeds["full"] == [0, 1, 2]  # the reference: the seeds as given
    assert len(set(seeds["layers"])) == 3 and not set(seeds["layers"]) & {0, 1, 2}  # its own
    assert all(ON_THIS_NODE.fullmatch(d) for d in runs["device"])
    assert set(runs["sweep_id"]) == {"exp-ray"}
