"""``runs list / groups / compare`` on fabricated finished runs (no training)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from analysis.finetune.config import flat_config
from analysis.predictions import decode_predictions, encode_predictions
from analysis.runs.db import RunsDB
from tunescope.cli import main

LABELS = np.array([0, 1] * 100)


def finished(db: RunsDB, accuracy: float, seed: int, origin=None, **config) -> str:
    cfg = flat_config(seed=seed, **config)
    if origin is not None:  # a run the Trainer callback or `runs import` recorded
        cfg = {**cfg.to_dict(), "origin": origin}
    run_id = db.enqueue(cfg, running_pid=os.getpid())
    rng = np.random.default_rng(seed * 7 + int(accuracy * 100))
    wrong = rng.random(len(LABELS)) > accuracy
    preds = np.where(wrong, 1 - LABELS, LABELS)
    db.finish(
        run_id,
        {"score": float(np.mean(preds == LABELS)), "metric": "accuracy", "dev_score": accuracy,
         "step_time_s": 0.1, "test_predictions": encode_predictions(preds, LABELS, "t", False)},
    )  # fmt: skip
    return run_id


@pytest.fixture
def db() -> RunsDB:
    return RunsDB()


def test_compare_two_run_groups(db, tmp_path, capsys):
    full = [finished(db, 0.90, s, method="full", steps=100) for s in range(3)]
    frozen = [finished(db, 0.70, s, method="frozen", steps=100) for s in range(3)]
    out = tmp_path / "cmp.json"
    assert main(["runs", "compare", full[0], frozen[1], "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert list(payload)[:6] == ["diff", "se", "verdict", "n_seeds_a", "n_seeds_b", "paired_p"]
    assert payload["verdict"] == "A better"  # a run id stands for its whole group
    assert payload["n_seeds_a"] == payload["n_seeds_b"] == 3
    assert payload["diff"] == pytest.approx(0.2, abs=0.06)
    assert payload["paired_p"] < 0.01  # both scored on the same test part
    assert sorted(payload["runs_a"]) == sorted(full)
    printed = capsys.readouterr().out
    assert "verdict: A better" in printed and "seeds 0, 1, 2" in printed

    # A group key works as well, and the groups listing shows n_seeds.
    assert main(["runs", "groups", "--json", str(tmp_path / "groups.json")]) == 0
    groups = json.loads((tmp_path / "groups.json").read_text())["groups"]
    assert sorted(g["n_seeds"] for g in groups) == [3, 3]
    key = next(g["group"] for g in groups if g["label"] == "frozen")
    assert main(["runs", "compare", key[:8], full[2], "--json", str(out)]) == 0
    assert json.loads(out.read_text())["verdict"] == "B better"


def test_runs_differing_in_steps_are_not_one_group(db, tmp_path, capsys):
    short = finished(db, 0.8, 0, method="full", steps=100)
    finished(db, 0.9, 1, method="full", steps=300)
    out = tmp_path / "cmp.json"
    assert main(["runs", "compare", short, short, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert (
        payload["n_seeds_a"] == 1 and payload["verdict"] == "no difference shown (n seeds = 1, 1)"
    )
    assert main(["runs", "list"]) == 0
    listing = capsys.readouterr().out
    assert "group" in listing.splitlines()[0]


def test_compare_bad_references_are_one_clear_line(db, capsys):
    finished(db, 0.8, 0, method="full")
    assert main(["runs", "compare", "nope", "nada"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "runs groups" in err


def test_show_summarises_the_predictions_and_json_keeps_them(db, tmp_path, capsys):
    run_id = finished(db, 0.8, 0, method="full")
    record = db.get_run(run_id)["result"]["test_predictions"]
    out = tmp_path / "run.json"
    assert main(["runs", "show", run_id, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert record["predictions"] not in printed and record["labels"] not in printed
    assert "200 predictions on test part t · sha256 " in printed
    first = " ".join(str(v) for v in decode_predictions(record)[0][:10].astype(int))
    assert f"first 10: {first} …" in printed
    assert json.loads(out.read_text())["result"]["test_predictions"] == record  # whole in JSON


def test_list_says_which_runs_were_imported(db, tmp_path, capsys):
    own = finished(db, 0.8, 0, method="full")
    callback = finished(db, 0.8, 1, method="full", origin={"kind": "trainer"})
    folder = finished(db, 0.8, 2, method="lora", origin={"kind": "trainer-import"})
    joined = finished(db, 0.8, 3, method="full")  # join_groups=True: the tag says it
    db.set_tags(joined, ["imported"])
    out = tmp_path / "list.json"
    assert main(["runs", "list", "--json", str(out)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert "imported" in header
    kinds = {r["id"]: r["imported"] for r in json.loads(out.read_text())["runs"]}
    assert kinds == {own: "no", callback: "callback", folder: "folder", joined: "yes"}


def test_groups_show_the_median_step_time_and_keep_the_mean(db, tmp_path, capsys):
    for seed, step in enumerate((0.1, 0.1, 0.4)):
        run_id = finished(db, 0.8, seed, method="full")
        with db._write() as conn:  # a slowed seed
            result = {**db.get_run(run_id)["result"], "step_time_s": step}
            conn.execute(
                "UPDATE runs SET result_json = ? WHERE id = ?", (json.dumps(result), run_id)
            )
    out = tmp_path / "groups.json"
    assert main(["runs", "groups", "--json", str(out)]) == 0
    assert "step_time_s (median)" in capsys.readouterr().out
    (group,) = json.loads(out.read_text())["groups"]
    assert group["step_time_s"] == pytest.approx(0.1) and group[
        "step_time_s_mean"
    ] == pytest.approx(0.2)
