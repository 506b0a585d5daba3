"""``runs cancel``: several ids, or the rest of a sweep, in one go and one line (no training)."""

from __future__ import annotations

from analysis.runs.db import RunsDB
from tunescope.cli import main


def queue(db: RunsDB, seed: int, sweep: str | None = "sweep-1") -> str:
    return db.enqueue({"model": {"name": "m"}, "data": {"name": "d"}, "method": "full",
                       "seed": seed}, sweep_id=sweep)  # fmt: skip


def test_the_rest_of_a_sweep_and_several_ids(capsys):
    db = RunsDB()
    done, running, *queued = (queue(db, seed) for seed in range(5))
    others = [queue(db, seed, sweep=None) for seed in range(3)]
    db.claim_next(worker_pid=1)
    db.finish(done, {"score": 0.5})
    db.claim_next(worker_pid=1)  # pid 1 is alive: never reaped
    assert main(["runs", "cancel", "--sweep", "sweep-1"]) == 0
    assert capsys.readouterr().out == (
        "3 queued runs cancelled, 1 running asked to stop at their next step, "
        "1 finished left alone\n"
    )
    assert [db.get_run(i)["status"] for i in queued] == ["cancelled"] * 3
    assert db.cancel_requested(running) and db.get_run(done)["result"] == {"score": 0.5}

    assert main(["runs", "cancel", others[0], others[1][-6:]]) == 0
    assert capsys.readouterr().out.startswith("2 queued runs cancelled, 0 running")
    assert db.get_run(others[2])["status"] == "queued"


def test_cancel_needs_something_to_cancel(capsys):
    queue(RunsDB(), 0)
    assert main(["runs", "cancel"]) == 2
    assert "needs run ids or --sweep" in capsys.readouterr().err
    assert main(["runs", "cancel", "--sweep", "nope"]) == 2
    assert "No run belongs to sweep 'nope'" in capsys.readouterr().err
