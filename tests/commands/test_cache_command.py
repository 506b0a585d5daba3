"""``tunescope cache``: what a cache folder holds, and ``cache prune`` freeing it without losing
a run or a file a run needs."""

from __future__ import annotations

import gc
import json
import os
import time

import pytest
import torch

from analysis.cache import DiskCache
from analysis.runs.db import RunsDB
from analysis.workspace import Workspace
from tunescope.cli import main

DAY = 86400.0


def aged(path, days: float) -> None:
    then = time.time() - days * DAY
    for folder, _, files in os.walk(path):
        for name in files:
            os.utime(os.path.join(folder, name), (then, then))
    os.utime(path, (then, then))


def config(method="full", data="toy", **extra):
    return {"model": {"name": "tiny"}, "data": {"name": data}, "method": method, "layers": None,
            "seed": 0, "steps": 5, **extra}  # fmt: skip


@pytest.fixture
def workspace(tmp_path):
    """A cache folder as a user's looks after a while: entries, runs with their files, uploads,
    a writer's leftovers (days old unless said otherwise)."""
    ws = Workspace(tmp_path / "cache")
    cache = DiskCache(ws.root)
    mb = torch.zeros(250_000)  # 1 MB of float32
    sample = {"model": {"name": "/models/minilm"}, "data": {"name": "movie-snippets"}}
    states = cache.save("states", {**sample, "sample": {"n": 1000, "seed": 0}}, {"x": mb})
    newer = cache.save("states", {**sample, "sample": {"n": 200, "seed": 0}}, {"x": mb})
    table = cache.save("layer_metrics", {"states": states.name, "seed": 0}, {"x": torch.ones(7)})
    cache.save("subspace-svd", {"trajectory": "traj-a", "layer": 1}, {"V": torch.ones(4, 2)})
    upload = ws.uploads / "0123456789abcdef" / "reviews.csv"
    upload.parent.mkdir(parents=True)
    upload.write_text("text,label\n")
    unused = ws.uploads / "fedcba9876543210" / "old.csv"
    unused.parent.mkdir(parents=True)
    unused.write_text("text,label\n")

    db = RunsDB(ws)
    source = db.enqueue(config(data=str(upload)), running_pid=os.getpid())
    db.finish(source, {"score": 0.8, "metric": "accuracy"})
    trajectory = ws.run_folder(source) / "trajectory"
    trajectory.mkdir(parents=True)
    (trajectory / "index.json").write_text(json.dumps({"id": "traj-a"}))
    user = db.enqueue(config("subspace", subspace_from=source), running_pid=os.getpid())
    db.finish(user, {"score": 0.7, "metric": "accuracy"})
    running = db.enqueue(config(), running_pid=os.getpid())
    ws.run_folder(running).mkdir(parents=True)
    (ws.run_folder(running) / "snap-00000.safetensors").write_bytes(b"x" * 1000)
    orphan = ws.run_folder("20250101-0000-gone00")  # its run was deleted, its files were not
    orphan.mkdir(parents=True)
    (orphan / "snap-00000.safetensors").write_bytes(b"x" * 5000)
    db.close()
    stale = ws.root / "states" / ".tmp-deadbeef0000-x"
    stale.mkdir()
    (stale / "data.safetensors").write_bytes(b"x" * 100)
    for path in (*ws.root.glob("*/*"), *ws.root.glob("runs/*")):
        aged(path, 40)
    aged(newer, 2)
    fresh = ws.root / "heads" / ".tmp-cafe00000000-y"  # a writer at work now
    fresh.mkdir(parents=True)
    ids = {"source": source, "user": user, "running": running, "orphan": orphan.name}
    return ws, ids, {"states": states, "newer": newer, "table": table, "fresh": fresh}


