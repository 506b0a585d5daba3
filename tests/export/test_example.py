"""The worked example (docs/examples/trainer_example.py) at toy size: export a recipe on the
embedded default, run the plain Trainer script in its own process, and find the run in the runs
database, on the Runs page and in the Fine-tune page's results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from apptest_utils import errors, make_app

from analysis.cli import main
from analysis.runs.db import RunsDB
from analysis.runs.results import results_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_worked_example_trains_and_shows_up(tmp_path, tiny_bert_dir, monkeypatch):
    recipe = tmp_path / "my-recipe"
    argv = ["export", "--strategy", "1,3,3", "--steps", "3", "--batch-size", "8"]
    assert main([*argv, "--out", str(recipe)]) == 0
    script = ROOT / "docs" / "examples" / "trainer_example.py"
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), "--recipe", str(recipe), "--n-train", "32",
         "--n-test", "32", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = done.stdout.split("run ")[-1].split(":")[0]
    db = RunsDB()
    run = db.get_run(run_id)
    assert run["status"] == "done" and run["label"] == "(1, 3, 3)"
    assert run["result"]["test_predictions"]["n"] == 32
    assert "imported" in db.tags(run_id)
    assert run_id in set(results_table(db.list_runs())["id"])

    at = make_app(tiny_bert_dir, monkeypatch)
    at.switch_page("views/runs.py").run()
    assert not errors(at)
    assert run_id in set(at.dataframe[0].value["id"])

    # …and in the Fine-tune page's results for its model and data, like any run.
    at = make_app("minilm", monkeypatch)
    at.switch_page("views/finetune.py").run()
    assert not errors(at)
    assert any("1 finished run(s) in 1 run group(s)" in c.value for c in at.caption)
