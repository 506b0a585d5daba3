"""A recipe exported from a tunescope heads run, applied in a plain transformers ``Trainer`` at the
same seed and steps, gives the same test score — on the embedded default (MiniLM, movie
snippets) at toy size: 8 steps of 8 examples. The user side uses only the exported
tunescope_recipe.py, transformers and the `TunescopeCallback`, which records the Trainer run
into the runs database, where it joins the tunescope run's group (`join_groups=True`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from exported import import_recipe_module

from analysis.config import DataSpec, ModelSpec
from analysis.data import load_data
from analysis.extract import texts_of
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.engine import _subset, encode_task
from analysis.finetune.methods.heads import HeadsOptions
from analysis.heads.selection_file import HeadSelection
from analysis.predictions import decode_predictions
from analysis.runs.callback import TunescopeCallback
from analysis.runs.db import RunsDB
from analysis.runs.execute import execute_run
from tunescope.cli import main

STEPS, BATCH, N_TRAIN, N_EVAL = 8, 8, 64, 64


class Ordered(torch.utils.data.IterableDataset):
    """The examples in the order given (the Trainer does not shuffle an iterable dataset)."""

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def rows_of(part, labels) -> list[dict]:
    tokens = part.tokens
    rows = []
    for i in range(len(tokens)):
        row = {
            "input_ids": tokens.input_ids[i],
            "attention_mask": [1] * len(tokens.input_ids[i]),
            "special_tokens_mask": tokens.special[i],
            "labels": int(labels[i]),
        }
        if tokens.token_types is not None:
            row["token_type_ids"] = tokens.token_types[i]
        rows.append(row)
    return rows


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_heads_recipe_in_a_plain_trainer_gives_the_same_score(tmp_path):
    cfg = FinetuneConfig(
        model=ModelSpec("minilm"),
        data=DataSpec("movie-snippets"),
        method="heads",
        options=HeadsOptions(HeadSelection({2: [0, 3], 5: [1, 7]}, settings={"selector": "test"})),
        steps=STEPS, batch_size=BATCH, n_train=N_TRAIN, n_eval=N_EVAL, eval_every=STEPS,
        max_length=32, seed=3, device="cpu",
    )  # fmt: skip
    db = RunsDB()
    run_id = db.enqueue(cfg, running_pid=1)
    assert execute_run(db, run_id, cfg) == "done"
    ours = db.get_run(run_id)["result"]

    assert main(["export", "--run", run_id, "--out", str(tmp_path / "recipe")]) == 0
    tr = import_recipe_module(tmp_path / "recipe")
    recipe = tr.load_recipe(tmp_path / "recipe")
    assert recipe["provenance"]["run_id"] == run_id
    assert recipe["train"]["n_trainable"] == ours["n_trainable"]
    assert recipe["provenance"]["selection"] == {"selector": "test"}

    # The user's side: transformers, the exported module and the callback.
    model = tr.TunescopeClassifier.from_pretrained(recipe)
    optimizers = tr.make_optimizer(model, recipe)
    replay = tr.replay_randomness_callback(recipe)
    tokenizer = tf.AutoTokenizer.from_pretrained(tr.model_source(recipe))
    data = load_data(cfg.data)
    parts = encode_task(cfg, tokenizer, data)
    train = rows_of(parts.train, parts.train.labels.tolist())
    order = tr.tunescope_batches(len(train), BATCH, recipe["training"]["seed"], STEPS)
    test_rows = _subset(data.parts["test"], N_EVAL, 0)
    test = rows_of(parts.test, parts.test.labels.tolist())
    recorder = TunescopeCallback(
        "minilm", "movie-snippets", recipe=recipe, test_dataset=test,
        test_texts=texts_of(test_rows)[0], join_groups=True,
    )  # fmt: skip
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        seed=recipe["training"]["seed"], max_grad_norm=1.0, report_to=[], save_strategy="no",
        logging_steps=1, use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Ordered([train[i] for batch in order for i in batch]),
        data_collator=tf.DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        optimizers=optimizers,
        callbacks=[replay, recorder],
    )
    trainer.train()

    theirs = db.get_run(recorder.run_id)
    assert theirs["status"] == "done"
    assert "imported" in db.tags(recorder.run_id)
    a = decode_predictions(ours["test_predictions"])
    b = decode_predictions(theirs["result"]["test_predictions"])
    assert (
        ours["test_predictions"]["fingerprint"]
        == theirs["result"]["test_predictions"]["fingerprint"]
    )
    assert np.array_equal(a[1], b[1])  # the same gold labels
    assert np.array_equal(a[0], b[0])  # the same predictions, example by example
    assert theirs["result"]["score"] == pytest.approx(ours["score"], abs=1e-9)
    losses = db.steps(recorder.run_id, kind="train")
    assert sorted(losses[losses.key == "loss"].step) == list(range(1, STEPS + 1))
    ours_loss = db.steps(run_id, kind="train")
    ours_loss = ours_loss[ours_loss.key == "loss"].value.to_numpy()
    theirs_loss = losses[losses.key == "loss"].value.to_numpy()
    np.testing.assert_allclose(theirs_loss, ours_loss, rtol=1e-4)
    # It reproduces the tunescope run's setting, so it joins that run's group (join_groups=True).
    assert theirs["group_key"] == db.get_run(run_id)["group_key"]
