"""The workspace: one folder layout, built once by the entry points, the environment read there."""

from __future__ import annotations

import os
from pathlib import Path

from analysis import workspace
from analysis.cache import default_root
from analysis.runs.db import RunsDB
from analysis.workspace import DATA_ENV, ENV, Workspace, data_folder
from tunescope.cli import main


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


def test_the_defaults_sit_in_the_checkout_or_installed_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(DATA_ENV, raising=False)
    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    assert Workspace.from_env().root == checkout / "cache"  # wherever tunescope is started
    assert data_folder() == checkout / "data"
    installed = tmp_path / "site-packages"  # the packages without the checkout's pyproject.toml
    (installed / "analysis").mkdir(parents=True)
    monkeypatch.setattr(workspace, "PACKAGES", installed)
    assert Workspace.from_env().root == tmp_path / "cache"
    assert data_folder() == tmp_path / "data"
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "mine"))
    assert data_folder() == tmp_path / "mine"


def test_cli_cache_is_the_commands_workspace_and_the_environment_stays(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    (tmp_path / "flag").mkdir()
    assert main(["runs", "--cache", str(tmp_path / "flag"), "list"]) == 0
    assert (tmp_path / "flag" / "runs.sqlite").is_file()
    assert not (tmp_path / "env" / "runs.sqlite").exists()
    assert os.environ[ENV] == str(tmp_path / "env")  # --cache no longer rewrites it


def test_a_missing_cache_folder_is_made_only_by_a_command_that_writes(
    tmp_path, monkeypatch, capsys
):
    typo = tmp_path / "cahce"
    for argv in (["runs", "list"], ["runs", "groups"], ["info"]):
        assert main([*argv[:1], "--cache", str(typo), *argv[1:]]) == 0
        err = capsys.readouterr().err
        assert err.count("warning:") == 1 and str(typo) in err and "--cache" in err
    assert main(["runs", "--cache", str(typo), "show", "abc"]) == 2
    assert str(typo) in capsys.readouterr().err
    monkeypatch.setenv(ENV, str(typo))  # a stale or mistyped setting: named as such
    assert main(["runs", "list"]) == 0
    assert f"{typo} ({ENV}) does not exist" in capsys.readouterr().err
    assert not typo.exists()  # no empty database made for a typo
    # Asked for: a command that writes creates it, without a warning.
    assert main(["runs", "--cache", str(typo), "note", "nope", "x"]) == 2
    assert "warning" not in capsys.readouterr().err and (typo / "runs.sqlite").is_file()
    assert main(["runs", "list"]) == 0 and "warning" not in capsys.readouterr().err
