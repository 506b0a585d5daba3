"""``runs note / tag / delete`` and ``--tag``; ``--trajectory-every auto`` (no training here)."""

from __future__ import annotations

import argparse

import pytest

from analysis.runs.db import RunsDB
from tunescope.cli import main
from tunescope.commands.options import add_model_data, add_training_options, finetune_config


def finished_run(db: RunsDB, seed: int = 0) -> str:
    run_id = db.enqueue({"model": {"name": "m"}, "data": {"name": "d"}, "method": "full",
                         "seed": seed})  # fmt: skip
    db.claim_next(worker_pid=1)
    db.finish(run_id, {"score": 0.5})
    return run_id


def test_note_tag_filter_and_delete(capsys):
    db = RunsDB()
    keep, drop = finished_run(db, 0), finished_run(db, 1)
    assert main(["runs", "note", keep[-6:], "warm-up too short"]) == 0
    assert main(["runs", "tag", keep, "baseline, keep"]) == 0
    assert "baseline, keep" in capsys.readouterr().out
    assert db.get_run(keep)["note"] == "warm-up too short"
    assert main(["runs", "list", "--tag", "keep"]) == 0
    listed = capsys.readouterr().out
    assert keep in listed and drop not in listed

    folder = db.workspace.run_folder(drop) / "trajectory"
    folder.mkdir(parents=True)
    (folder / "index.json").write_text("{}")
    assert main(["runs", "delete", drop, "--files-only"]) == 0
    assert not folder.exists() and db.get_run(drop)["status"] == "done"
    assert main(["runs", "delete", drop]) == 0
    assert set(db.list_runs()["id"]) == {keep}
    assert main(["runs", "tag", keep, "x" * 41]) == 2  # one clear line, exit 2
    assert "at most 40" in capsys.readouterr().err


@pytest.mark.parametrize("value, every", [("auto", 3), ("5", 5)])
def test_trajectory_every_auto_takes_the_librarys_rule(value, every):
    parser = argparse.ArgumentParser()
    add_model_data(parser)
    add_training_options(parser)
    args = parser.parse_args(["--steps", "70", "--trajectory-every", value])
    assert finetune_config(args, method="full", layers=None, seed=0).trajectory_every == every
    with pytest.raises(SystemExit):
        parser.parse_args(["--trajectory-every", "often"])
