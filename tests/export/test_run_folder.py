"""The exported module's callback on its own (no database): the schedule fitted to the Trainer's
steps, the test set in every form a Hugging Face user has (and refused before training when it is
unusable), what actually ran, and how a run ends — each written to the run folder, which
`runs import` brings back."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers as tf
from datasets import Dataset
from exported import import_recipe_module
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.export.build import build_recipe, write_recipe
from analysis.finetune.config import flat_config
from analysis.models import load_model
from analysis.runs.db import RunsDB
from tunescope.cli import main

WORDS = ["good", "great", "fun", "bad", "awful", "dull"]
RECIPE_STEPS = 4
FORMS = ["datasets.Dataset (raw)", "datasets.Dataset (tokenized)", "datasets.Dataset (torch format)",
         "list of dicts (raw)", "list of dicts (tokenized)", "torch Dataset (tokenized)",
         "dict of columns"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("run-folder"), n_layers=3)
    return folder, load_model(ModelSpec(str(folder)), device="cpu")


@pytest.fixture
def recipe_module(tiny, tmp_path):
    """(the exported module, its recipe): layers 2–3 of the tiny BERT, ``RECIPE_STEPS`` steps."""
    folder, loaded = tiny
    cfg = flat_config(model={"name": str(folder)}, method="layers", layers=(2, 3, 3),
                      steps=RECIPE_STEPS, warmup=0.25, lr=1e-3)  # fmt: skip
    write_recipe(build_recipe(cfg, loaded, 2), tmp_path / "recipe")
    tr = import_recipe_module(tmp_path / "recipe")
    return tr, tr.load_recipe(tmp_path / "recipe")


def texts(n: int) -> list[dict]:
    return [{"text": " ".join(WORDS[3 * (i % 2) + (i + j) % 3] for j in range(3)), "label": i % 2}
            for i in range(n)]  # fmt: skip


def tokenized(tokenizer, rows: list[dict]) -> list[dict]:
    return [{**tokenizer(row["text"]), "labels": row["label"]} for row in rows]


def trainer_of(tiny, tmp_path, callbacks, *, model=None, optimizers=(None, None), steps=6, **extra):
    folder, loaded = tiny
    torch.manual_seed(0)
    model = model or tf.AutoModelForSequenceClassification.from_pretrained(
        str(folder), num_labels=2
    )
    for_trainer = {k: extra.pop(k) for k in ("eval_dataset", "compute_metrics") if k in extra}
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        **extra,
    )  # fmt: skip
    return tf.Trainer(
        model=model, args=args, train_dataset=tokenized(loaded.tokenizer, texts(16)),
        data_collator=tf.DataCollatorWithPadding(loaded.tokenizer),
        processing_class=loaded.tokenizer, optimizers=optimizers, callbacks=callbacks,
        **for_trainer,
    )  # fmt: skip


def learning_rates(trainer) -> list[float]:
    return [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]


def test_the_schedule_spans_the_trainers_steps(tiny, tmp_path, recipe_module):
    """A 10-step Trainer on a 4-step recipe: the rate warms up and decays over the 10 steps and
    never goes below zero (before: factor −0.55 at the last step, gradient ascent)."""
    tr, recipe = recipe_module
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(tiny[0]), num_labels=2)
    optimizers = tr.make_optimizer(model, recipe)
    callback = tr.TunescopeCallback(recipe=recipe)
    trainer = trainer_of(tiny, tmp_path, [callback], model=model, optimizers=optimizers, steps=10)
    trainer.train()
    rates = learning_rates(trainer)
    assert len(rates) == 10 and min(rates) >= 0.0
    peak = recipe["optimizer"]["lr"]
    # warm-up over round(0.25 × 10) = 2 updates, then down to 1/8 of the peak at the last one
    assert rates[1] == pytest.approx(peak) and rates[-1] == pytest.approx(peak / 8)
    assert rates == sorted(rates[:2]) + sorted(rates[2:], reverse=True)
    ran = tr.read_run_folder(callback.folder.path)["ran"]
    assert ran["steps"] == 10 and ran["optimizer"]["schedule"] == "recipe"


def test_without_the_callback_the_schedule_stops_past_its_steps(tiny, tmp_path, recipe_module):
    tr, recipe = recipe_module
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(tiny[0]), num_labels=2)
    trainer = trainer_of(
        tiny, tmp_path, [], model=model, optimizers=tr.make_optimizer(model, recipe)
    )
    with pytest.raises(tr.RecipeError, match="covers 4 steps and the Trainer is past them"):
        trainer.train()
    assert min(learning_rates(trainer)) >= 0.0  # never a negative rate, not even once


def test_fixed_steps_that_differ_are_refused_before_training(tiny, tmp_path, recipe_module):
    tr, recipe = recipe_module
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(tiny[0]), num_labels=2)
    optimizers = tr.make_optimizer(model, recipe, steps=4)
    callback = tr.TunescopeCallback(recipe=recipe)
    trainer = trainer_of(tiny, tmp_path, [callback], model=model, optimizers=optimizers)
    with pytest.raises(tr.RecipeError, match="given steps=4, but the Trainer runs 6 steps"):
        trainer.train()
    assert trainer.state.global_step == 0 and callback.folder is None


def forms_of_test_set(tokenizer) -> dict:
    rows = texts(10)
    encoded = Dataset.from_list(rows).map(lambda b: tokenizer(b["text"]), batched=True)
    in_torch = encoded.remove_columns("text").with_format("torch")

    class Tokenized(torch.utils.data.Dataset):  # a user's own map-style dataset
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return {**tokenizer(rows[i]["text"]), "labels": rows[i]["label"]}

    return {
        "datasets.Dataset (raw)": Dataset.from_list(rows),
        "datasets.Dataset (tokenized)": encoded,
        "datasets.Dataset (torch format)": in_torch,
        "list of dicts (raw)": rows,
        "list of dicts (tokenized)": tokenized(tokenizer, rows),
        "torch Dataset (tokenized)": Tokenized(),
        "dict of columns": {"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]},
    }


@pytest.mark.parametrize("form", FORMS)
def test_every_form_of_test_set_is_scored_as_trainer_predict_scores_it(tiny, tmp_path, form):
    _folder, loaded = tiny
    test = forms_of_test_set(loaded.tokenizer)[form]
    tr = import_recipe_module_plain(tmp_path)
    callback = tr.TunescopeCallback(test_dataset=test)
    trainer = trainer_of(tiny, tmp_path, [callback], steps=2)
    trainer.train()
    run = tr.read_run_folder(callback.folder.path)
    predicted = trainer.predict(tokenized(loaded.tokenizer, texts(10))).predictions.argmax(-1)
    assert run["test"]["predictions"] == predicted.tolist()
    assert run["test"]["labels"] == [float(r["label"]) for r in texts(10)]
    raw = form in ("datasets.Dataset (raw)", "list of dicts (raw)", "dict of columns",
                   "datasets.Dataset (tokenized)")  # fmt: skip
    assert run["test"]["keys_are"] == ("texts" if raw else "token ids")


def import_recipe_module_plain(tmp_path):
    """The exported module, from a recipe folder (no recipe needed to record a run)."""
    from analysis.export import build

    folder = tmp_path / "module"
    folder.mkdir(exist_ok=True)
    source = (build.Path(build.__file__).parent / build.MODULE_FILE).read_text(encoding="utf-8")
    (folder / build.MODULE_FILE).write_text(source, encoding="utf-8")
    return import_recipe_module(folder)


@pytest.mark.parametrize(
    ("test", "message"),
    [("a string", "must be a datasets.Dataset, a list of dicts or a tokenized dataset"),
     ([], "The test set is empty"),
     ([{"text": "good fun"}], "Test example 0 has no label ('labels' or 'label'); its columns: text"),
     ([{"text": "good", "label": "positive"}], "Test example 0's label is 'positive', not a number"),
     ([{"sentence": "good", "label": 1}], "neither input_ids (tokenized) nor a text column 'text'"),
     ([{"text": "good", "label": 5}], "The test labels must be 0 … 1 (the model has 2 classes)"),
     ({"text": ["a", "b"], "label": [1]}, "needs columns of one length")],
)  # fmt: skip
def test_an_unusable_test_set_fails_before_training(tiny, tmp_path, test, message):
    tr = import_recipe_module_plain(tmp_path)
    trainer = trainer_of(tiny, tmp_path, [])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(tr.CallbackError) as raised:
        trainer.add_callback(tr.TunescopeCallback(test_dataset=test))
        trainer.train()
    assert message in str(raised.value)
    assert trainer.state.global_step == 0  # not one step was spent
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert not (tmp_path / "out" / "tunescope-runs").exists()


def test_a_raw_test_set_needs_the_tokenizer_before_training(tiny, tmp_path):
    tr = import_recipe_module_plain(tmp_path)
    trainer = trainer_of(tiny, tmp_path, [tr.TunescopeCallback(test_dataset=texts(4))])
    trainer.processing_class = trainer.callback_handler.processing_class = None
    with pytest.raises(tr.CallbackError, match="needs the Trainer's processing_class"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_what_ran_and_run_groups_by_model_class(tiny, tmp_path, recipe_module):
    """The same recipe trained as AutoModelForSequenceClassification and as TunescopeClassifier:
    each run records its class, classifier and pooling, evaluation, precision and steps, and
    the two never share a run group; two seeds of one class do."""
    tr, recipe = recipe_module
    folder, _ = tiny
    ids = {}
    for name, seed in (("hf", 0), ("hf", 1), ("tunescope", 0)):
        torch.manual_seed(seed)
        if name == "hf":
            model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
        else:
            model = tr.TunescopeClassifier.from_pretrained(recipe, seed=seed)
        callback = tr.TunescopeCallback(recipe=recipe, data_name="toy", metric="accuracy")
        trainer = trainer_of(
            tiny, tmp_path / f"{name}{seed}", [callback], model=model, seed=seed,
            optimizers=tr.make_optimizer(model, recipe), eval_strategy="steps", eval_steps=3,
            eval_dataset=tokenized(tiny[1].tokenizer, texts(6)), compute_metrics=accuracy,
        )  # fmt: skip
        trainer.train()
        ran = tr.read_run_folder(callback.folder.path)["ran"]
        assert ran["steps"] == 6 and ran["precision"] == "float32"
        assert ran["evaluation"] == {"strategy": "steps", "every": 3, "best_at_end": False}
        assert (
            ran["optimizer"]["from_recipe"] and ran["optimizer"]["lr"] == recipe["optimizer"]["lr"]
        )
        if name == "hf":
            assert (ran["model"]["class"], ran["model"]["classifier"], ran["model"]["pooling"]) \
                == ("BertForSequenceClassification", "transformers", "first")  # fmt: skip
        else:
            assert (ran["model"]["class"], ran["model"]["classifier"], ran["model"]["pooling"]) \
                == ("TunescopeClassifier", "tunescope", "mean")  # fmt: skip
        assert main(["runs", "import", str(callback.folder.path)]) == 0
        (ids[name, seed],) = RunsDB().list_runs().head(1)["id"]
    db = RunsDB()
    config = db.get_run(ids["hf", 0])["config"]
    assert (config["pooling"], config["eval_every"], config["mixed_precision"]) == (
        "first",
        3,
        False,
    )
    assert config["origin"]["model_class"] == "BertForSequenceClassification"
    keys = {k: db.get_run(i)["group_key"] for k, i in ids.items()}
    assert keys["hf", 0] == keys["hf", 1] != keys["tunescope", 0]
    dev = db.steps(ids["hf", 0], kind="dev")
    assert sorted(dev[dev.key == "dev"].step) == [3, 6]
    assert db.get_run(ids["hf", 0])["result"]["n_eval"] == 6


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def test_the_count_follows_the_masks_the_recipe_holds(tiny, tmp_path):
    """Head rows train in part: the trainable count is the rows kept, whatever the recipe's
    method is called (before: only a recipe named "heads" was counted so)."""
    folder, loaded = tiny
    cfg = flat_config(model={"name": str(folder)}, method="heads", heads={"2": [1], "3": [0, 2]})
    write_recipe(build_recipe(cfg, loaded, 2), tmp_path / "r")
    tr = import_recipe_module(tmp_path / "r")
    recipe = tr.load_recipe(tmp_path / "r")
    recipe["method"] = "my-own-head-picking"
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    tr.apply_recipe(model, recipe)
    whole = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert tr.count_trainable(model) == recipe["train"]["n_trainable"] < whole
    callback = tr.TunescopeCallback(recipe=recipe)
    trainer_of(tiny, tmp_path, [callback], model=model, steps=1).train()
    ran = tr.read_run_folder(callback.folder.path)["ran"]
    assert ran["model"]["n_trainable"] == recipe["train"]["n_trainable"]


def test_how_a_run_ends_and_comes_back(tiny, tmp_path, capsys):
    """A crash leaves the run folder failed with its steps, Ctrl-C cancelled; both import as
    such, nothing lost; a folder imported once is not imported twice."""
    tr = import_recipe_module_plain(tmp_path)

    class Broken(tf.TrainerCallback):
        def __init__(self, error):
            self.error = error

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise self.error

    for error, status in ((RuntimeError("the loader broke"), "failed"),
                          (KeyboardInterrupt(), "cancelled")):  # fmt: skip
        callback = tr.TunescopeCallback(data_name="toy")
        trainer = trainer_of(tiny, tmp_path / status, [callback, Broken(error)])
        with pytest.raises(type(error)), callback:
            trainer.train()
        run = tr.read_run_folder(callback.folder.path)
        assert run["status"] == status and [s["step"] for s in run["steps"]] == [1]
    assert main(["runs", "import", str(tmp_path / "failed" / "out")]) == 0
    assert main(["runs", "import", str(tmp_path / "cancelled" / "out")]) == 0
    runs = RunsDB().list_runs().set_index("status")
    assert sorted(runs.index) == ["cancelled", "failed"]
    failed = RunsDB().get_run(runs.loc["failed", "id"])
    assert failed["error"] == "RuntimeError: the loader broke" and failed["result"] is None
    assert list(RunsDB().steps(failed["id"], kind="train").query("key == 'loss'").step) == [1]
    capsys.readouterr()
    # A run folder that is done imports once.
    callback = tr.TunescopeCallback(data_name="toy")
    trainer_of(tiny, tmp_path / "done", [callback], steps=2).train()
    assert main(["runs", "import", str(tmp_path / "done" / "out")]) == 0
    assert main(["runs", "import", str(tmp_path / "done" / "out")]) == 0
    assert "nothing new" in capsys.readouterr().out
    assert len(RunsDB().list_runs()) == 3
    record = json.loads((callback.folder.path / "run.json").read_text())
    assert record["status"] == "done" and os.path.isfile(callback.folder.path / "steps.jsonl")


def test_the_runs_page_imports_a_run_folder(tiny, tmp_path, monkeypatch):
    """The Runs page's import: a Trainer's output folder comes back as an imported run with the
    callback's score; the same folder again is nothing new; a folder outside the folders the
    dashboard may read, or one without runs, is one message and imports nothing."""
    from apptest_utils import errors, make_app, open_page

    tr = import_recipe_module_plain(tmp_path)
    callback = tr.TunescopeCallback(data_name="toy")
    trainer_of(tiny, tmp_path / "done", [callback], steps=2).train()
    score = json.loads((callback.folder.path / "run.json").read_text())
    monkeypatch.setenv("TUNESCOPE_ALLOWED_ROOTS", str(tmp_path / "done"))
    at = open_page(make_app(tiny[0], monkeypatch), "views/runs.py")

    def import_folder(folder) -> None:
        next(x for x in at.text_input if x.label == "Folder").set_value(str(folder))
        next(x for x in at.button if x.label == "Import").click().run()

    import_folder(tmp_path / "elsewhere")
    assert any("outside the folders this dashboard may read" in e for e in errors(at))
    import_folder(tmp_path / "done" / "out")  # the Trainer's output_dir
    assert not errors(at) and "Imported 1 run" in at.success[0].value
    (run,) = RunsDB().list_runs().itertuples()
    assert run.status == "done" and "imported" in run.tags
    stored = RunsDB().get_run(run.id)["result"]
    assert stored["run_folder_id"] == score["id"]
    import_folder(callback.folder.path)  # the run folder itself
    assert "Nothing new" in at.info[0].value and len(RunsDB().list_runs()) == 1
    (tmp_path / "done" / "empty").mkdir()
    import_folder(tmp_path / "done" / "empty")
    assert any("holds no run folder" in e for e in errors(at))
