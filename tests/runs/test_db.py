"""The runs database: schema, WAL, state machine, and "a result only for a completed run"."""

from __future__ import annotations

import json
import sqlite3

import pytest

from analysis.runs.db import RunsDB
from analysis.runs.records import parse_tags
from analysis.runs.schema import MIGRATIONS, SCHEMA_VERSION, RunNotFound, migrate
from analysis.workspace import Workspace


def config(method="layers", layers=(1, 2, 2), seed=0, model="tiny", data="toy"):
    return {
        "model": {"name": model, "trust_remote_code": False},
        "data": {"name": data},
        "method": method,
        "layers": list(layers[:2]) if layers else None,
        "classifier_layer": layers[2] if layers else None,
        "seed": seed,
        "steps": 5,
    }


@pytest.fixture
def db(tmp_path):
    return RunsDB(Workspace(tmp_path))


def test_default_path_is_under_the_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNESCOPE_CACHE", str(tmp_path / "c"))
    assert RunsDB().path == tmp_path / "c" / "runs.sqlite"


def test_schema_is_versioned_and_in_wal_mode(db):
    assert db.pragma("journal_mode") == "wal"
    assert db.pragma("user_version") == SCHEMA_VERSION
    with sqlite3.connect(db.path) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version")]
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert {"runs", "steps", "schema_version"} <= tables
    # Reopening is a no-op.
    RunsDB(db.workspace)
    assert db.pragma("user_version") == SCHEMA_VERSION


def test_migration_upgrades_an_old_file_and_keeps_its_rows(tmp_path):
    path = tmp_path / "runs.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, MIGRATIONS) == SCHEMA_VERSION
    conn.execute(
        "INSERT INTO runs (id, created, status, model, data, method, label, seed, config_json)"
        " VALUES ('r1', 0, 'queued', 'm', 'd', 'full', 'full', 0, '{}')"
    )
    upgrade = [*MIGRATIONS, ["ALTER TABLE runs ADD COLUMN extra TEXT"]]
    assert migrate(conn, upgrade) == SCHEMA_VERSION + 1
    assert conn.execute("SELECT id, extra FROM runs").fetchall() == [("r1", None)]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        RunsDB(Workspace(tmp_path))


def test_enqueue_claim_finish(db):
    first = db.enqueue(config(seed=0), sweep_id="s1", family="ℓ*-down")
    second = db.enqueue(config(seed=1))
    assert first != second and len(first.split("-")) == 3
    run = db.claim_next(worker_pid=123, device="cpu")
    assert run["id"] == first and run["status"] == "running" and run["worker_pid"] == 123
    assert json.loads(run["config_json"])["seed"] == 0
    assert db.claim_next(worker_pid=124)["id"] == second
    assert db.claim_next(worker_pid=125) is None
    db.log_step(first, 1, {"loss": 0.7, "lr": 1e-3})
    db.log_step(first, 2, {"loss": 0.5, "lr": 1e-3})
    db.log_step(first, 2, {"dev": 0.8}, kind="dev")
    assert db.finish(first, {"score": 0.75, "metric": "accuracy", "n_trainable": 10})
    run = db.get_run(first)
    assert run["status"] == "done" and run["result"]["score"] == 0.75
    assert run["label"] == "(1, 2, 2)" and run["family"] == "ℓ*-down"
    assert run["group_key"] == run["setting_key"] == db.get_run(second)["group_key"]  # seeds
    steps = db.steps(first)
    assert len(steps) == 5 and steps[steps.kind == "dev"].value.tolist() == [0.8]
    table = db.list_runs()
    assert table.loc[table.id == first, "score"].item() == 0.75
    assert table.loc[table.id == second, "score"].isna().item()
    assert db.list_runs(status="done")["id"].tolist() == [first]
    assert db.curves(first) == {"train_loss": [[1, 0.7], [2, 0.5]], "dev": [[2, 0.8]]}
    assert db.list_runs(limit=1)["id"].tolist() == [second]
    last = db.latest_steps([first])
    assert last.step.item() == 2 and last.loss.item() == 0.5


