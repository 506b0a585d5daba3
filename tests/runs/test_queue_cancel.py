"""Cancelling many runs at once (`RunQueue.cancel_runs`): one transaction, finished runs left as
they are, and a worker claiming at the same moment never starts a run it cancelled."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from analysis.runs.db import RunsDB
from analysis.runs.queue import Cancelled
from analysis.runs.schema import RunNotFound
from analysis.workspace import Workspace


def config(seed: int = 0) -> dict:
    return {"model": {"name": "tiny"}, "data": {"name": "toy"}, "method": "full", "seed": seed}


@pytest.fixture
def db(tmp_path):
    return RunsDB(Workspace(tmp_path))


def statuses(db: RunsDB) -> dict[str, tuple[str, int]]:
    runs = db.list_runs()
    return {
        i: (s, int(c))
        for i, s, c in zip(runs["id"], runs["status"], runs["cancel_requested"], strict=True)
    }


def test_the_rest_of_a_sweep_is_cancelled_in_one_transaction(db):
    done = db.enqueue(config(0), sweep_id="s1")
    failed = db.enqueue(config(1), sweep_id="s1")
    running = db.enqueue(config(2), sweep_id="s1")
    queued = [db.enqueue(config(3 + k), sweep_id="s1") for k in range(3)]
    other = db.enqueue(config(9), sweep_id="s2")
    for run_id in (done, failed, running):
        assert db.claim_next(1)["id"] == run_id
    db.log_step(done, 1, {"loss": 0.5})
    db.finish(done, {"score": 0.8})
    db.fail(failed, "boom")

    begins: list[str] = []
    db._conn.set_trace_callback(lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)
    outcome = db.cancel_runs(sweep_id="s1")
    db._conn.set_trace_callback(None)
    assert begins == ["BEGIN IMMEDIATE"]  # the whole sweep in one transaction

    assert outcome == Cancelled(tuple(queued), (running,), (done, failed))
    assert outcome.describe() == (
        "3 queued runs cancelled, 1 running asked to stop at their next step, 2 finished left alone"
    )
    after = statuses(db)
    assert [after[i] for i in queued] == [("cancelled", 0)] * 3
    assert db.get_run(queued[0])["error"] == "cancelled before start"
    assert after[running] == ("running", 1) and db.cancel_requested(running)
    assert after[other] == ("queued", 0)  # another sweep's run
    assert db.get_run(done)["result"] == {"score": 0.8} and len(db.steps(done)) == 1
    assert db.get_run(failed)["error"] == "boom"
    assert db.claim_next(1)["id"] == other  # nothing of s1 is claimable any more


def test_several_ids_or_parts_of_ids_and_an_unknown_sweep(db):
    a, b, c = (db.enqueue(config(seed)) for seed in range(3))
    outcome = db.cancel_runs([a[-6:], b])  # a unique part of an id works, as elsewhere
    assert outcome.cancelled == (a, b) and not outcome.stopping and not outcome.finished
    assert statuses(db)[c] == ("queued", 0)
    assert db.cancel_runs([a]) == Cancelled(finished=(a,))  # cancelling twice changes nothing
    with pytest.raises(RunNotFound, match="No run belongs to sweep 'nope'"):
        db.cancel_runs(sweep_id="nope")
    with pytest.raises(RunNotFound):
        db.cancel_runs(["no-such-run"])
    assert db.request_cancel(c) == "cancelled"  # the one-run form answers the status


def test_a_claim_that_holds_the_file_first_is_asked_to_stop_not_lost(db):
    run_ids = [db.enqueue(config(seed), sweep_id="s") for seed in range(3)]
    worker = sqlite3.connect(db.path, isolation_level=None)
    worker.execute("BEGIN IMMEDIATE")  # a worker's claim, half way through
    worker.execute("UPDATE runs SET status = 'running', worker_pid = 7 WHERE id = ?", (run_ids[0],))
    outcome: list[Cancelled] = []
    cancel = threading.Thread(target=lambda: outcome.append(db.cancel_runs(sweep_id="s")))
    cancel.start()
    time.sleep(0.3)
    assert cancel.is_alive()  # waits for the claim's transaction: no interleaving
    worker.execute("COMMIT")
    cancel.join(10)
    assert outcome == [Cancelled(tuple(run_ids[1:]), (run_ids[0],))]
    assert statuses(db)[run_ids[0]] == ("running", 1)
    worker.close()


@pytest.mark.parametrize("attempt", range(4))
def test_a_worker_claiming_concurrently_never_starts_a_cancelled_run(tmp_path, attempt):
    workspace = Workspace(tmp_path)
    page, worker = RunsDB(workspace), RunsDB(workspace)  # two connections, as two processes
    run_ids = [page.enqueue(config(seed), sweep_id="s") for seed in range(100)]
    claimed: list[str] = []

    def claim_all() -> None:
        while (run := worker.claim_next(worker_pid=7)) is not None:
            claimed.append(run["id"])
            time.sleep(0.0005)  # a worker's own work between claims

    thread = threading.Thread(target=claim_all)
    thread.start()
    while len(claimed) < 3 * (attempt + 1):  # cancel while the worker is claiming
        time.sleep(0.0002)
    outcome = page.cancel_runs(sweep_id="s")
    thread.join(30)
    after = statuses(page)
    # Every run was claimed before the cancel (then asked to stop) or cancelled (never claimed).
    assert set(outcome.stopping) == set(claimed)
    assert set(outcome.cancelled) == set(run_ids) - set(claimed)
    assert all(after[i] == ("running", 1) for i in claimed)
    assert all(after[i] == ("cancelled", 0) for i in outcome.cancelled)
