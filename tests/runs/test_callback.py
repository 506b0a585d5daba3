"""TunescopeCallback and `runs import`: a user's own Trainer runs in the runs database.

Tiny BERT (in-process), a few Trainer steps each: the run's config, curves, result and ending
(done / failed with its steps), trajectory snapshots the Subspaces code reads, the database
refusing writes with one clear message, and imported runs grouping only with their own kind.
"""

from __future__ import annotations

import os
import sqlite3

import pytest
import torch
import transformers as tf
from tiny import make_tiny_model_dir

from analysis.runs.callback import (
    CallbackError,
    TunescopeCallback,
    infer_method,
    recognised,
)
from analysis.runs.db import RunsDB
from analysis.runs.results import results_table, summarise
from analysis.subspace.trajectory import open_trajectory
from analysis.workspace import Workspace
from tunescope.cli import main

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
WORDS = ["good", "great", "fun", "bad", "awful", "dull"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("callback"), n_layers=3)
    tokenizer = tf.AutoTokenizer.from_pretrained(str(folder))
    return folder, tokenizer


def examples(tokenizer, n: int = 16):
    rows = []
    for i in range(n):
        label = i % 2
        text = " ".join(WORDS[3 * label + (i + j) % 3] for j in range(3))
        rows.append({**tokenizer(text), "labels": label})
    return rows


def make_trainer(folder, tokenizer, tmp_path, callbacks, steps=4, model=None, **extra):
    torch.manual_seed(0)
    model = model or tf.AutoModelForSequenceClassification.from_pretrained(
        str(folder), num_labels=2
    )
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        learning_rate=1e-3, **extra,
    )  # fmt: skip
    data = examples(tokenizer)
    return tf.Trainer(
        model=model, args=args, train_dataset=data, eval_dataset=data,
        data_collator=tf.DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
        callbacks=callbacks, compute_metrics=accuracy,
    )  # fmt: skip


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def test_a_trainer_run_is_recorded(tiny, tmp_path):
    folder, tokenizer = tiny
    test = examples(tokenizer, 6)
    callback = TunescopeCallback(
        str(folder), "toy", test_dataset=test, data_fingerprint="toy-v1", trajectory_every=2,
        tags=["mine"],
    )  # fmt: skip
    trainer = make_trainer(
        folder, tokenizer, tmp_path, [callback], eval_strategy="steps", eval_steps=2
    )
    trainer.train()
    db = RunsDB()
    run = db.get_run(callback.run_id)
    assert run["status"] == "done"
    assert run["method"] == "full"
    assert run["config"]["origin"] == {"kind": "trainer", "data_fingerprint": "toy-v1",
                                       "recipe": False, "model_class": "BertForSequenceClassification",
                                       "precision": "float32", "best_at_end": False}  # fmt: skip
    config = run["config"]  # what ran, not tunescope's defaults
    assert (config["pooling"], config["eval_every"], config["mixed_precision"]) == (
        "first",
        2,
        False,
    )
    assert config["steps"] == 4 and config["lr"] == config["classifier_lr"] == 1e-3
    assert set(db.tags(callback.run_id)) == {"imported", "mine"}
    result = run["result"]
    assert result["n_trainable"] == sum(p.numel() for p in trainer.model.parameters())
    assert 0.0 <= result["score"] <= 1.0 and result["test_predictions"]["n"] == 6
    assert result["wall_s"] > 0 and result["step_time_s"] > 0 and result["device"] == "cpu"
    steps = db.steps(callback.run_id)
    assert sorted(steps[(steps.kind == "train") & (steps.key == "loss")].step) == [1, 2, 3, 4]
    assert sorted(steps[(steps.kind == "dev") & (steps.key == "dev")].step) == [2, 4]
    trajectory = open_trajectory(db.trajectory_dir(callback.run_id))
    assert trajectory.t == 2 and trajectory.layers == [1, 2, 3]  # θ_0 + snapshots at 2 and 4
    table = results_table(db.list_runs())
    assert callback.run_id in set(table["id"])
    # The Subspaces code reads its trajectory like any run's.
    assert main(["subspace", "--run", callback.run_id, "--json", str(tmp_path / "s.json")]) == 0