def test_filters(db):
    a = db.enqueue(config(method="lora", layers=None, model="m1"))
    b = db.enqueue(config(method="full", layers=None, model="m2", data="d2"))
    assert db.list_runs(model="m1")["id"].tolist() == [a]
    assert db.list_runs(data="d2", method=["full", "lora"])["id"].tolist() == [b]
    assert db.list_runs(method="bitfit").empty


def test_cancel_queued_is_immediate_and_running_is_a_flag(db):
    queued = db.enqueue(config())
    assert db.request_cancel(queued) == "cancelled"
    assert db.claim_next(1) is None  # a cancelled run is never claimed
    running = db.enqueue(config())
    db.claim_next(1)
    assert not db.cancel_requested(running)
    assert db.request_cancel(running) == "running"
    assert db.cancel_requested(running)
    assert db.mark_cancelled(running)
    run = db.get_run(running)
    assert run["status"] == "cancelled" and run["result"] is None
    # Once ended, a late finish cannot turn it into a result.
    assert not db.finish(running, {"score": 1.0})
    assert db.get_run(running)["result"] is None


def test_failed_or_cancelled_run_can_never_hold_a_result(db):
    run_id = db.enqueue(config())
    db.claim_next(1)
    assert db.fail(run_id, "boom")
    run = db.get_run(run_id)
    assert run["status"] == "failed" and run["error"] == "boom" and run["result"] is None
    with sqlite3.connect(db.path) as conn, pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE runs SET result_json = '{}' WHERE id = ?", (run_id,))


def test_reap_dead_fails_running_runs_of_dead_processes(db):
    alive = db.enqueue(config())
    dead = db.enqueue(config())
    db.claim_next(111)
    db.claim_next(222)
    assert db.reap_dead(alive=lambda pid: pid == 111) == [dead]
    assert db.get_run(dead)["status"] == "failed"
    assert "worker died" in db.get_run(dead)["error"]
    assert db.get_run(alive)["status"] == "running"


def test_foreground_run_starts_running(db):
    run_id = db.enqueue(config(), running_pid=999)
    assert db.get_run(run_id)["status"] == "running"
    assert db.claim_next(1) is None


def test_unknown_or_prefix_ids(db):
    run_id = db.enqueue(config())
    assert db.resolve_id(run_id[-6:]) == run_id
    with pytest.raises(RunNotFound, match="no run"):
        db.get_run("nope")


def test_exports(db, tmp_path):
    run_id = db.enqueue(config())
    db.claim_next(1)
    db.log_step(run_id, 1, {"loss": 0.3})
    db.finish(run_id, {"score": 0.5, "metric": "accuracy"})
    db.enqueue(config(seed=3))
    assert db.export_csv(tmp_path / "runs.csv") == 2
    text = (tmp_path / "runs.csv").read_text()
    assert "score" in text.splitlines()[0] and "0.5" in text
    assert db.export_json(tmp_path / "runs.json") == 2
    records = json.loads((tmp_path / "runs.json").read_text())
    done = next(r for r in records if r["id"] == run_id)
    assert done["result"]["score"] == 0.5 and done["steps"][0]["value"] == 0.3
    assert (done["config"]["layers"], done["config"]["classifier_layer"]) == ([1, 2], 2)


# ---- schema version 2: notes and tags; deleting a run's files ---------------------------------


