"""The workspace: one folder layout, built once by the entry points, the environment read there."""

from __future__ import annotations

import os

from analysis.cache import default_root
from analysis.cli import main
from analysis.runs.db import RunsDB
from analysis.workspace import ENV, Workspace


def test_the_layout_is_spelled_out_once(tmp_path):
    ws = Workspace(tmp_path / "w")
    assert ws.runs_db == tmp_path / "w" / "runs.sqlite"
    assert ws.run_folder("r1") == tmp_path / "w" / "runs" / "r1"
    assert ws.disable_folder("r1") == ws.root / "subspace" / "r1"
    assert ws.outlier_file("r1").parent == ws.random_file("r1", 2).parent == ws.disable_folder("r1")
    assert ws.uploads == ws.root / "uploads" and ws.lock("cuda:1").name == "worker-cuda1.lock"
    db = RunsDB(ws)  # the database knows its workspace: its files are found through it
    assert db.workspace == ws and db.path == ws.runs_db
    assert db.run_files("r1") == [] and (tmp_path / "w" / "runs.sqlite").is_file()


def test_from_env_and_the_current_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert Workspace.from_env().root == tmp_path / "env" == default_root()
    assert Workspace.from_env(tmp_path / "flag").root == tmp_path / "flag"
    with Workspace(tmp_path / "mine").active():
        assert default_root() == tmp_path / "mine" and RunsDB().workspace.root == tmp_path / "mine"
    assert default_root() == tmp_path / "env"  # only while active


def test_cli_cache_is_the_commands_workspace_and_the_environment_stays(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert main(["runs", "--cache", str(tmp_path / "flag"), "list"]) == 0
    assert (tmp_path / "flag" / "runs.sqlite").is_file()
    assert not (tmp_path / "env" / "runs.sqlite").exists()
    assert os.environ[ENV] == str(tmp_path / "env")  # --cache no longer rewrites it
