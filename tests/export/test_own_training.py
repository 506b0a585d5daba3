"""The tutorial's training script (docs/tutorials/your-trainer.md, the README's "own training"
section) run as a user runs it: in a process where nothing of tunescope can be imported, with
only the exported folder beside it, a tiny in-process BERT, a CSV data set read by
``datasets``, and more steps than the recipe's. `tunescope runs import` brings its run folder
back, with the config of what ran and the test score the script's own ``trainer.predict`` gives;
the run shows on the Runs page and in the Fine-tune page's results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from apptest_utils import errors, make_app

from analysis.config import DataSpec
from analysis.data import load_data
from analysis.predictions import decode_predictions, fingerprint_of_part
from analysis.runs.db import RunsDB
from analysis.runs.results import results_table
from tunescope.cli import main

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorials" / "your-trainer.md"
RECIPE_STEPS = 4

# Run the script with `analysis` and `ui` unimportable (the shared environment has tunescope
# installed; a user's need not), then report what the test compares.
GUARD = """
import importlib.abc, json, runpy, sys

class NoTunescope(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("analysis", "ui"):
            raise ModuleNotFoundError(f"No module named {name!r}: tunescope is not installed here")

sys.meta_path.insert(0, NoTunescope())
try:
    import analysis
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the guard let tunescope in")
script = runpy.run_path("train.py", run_name="__main__")
assert not [m for m in sys.modules if m.split(".")[0] in ("analysis", "ui")]
trainer = script["trainer"]
factor = trainer.lr_scheduler.lr_lambdas[0]  # the rate's factor at each update that ran
rates = [factor(i) for i in range(trainer.state.global_step)]
json.dump({"predictions": script["predicted"].predictions.argmax(-1).tolist(),
           "accuracy": float(script["accuracy"]), "steps": trainer.state.global_step,
           "rates": rates, "last_rate": trainer.lr_scheduler.get_last_lr()},
          open("seen.json", "w"))
"""


def tutorial_script(text: str | None = None) -> str:
    """The one ```python block of the tutorial's section "2. The training script"."""
    text = TUTORIAL.read_text(encoding="utf-8") if text is None else text
    section = text[text.index("\n## 2. The training script\n") :]
    section = section[: section.index("\n## ", 1)]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


def test_the_readme_shows_the_tutorials_script():
    """A README block that uses the recipe module is the tutorial's script, character for
    character (so the README's copy is what this file runs)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S)
             if "tunescope_recipe" in b]  # fmt: skip
    assert shown == [tutorial_script()]


def test_the_tutorials_script_trains_without_tunescope(tmp_path, tiny_bert_dir, monkeypatch):
    recipe = tmp_path / "my-recipe"
    argv = ["export", "--model", str(tiny_bert_dir), "--strategy", "2,2,2",
            "--steps", str(RECIPE_STEPS), "--batch-size", "8", "--out", str(recipe)]  # fmt: skip
    assert main(argv) == 0
    data = load_data(DataSpec("movie-snippets")).parts
    data["train"].sample(n=64, random_state=0).to_csv(tmp_path / "train.csv", index=False)
    test = data["test"].sample(n=40, random_state=0)
    test.to_csv(tmp_path / "test.csv", index=False)
    script = tutorial_script()
    # What a user edits: the data's name as tunescope knows it, and 3× the recipe's steps.
    for line in ('DATA_NAME = "my-data"', "STEPS = None"):
        assert line in script
    script = script.replace('DATA_NAME = "my-data"', 'DATA_NAME = "movie-snippets"')
    script = script.replace("STEPS = None", f"STEPS = {3 * RECIPE_STEPS}")
    (tmp_path / "train.py").write_text(script, encoding="utf-8")

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-I", "-c", GUARD], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"test accuracy {json.loads((tmp_path / 'seen.json').read_text())['accuracy']:.4f}" \
        in done.stdout  # fmt: skip
    seen = json.loads((tmp_path / "seen.json").read_text())
    # Three times the recipe's steps, the rate never below zero, and zero after the last.
    assert seen["steps"] == len(seen["rates"]) == 3 * RECIPE_STEPS
    assert min(seen["rates"]) > 0.0 and set(seen["last_rate"]) == {0.0}

    imported = subprocess.run(
        [sys.executable, "-m", "tunescope", "runs", "import", "trainer-output"], cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    db = RunsDB()
    (run_id,) = db.list_runs()["id"]
    assert f"imported run {run_id} ((2, 2, 2), accuracy" in imported.stdout
    run = db.get_run(run_id)
    assert run["status"] == "done" and "imported" in db.tags(run_id)
    result, config = run["result"], run["config"]
    # The stored score is the script's own trainer.predict accuracy, example by example.
    assert result["score"] == seen["accuracy"]
    predictions, labels, fingerprint = decode_predictions(result["test_predictions"])
    assert predictions.tolist() == seen["predictions"] and labels.tolist() == list(test["label"])
    # Keyed by the test texts: paired with any run scored on the same examples.
    assert fingerprint == fingerprint_of_part(list(test["text"]), test["label"])
    # The config is what ran: the transformers model's first-token classifier, its steps, no eval.
    assert config["steps"] == 3 * RECIPE_STEPS and config["pooling"] == "first"
    assert config["mixed_precision"] is False
    assert config["origin"]["model_class"] == "BertForSequenceClassification"
    assert run_id in set(results_table(db.list_runs())["id"])

    at = make_app(tiny_bert_dir, monkeypatch)
    at.switch_page("views/runs.py").run()
    assert not errors(at)
    assert run_id in set(at.dataframe[0].value["id"])

    # …and in the Fine-tune page's results for its model and data, like any run.
    at = make_app(tiny_bert_dir, monkeypatch, data="movie-snippets")
    at.switch_page("views/finetune.py").run()
    assert not errors(at)
    assert any("1 finished run in 1 run group" in c.value for c in at.caption)