def version_1_file(path) -> None:
    """A runs database as the version-1 code made it: its schema, and rows written with its SQL
    (a done run with steps and a result, a failed run, a queued run)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    assert migrate(conn, MIGRATIONS[:1]) == 1
    insert = (
        "INSERT INTO runs (id, created, started, finished, status, worker_pid, device, model, "
        "data, method, label, strategy, seed, sweep_id, config_json, result_json, error) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    old = {k: v for k, v in config().items() if k != "classifier_layer"}
    cfg = json.dumps({**old, "layers": [1, 2, 2]})  # the layer triple, as stored then
    rows = [
        ("r-done", 1.0, 2.0, 3.0, "done", 7, "cpu", "tiny", "toy", "layers", "(1, 2, 2)",
         "ℓ*-down", 0, "s1", cfg, json.dumps({"score": 0.75, "metric": "accuracy"}), None),
        ("r-failed", 4.0, 5.0, 6.0, "failed", 7, "cpu", "tiny", "toy", "layers", "(1, 2, 2)",
         None, 1, None, cfg, None, "boom"),
        ("r-queued", 7.0, None, None, "queued", None, None, "tiny", "toy", "full", "full",
         None, 2, None, cfg, None, None),
    ]  # fmt: skip
    for row in rows:
        conn.execute(insert, row)
    conn.executemany(
        "INSERT INTO steps (run_id, step, kind, key, value, t) VALUES (?, ?, ?, ?, ?, ?)",
        [("r-done", 1, "train", "loss", 0.7, 1.5), ("r-done", 2, "dev", "dev", 0.8, 1.6)],
    )
    conn.close()


def test_a_version_1_database_opens_upgraded_with_every_row_intact(tmp_path):
    path = tmp_path / "runs.sqlite"
    version_1_file(path)
    db = RunsDB(Workspace(tmp_path))  # the current code migrates it in place
    assert db.pragma("user_version") == SCHEMA_VERSION == 4
    assert db.pragma("integrity_check") == "ok"
    with sqlite3.connect(path) as conn:
        assert [v for (v,) in conn.execute("SELECT version FROM schema_version")] == [1, 2, 3, 4]
    table = db.list_runs()
    assert table["id"].tolist() == ["r-queued", "r-failed", "r-done"]
    assert table["note"].tolist() == ["", "", ""] and table["tags"].tolist() == ["", "", ""]
    done = db.get_run("r-done")
    assert done["result"]["score"] == 0.75 and done["family"] == "ℓ*-down"
    assert (done["config"]["layers"], done["config"]["classifier_layer"]) == ([1, 2], 2)
    assert done["note"] == "" and done["tags"] == []
    assert db.curves("r-done") == {"train_loss": [[1, 0.7]], "dev": [[2, 0.8]]}
    assert db.get_run("r-failed")["error"] == "boom"
    # Old rows take notes and tags; the queue goes on.
    db.set_note("r-done", "the first good one")
    db.set_tags("r-done", "baseline, keep")
    assert db.get_run("r-done")["tags"] == ["baseline", "keep"]
    assert db.claim_next(worker_pid=9)["id"] == "r-queued"
    # Reopening does not migrate twice.
    assert RunsDB(Workspace(tmp_path)).pragma("user_version") == SCHEMA_VERSION


def test_notes_and_tags_are_shown_filtered_and_exported(db, tmp_path):
    a = db.enqueue(config(seed=0))
    b = db.enqueue(config(seed=1))
    db.set_note(a, "  lr too high?  ")
    assert db.set_tags(a, " baseline ,  keep,baseline ,") == ("baseline", "keep")
    db.set_tags(b, ["keep", "lr sweep"])
    table = db.list_runs().set_index("id")
    assert table.loc[a, "note"] == "lr too high?" and table.loc[a, "tags"] == "baseline, keep"
    assert db.list_runs(tag="baseline")["id"].tolist() == [a]
    assert set(db.list_runs(tag=["keep"])["id"]) == {a, b}
    assert db.list_runs(tag="nothing").empty
    assert db.all_tags() == ["baseline", "keep", "lr sweep"]
    db.set_tags(a, "")
    assert db.get_run(a)["tags"] == [] and db.all_tags() == ["keep", "lr sweep"]
    db.export_json(tmp_path / "runs.json")
    records = {r["id"]: r for r in json.loads((tmp_path / "runs.json").read_text())}
    assert records[a]["note"] == "lr too high?" and records[b]["tags"] == ["keep", "lr sweep"]
    db.export_csv(tmp_path / "runs.csv")
    header = (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")
    assert "note" in header and "tags" in header


@pytest.mark.parametrize(
    "tags, message",
    [("x" * 41, "at most 40"), (",".join(f"t{i}" for i in range(21)), "At most 20")],
)
def test_bad_tags_are_refused(db, tags, message):
    run_id = db.enqueue(config())
    with pytest.raises(ValueError, match=message):
        db.set_tags(run_id, tags)
    with pytest.raises(ValueError, match="10,000"):
        db.set_note(run_id, "x" * 10_001)
    assert parse_tags(["a", " a ", ""]) == ("a",)


def finished(db, **cfg) -> str:
    run_id = db.enqueue(config(**cfg))
    db.claim_next(1)
    db.finish(run_id, {"score": 0.5})
    return run_id


def test_delete_files_and_delete_run(db):
    workspace, root = db.workspace, db.workspace.root
    run_id = finished(db)
    trajectory = workspace.run_folder(run_id) / "trajectory"
    trajectory.mkdir(parents=True)
    (trajectory / "index.json").write_text("{}")
    zero = workspace.disable_folder(run_id)
    zero.mkdir(parents=True)
    (zero / "zero-outliers.json").write_text("{}")
    db.log_step(run_id, 1, {"loss": 0.1})
    assert db.run_files(run_id) == [workspace.run_folder(run_id), zero]

    # A queued run still needs the zero-weights files: refused, nothing removed.
    user = db.enqueue(
        {**config(method="full", layers=None), "zero_weights": str(zero / "zero-outliers.json")}
    )
    with pytest.raises(ValueError, match=f"{user}.*still need"):
        db.delete_files(run_id)
    assert zero.is_dir()
    db.request_cancel(user)

    assert db.delete_files(run_id) == [workspace.run_folder(run_id), zero]
    assert not workspace.run_folder(run_id).exists() and not zero.exists()
    assert not list(root.glob("*/.tmp-*"))  # nothing half-deleted left behind
    assert db.get_run(run_id)["status"] == "done"  # the run itself stays
    assert db.delete_run(run_id) == []
    with pytest.raises(RunNotFound):
        db.get_run(run_id)
    assert db.steps(run_id).empty  # its steps went with it


def test_a_queued_or_running_run_is_not_deleted(db):
    queued = db.enqueue(config())
    with pytest.raises(ValueError, match="queued: cancel it"):
        db.delete_run(queued)
    db.request_cancel(queued)
    source = finished(db)
    db.enqueue(config(method="subspace", layers=None) | {"subspace_from": source})
    with pytest.raises(ValueError, match="still need"):
        db.delete_run(source)
    assert db.get_run(source)["status"] == "done"


def test_a_tag_is_added_to_several_runs_keeping_their_own(db):
    a, b = finished(db), finished(db, seed=1)
    db.set_tags(a, "baseline")
    assert db.add_tags([a, b], "keep, lr sweep") == ("keep", "lr sweep")
    assert db.tags(a) == ["baseline", "keep", "lr sweep"] and db.tags(b) == ["keep", "lr sweep"]
    assert db.add_tags([a], "keep") == ("keep",) and db.tags(a).count("keep") == 1
    db.set_tags(b, [f"t{k}" for k in range(20)])
    with pytest.raises(ValueError, match=f"At most 20 tags per run: run {b} would"):
        db.add_tags([a, b], "one more")
    assert "one more" not in db.tags(a)  # all or nothing


def test_several_runs_are_deleted_at_once_or_not_at_all(db):
    a, b, keep = finished(db), finished(db, seed=1), finished(db, seed=2)
    folder = db.workspace.run_folder(a) / "trajectory"
    folder.mkdir(parents=True)
    db.log_step(b, 1, {"loss": 0.3})
    db.set_tags(b, "old")
    queued = db.enqueue(config())
    with pytest.raises(ValueError, match=f"Run {queued} is queued"):
        db.delete_runs([a, b, queued])
    assert folder.is_dir() and len(db.list_runs()) == 4  # refused: nothing deleted

    assert db.delete_runs([a, b]) == [db.workspace.run_folder(a)]
    assert not folder.exists()
    assert set(db.list_runs()["id"]) == {keep, queued}
    assert db.steps(b).empty and db.all_tags() == []  # steps and tags went with the runs