def test_a_crash_leaves_a_failed_run_with_its_steps(tiny, tmp_path):
    folder, tokenizer = tiny
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    calls = {"n": 0}
    original = model.forward

    def forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the user's data loader broke")
        return original(*args, **kwargs)

    model.forward = forward
    with pytest.raises(RuntimeError), TunescopeCallback(str(folder), "toy") as callback:
        make_trainer(
            folder, tokenizer, tmp_path, [callback], model=model, remove_unused_columns=False
        ).train()
    db = RunsDB()
    run = db.get_run(callback.run_id)
    assert run["status"] == "failed" and "data loader broke" in run["error"]
    assert run["result"] is None
    losses = db.steps(callback.run_id, kind="train")
    assert sorted(losses[losses.key == "loss"].step) == [1, 2]


def test_a_locked_database_is_one_clear_message(tiny, tmp_path):
    folder, tokenizer = tiny
    callback = TunescopeCallback(str(folder), "toy", lock_timeout_s=0.2)
    holder = sqlite3.connect(Workspace.current().runs_db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(CallbackError, match="is locked by another process"):
            make_trainer(folder, tokenizer, tmp_path, [callback]).train()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_read_only_database_is_one_clear_message(tiny, monkeypatch):
    folder, _ = tiny

    def read_only(self, path=None):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(RunsDB, "__init__", read_only)
    with pytest.raises(CallbackError, match="is read-only"):
        TunescopeCallback(str(folder), "toy")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_folder_is_one_clear_message(tiny, tmp_path):
    folder, _ = tiny
    cache = tmp_path / "ro"
    cache.mkdir()
    RunsDB(Workspace(cache)).close()
    for path in (cache, *cache.iterdir()):
        path.chmod(0o555 if path.is_dir() else 0o444)
    with pytest.raises(CallbackError, match=r"read-only|cannot be written"):
        callback = TunescopeCallback(str(folder), "toy", cache=cache)
        callback._db(callback.db.enqueue, {"method": "full", "seed": 0}, running_pid=1)


def test_the_method_is_inferred_from_what_trains(tiny):
    folder, _ = tiny
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    assert infer_method(model) == "full"
    model.bert.requires_grad_(False)
    assert infer_method(model) == "frozen"
    model.bert.encoder.layer[2].requires_grad_(True)
    assert infer_method(model) == "layers"
    assert recognised(model) == ("layers", {"layers": [3, 3], "classifier_layer": 3})
    model.bert.embeddings.requires_grad_(True)
    assert infer_method(model) == "custom"  # embeddings and a layer: no method trains that
    model.bert.requires_grad_(False)
    for name, param in model.bert.named_parameters():
        param.requires_grad_(name.endswith("bias"))
    assert infer_method(model) == "bitfit"


def test_peft_models_are_recognised_by_their_peft_method(tiny):
    from peft import IA3Config, LoraConfig, get_peft_model

    folder, _ = tiny
    for config, method in ((LoraConfig(task_type="SEQ_CLS", target_modules=["query"]), "lora"),
                           (IA3Config(task_type="SEQ_CLS", target_modules=["key"],
                                      feedforward_modules=[]), "ia3")):  # fmt: skip
        model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
        assert infer_method(get_peft_model(model, config)) == method


def test_runs_import_of_a_trainer_folder(tiny, tmp_path, capsys):
    folder, tokenizer = tiny
    ids = []
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        trainer = make_trainer(
            folder, tokenizer, out, [], eval_strategy="steps", eval_steps=2, seed=seed
        )
        trainer.train()
        trainer.save_state()
        (out / "out" / "test_results.json").write_text('{"test_accuracy": 0.75}')
        argv = ["runs", "import", str(out / "out"), "--model", "tiny", "--data", "toy"]
        assert main([*argv, "--seed", str(seed)]) == 0
        ids.append(capsys.readouterr().out.split("imported run ")[1].split()[0])
    db = RunsDB()
    for run_id in ids:
        run = db.get_run(run_id)
        assert run["status"] == "done" and run["config"]["origin"]["kind"] == "trainer-import"
        assert run["result"]["score"] == 0.75
        steps = db.steps(run_id)
        assert sorted(steps[(steps.kind == "dev") & (steps.key == "dev")].step) == [2, 4]
        assert "imported" in db.tags(run_id)
    summary = summarise(results_table(db.list_runs()))
    assert summary["n_seeds"].tolist() == [2]  # the two seeds of one setting, one group
    assert main(["runs", "list"]) == 0
    assert ids[0] in capsys.readouterr().out


def test_runs_import_refuses_a_folder_without_trainer_state(tmp_path, capsys):
    assert main(["runs", "import", str(tmp_path)]) == 2
    assert (
        "holds no run folder (run.json, written by TunescopeCallback) and no "
        "trainer_state.json" in capsys.readouterr().err
    )


def test_imported_and_tunescope_runs_never_share_a_group():
    from analysis.finetune.config import FinetuneConfig
    from analysis.runs.record import setting_key

    config = FinetuneConfig().to_dict()
    assert setting_key(config) != setting_key({**config, "origin": {"kind": "trainer"}})


CRASHING_SCRIPT = """
import sys
import transformers as tf
sys.path.insert(0, {root!r})
from analysis.runs.callback import TunescopeCallback

class Broken(tf.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("the user's own callback broke")

folder = {folder!r}
tokenizer = tf.AutoTokenizer.from_pretrained(folder)
model = tf.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
rows = [dict(tokenizer("good fun movie"), labels=1), dict(tokenizer("bad dull plot"), labels=0)]
callback = TunescopeCallback(folder, "toy")
print(callback.db.path)
tf.Trainer(
    model=model, train_dataset=rows * 4, data_collator=tf.DataCollatorWithPadding(tokenizer),
    args=tf.TrainingArguments(output_dir={out!r}, max_steps=4, per_device_train_batch_size=2,
                              logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                              disable_tqdm=True),
    callbacks=[callback, Broken()],
).train()
"""


def test_a_process_that_dies_of_an_exception_leaves_its_run_failed(tiny, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    folder, _ = tiny
    root = str(Path(__file__).resolve().parents[2])
    script = CRASHING_SCRIPT.format(root=root, folder=str(folder), out=str(tmp_path / "out"))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"},
    )  # fmt: skip
    assert done.returncode != 0 and "own callback broke" in done.stderr
    db = RunsDB()
    (run_id,) = db.list_runs()["id"]
    run = db.get_run(run_id)
    assert run["status"] == "failed" and "ended before the run finished" in run["error"]
    assert "own callback broke" in run["error"]
    losses = db.steps(run_id, kind="train")
    assert sorted(losses[losses.key == "loss"].step) == [1]


def test_runs_compare_reads_callback_runs(tiny, tmp_path, capsys):
    import json

    folder, tokenizer = tiny
    test = examples(tokenizer, 8)
    ids = []
    for lr in (1e-3, 1e-4):
        callback = TunescopeCallback(str(folder), "toy", test_dataset=test)
        trainer = make_trainer(folder, tokenizer, tmp_path / str(lr), [callback])
        trainer.args.learning_rate = lr
        trainer.train()
        ids.append(callback.run_id)
    out = tmp_path / "compare.json"
    assert main(["runs", "compare", *ids, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["runs_a"] == [ids[0]] and result["runs_b"] == [ids[1]]
    assert result["paired_p"] is not None  # the same test examples: paired example by example


def test_the_callback_writes_into_the_current_workspace(tmp_path):
    workspace = Workspace(tmp_path / "elsewhere")
    with workspace.active():
        callback = TunescopeCallback("m", "d")
    assert callback.db.path == workspace.runs_db and callback.workspace == workspace
    assert (
        TunescopeCallback("m", cache=tmp_path / "third").db.path
        == tmp_path / "third" / "runs.sqlite"
    )
