"""A Ray cluster of two nodes on loopback (`ray_head_node.start_two_nodes`) that loses its worker
node while runs train on both: the run on the lost node fails with its steps kept, the run on the
head node goes on, nothing is claimed while the cluster has no room, the database stays whole, and
the lost raylet's crash dump stays out of the worker's log."""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
from datetime import datetime
from pathlib import Path

import pytest
import ray_head_node
import waiting

from analysis.config import DataSpec, ModelSpec
from analysis.runs.db import RunsDB
from analysis.runs.queue import pid_alive
from analysis.runs.worker import RAY, ensure_ray_worker, worker_pid

HOST = socket.gethostname()
# Deadlines, not durations: each node loads MiniLM in a Ray worker started on a busy machine.
wait_for = functools.partial(waiting.wait_for, timeout=600.0)
DUMP_LINE = re.compile(r"PC: @|@ +0x[0-9a-f]+ |\[state-dump\]")  # lines of a raylet's crash dump


def minilm_config(steps: int, seed: int):
    """A run on the built-in MiniLM: loaded from the installed package on whichever node trains
    it (a local model folder would pin the run to this machine's node, the head node)."""
    from analysis.finetune.config import FinetuneConfig

    return FinetuneConfig(
        model=ModelSpec("minilm"),
        data=DataSpec("movie-snippets"),
        method="layers",
        layers=(1, 1, 2),
        steps=steps,
        batch_size=4,
        max_length=32,
        n_train=32,
        n_eval=16,
        eval_every=2,
        seed=seed,
        device="cpu",
    )


@pytest.fixture
def root() -> Path:
    return Path(os.environ["TUNESCOPE_CACHE"])


def started(run: dict) -> float:
    return datetime.fromisoformat(run["started"]).timestamp()


def finished(run: dict) -> float:
    return datetime.fromisoformat(run["finished"]).timestamp()


def test_losing_the_worker_node_fails_its_run_and_the_head_node_trains_on(
    root, tmp_path_factory, monkeypatch
):
    monkeypatch.setenv("TUNESCOPE_WORKER_IDLE_S", "120")
    two = ray_head_node.start_two_nodes(tmp_path_factory.mktemp("two", numbered=True), num_cpus=1)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the Ray worker presents the cluster's token
    monkeypatch.setenv("RAY_AUTH_TOKEN", two.token)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    pid = None
    try:
        db = RunsDB()
        pair = [db.enqueue(minilm_config(100_000, seed)) for seed in (0, 1)]  # one on each node
        after = db.enqueue(minilm_config(2, 2))
        pid = ensure_ray_worker(root, two.address)
        log = root / "worker.log"
        wait_for(
            lambda: all(len(db.steps(i, kind="train")) >= 2 for i in pair),
            what="steps of the runs on both nodes",
            log=log,
        )
        lost_node = two.worker_node_id[:8]
        (doomed,) = [i for i in pair if db.get_run(i)["device"].split()[0].endswith(lost_node)]
        (survivor,) = set(pair) - {doomed}
        assert db.get_run(after)["status"] == "queued"  # no room: one CPU on each node
        kept = len(db.steps(doomed))
        two.lose_worker_node()

        wait_for(lambda: db.get_run(doomed)["status"] == "failed", what="the lost run", log=log)
        run = db.get_run(doomed)
        assert run["error"].startswith(f"Ray worker died on {HOST}/127.0.0.1/{lost_node} ("), run
        assert run["result"] is None and len(db.steps(doomed)) >= kept
        going = len(db.steps(survivor, kind="train"))
        wait_for(
            lambda: len(db.steps(survivor, kind="train")) > going,
            what="the head node's run",
            log=log,
        )
        assert db.get_run(survivor)["status"] == "running"
        assert db.get_run(after)["status"] == "queued"  # the head node's one CPU is still taken

        assert db.request_cancel(survivor) == "running"
        wait_for(lambda: db.get_run(after)["status"] == "done", what="the queued run", log=log)
        head_node_run, last = db.get_run(survivor), db.get_run(after)
        assert head_node_run["status"] == "cancelled"
        assert last["device"] == head_node_run["device"]  # on the head node, the one node left
        assert started(last) >= finished(head_node_run)  # claimed once the head node had room
        assert db.pragma("integrity_check") == "ok"

        # Ray's note on the lost node is one line in the worker's log; the lost raylet's crash
        # dump (and what Ray prints of it again later) stays in Ray's logs.
        wait_for(lambda: "has been marked dead" in log.read_text(), what="Ray's note", log=log)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), what="the worker to exit", log=log)
        text = log.read_text()
        dump = [line for line in text.splitlines() if DUMP_LINE.search(line)]
        assert dump == [] and "SIGSEGV received" not in text, "\n".join(dump)
        assert text.rstrip().endswith("exit status 143"), text[-3000:]
    finally:
        pid = worker_pid(root, RAY) or pid
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)  # (its own thread in this process reaps it)
        two.stop()