def listing(ws, capsys, *extra) -> dict:
    assert main(["cache", "--cache", str(ws.root), "--json", "-", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_says_what_each_item_is_and_who_uses_it(workspace, capsys):
    ws, ids, paths = workspace
    payload = listing(ws, capsys)
    assert payload["root"] == str(ws.root) and payload["free_bytes"] > 0
    assert payload["total_bytes"] >= 2_000_000 and payload["cap_bytes"] is None
    by = {(i["kind"], i["name"]): i for i in payload["items"]}
    states = by[("states", paths["states"].name[:12])]
    assert (states["model"], states["data"], states["n"]) == (
        "/models/minilm",
        "movie-snippets",
        1000,
    )
    assert states["bytes"] > 1_000_000 and states["last_used"] < time.time() - 39 * DAY
    table = by[("layer_metrics", paths["table"].name[:12])]  # model, data, N of its states
    assert (table["model"], table["n"]) == ("/models/minilm", 1000)
    svd = next(i for i in payload["items"] if i["kind"] == "subspace-svd")
    assert svd["runs"] == [ids["source"]] and svd["data"].endswith("reviews.csv")
    assert by[("trajectories", ids["source"])]["runs"] == [ids["source"], ids["user"]]
    assert by[("trajectories", ids["orphan"])]["runs"] == []
    assert by[("uploads", "reviews.csv")]["runs"] == [ids["source"]]
    assert by[("uploads", "old.csv")]["runs"] == []
    assert sorted(by[("database", "runs.sqlite")]["runs"]) == sorted(
        ids[k] for k in ids if k != "orphan"
    )
    assert {i["kind"] for i in payload["items"]} == {
        "states", "layer_metrics", "subspace-svd", "partial", "trajectories", "uploads", "database"
    }  # fmt: skip

    assert main(["cache", "--cache", str(ws.root), "--kind", "states,uploads"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"Cache folder {ws.root}: ") and " free there; size cap" in out[0]
    assert out[1].split() == ["kind", "name", "size", "last", "used", "model", "data", "N", "runs"]
    assert any(line.startswith("states") and "minilm  movie-snippets  1000" in line for line in out)
    assert any(line.startswith("uploads") and ids["source"] in line for line in out)
    assert out[-1] == "by kind: states 2.0 MB (2) · uploads 22 B (2)"


def test_prune_removes_what_can_be_recomputed_and_keeps_what_is_in_use(workspace, capsys):
    ws, _, paths = workspace
    inputs = json.loads((paths["newer"] / "meta.json").read_text())["inputs"]
    held, _ = DiskCache(ws.root).load("states", inputs)  # a page reading these states now
    before = sorted(ws.root.rglob("*"))
    assert main(["cache", "prune", "--dry-run", "--cache", str(ws.root), "--json", "-"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert sorted(ws.root.rglob("*")) == before  # a dry run removes nothing
    assert {i["kind"] for i in dry["removed"]} == {
        "states",
        "layer_metrics",
        "subspace-svd",
        "partial",
    }
    kept = {(k["kind"], k["reason"]) for k in dry["kept"]}
    assert ("states", "in use (being read or computed)") in kept
    assert ("partial", "a writer may still be writing it") in kept

    assert main(["cache", "prune", "--cache", str(ws.root)]) == 0
    out = capsys.readouterr().out
    assert "removed      states" in out and "kept         states" in out
    assert out.splitlines()[-1] == "removed 4 items, 1.0 MB; kept 2"
    left = {i["kind"] for i in listing(ws, capsys)["items"]}
    assert left == {"states", "partial", "trajectories", "uploads", "database"}
    assert paths["newer"].is_dir() and not paths["states"].exists() and paths["fresh"].is_dir()
    assert len(RunsDB(ws).list_runs()) == 3  # prune never deletes a run
    del held
    gc.collect()
    assert main(["cache", "prune", "--cache", str(ws.root), "--kind", "states"]) == 0
    assert not paths["newer"].exists()


def test_run_files_and_uploads_go_only_when_named_and_no_run_needs_them(workspace, capsys):
    ws, ids, _ = workspace
    assert main(["cache", "prune", "--cache", str(ws.root), "--kind",
                 "trajectories,uploads", "--json", "-"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert {(i["kind"], i["name"]) for i in result["removed"]} == {
        ("trajectories", ids["orphan"]), ("uploads", "old.csv")
    }  # fmt: skip
    reasons = {k["name"]: k["reason"] for k in result["kept"]}
    assert reasons[ids["source"]].startswith(f"run {ids['user']} needs it")
    assert reasons[ids["running"]] == "its run is running"
    assert reasons["reviews.csv"] == f"run {ids['source']} trained on it"
    assert ws.run_folder(ids["source"]).is_dir() and ws.run_folder(ids["running"]).is_dir()
    assert (ws.uploads / "0123456789abcdef" / "reviews.csv").is_file()
    assert not ws.run_folder(ids["orphan"]).exists()


def test_prune_by_age_and_by_size(workspace, capsys):
    ws, _, paths = workspace
    assert main(["cache", "prune", "--cache", str(ws.root), "--kind", "states",
                 "--older-than", "30d", "--dry-run", "--json", "-"]) == 0  # fmt: skip
    assert [i["path"] for i in json.loads(capsys.readouterr().out)["removed"]] == [
        str(paths["states"])
    ]  # the 2-day-old states stay
    assert main(["cache", "prune", "--cache", str(ws.root), "--max-size", "1.5MB"]) == 0
    capsys.readouterr()
    # the oldest states went first; the small tables, older still, stay once it fits
    assert not paths["states"].exists() and paths["newer"].is_dir() and paths["table"].is_dir()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kind", "everything"], "Unknown cache kind 'everything': choose from states"),
        (["prune", "--older-than", "3 parsecs"], "--older-than takes an age such as 30d"),
        (["prune", "--max-size", "big"], "--max-size takes a size such as 20GB"),
        (["list", "--max-size", "5GB"], "--max-size and --dry-run go with `cache prune`"),
    ],
)
def test_bad_input_is_one_clear_line(workspace, capsys, argv, message):
    ws, _, _ = workspace
    before = sorted(p for p in ws.root.rglob("*"))
    assert main(["cache", "--cache", str(ws.root), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
    assert sorted(p for p in ws.root.rglob("*")) == before  # nothing lost


def test_an_entry_of_a_kind_added_later_is_listed_and_pruned_like_the_others(tmp_path, capsys):
    ws = Workspace(tmp_path / "c")
    DiskCache(ws.root).save("recommend", {"model": {"name": "m"}}, {"x": torch.ones(3)})
    assert [(i["kind"], i["model"]) for i in listing(ws, capsys)["items"]] == [("recommend", "m")]
    assert main(["cache", "prune", "--cache", str(ws.root), "--kind", "recommend"]) == 0
    assert "removed 1 item," in capsys.readouterr().out and listing(ws, capsys)["items"] == []
