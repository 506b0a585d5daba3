"""run_finetune end to end on a tiny encoder and a synthetic task: training, scores, selection,
determinism, callbacks, cancelling, trajectory hooks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from tiny import WORDS, tiny_config

from analysis.config import DataSpec, ModelSpec
from analysis.data import TaskData
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.engine import build_model, encode_part, predict, run_finetune, score_part
from analysis.models import load_model
from analysis.progress import Cancelled

POSITIVE = ["good", "great", "fun", "best", "nice"]
NEGATIVE = ["bad", "awful", "dull", "worst", "boring"]


@pytest.fixture(autouse=True)
def _one_thread():
    # Two OpenMP threads on a crowded 2-core machine spin-wait for each other (100x slower).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_worded_model_dir(root: Path, n_layers: int = 3) -> Path:
    """A tiny random BERT whose tokenizer knows tiny.WORDS.

    (tests/tiny.py passes ``vocab_file=`` to BertTokenizerFast, which transformers 5 ignores, so
    its tokenizer maps every word to [UNK]; a task that depends on words needs real tokens.)
    """
    import transformers as tf

    folder = root / f"worded-bert-{n_layers}"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {word: i for i, word in enumerate(dict.fromkeys(specials + sorted(set(WORDS))))}
    tokenizer = tf.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    torch.manual_seed(0)
    model = tf.AutoModel.from_config(tiny_config("bert", len(tokenizer), n_layers, 4, 32))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_worded_model_dir(tmp_path_factory.mktemp("ft-engine"))
    loaded = load_model(ModelSpec(str(folder)), device="cpu")
    assert "[UNK]" not in loaded.tokenizer.tokenize(" ".join(POSITIVE + NEGATIVE))
    return loaded


def synthetic_part(n: int, seed: int, regression: bool = False) -> pd.DataFrame:
    """Sentiment by word choice: label 1 texts use positive words, label 0 negative ones."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    texts = [
        " ".join(rng.choice(POSITIVE if y else NEGATIVE, 3)) + " " + rng.choice(["movie", "plot"])
        for y in labels
    ]
    target = labels + rng.normal(0, 0.1, n) if regression else labels
    return pd.DataFrame({"text": texts, "label": target})


def synthetic_data(n_train=96, n_eval=40, regression=False, metric="accuracy", dev=True):
    parts = {
        "train": synthetic_part(n_train, 1, regression),
        "dev": synthetic_part(n_eval if dev else 0, 2, regression),
        "test": synthetic_part(n_eval, 3, regression),
    }
    return TaskData(
        spec=DataSpec("synthetic"),
        title="synthetic sentiment",
        parts=parts,
        label_names=() if regression else ("negative", "positive"),
        task_type="regression" if regression else "classification",
        metric="spearman" if regression else metric,
        fingerprint=f"synthetic-{regression}-{metric}-{dev}",
    )


def config(tiny, **kwargs) -> FinetuneConfig:
    base = {"model": ModelSpec("tiny"), "steps": 6, "eval_every": 3, "batch_size": 8}
    return flat_config(**{**base, **kwargs})


def early_late(result, k: int = 8) -> tuple[float, float]:
    losses = [v for _, v in result.curves["train_loss"]]
    return float(np.mean(losses[:k])), float(np.mean(losses[-k:]))


@pytest.mark.parametrize(("method", "lr"), [("bitfit", 1e-2), ("lora", 1e-2)])
def test_lora_and_bitfit_learn_an_easy_task(tiny, method, lr):
    cfg = config(
        tiny,
        method=method,
        lr=lr,
        classifier_lr=lr,
        steps=40,
        eval_every=20,
        batch_size=16,
        warmup=0.0,
    )
    result = run_finetune(cfg, loaded=tiny, data=synthetic_data())
    early, late = early_late(result)
    assert late < 0.8 * early, (early, late)
    assert result.score is not None and result.score > 0.6


def test_result_reports_costs_and_is_json_safe(tiny):
    data = synthetic_data()
    cfg = config(tiny, method="layers", layers=(2, 2, 2), n_train=40)
    result = run_finetune(cfg, loaded=tiny, data=data)
    payload = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    for key in ("score", "metric", "n_trainable", "n_params", "wall_s", "peak_mem_mb", "config"):
        assert key in payload
    assert payload["config"] == cfg.to_dict()
    assert FinetuneConfig.from_dict(payload["config"]) == cfg
    assert result.layers_forward == 2 and result.layers_backward == 1
    assert result.n_train == 40 and result.n_test == 40
    assert 0 < result.share < 1 and result.n_trainable < result.n_params
    assert result.step_time_s > 0 and result.wall_s > 0 and result.peak_mem_mb >= 0
    assert [s for s, _ in result.curves["train_loss"]] == list(range(1, 7))
    assert [s for s, _ in result.curves["dev"]] == [3, 6]


def test_best_dev_state_is_selected_and_scored_on_test(tiny, monkeypatch):
    from analysis.finetune import engine

    seen: list[torch.Tensor] = []  # the classifier's weights at every predict call

    def spy(model, *args, **kwargs):
        seen.append(model.classifier.out.weight.detach().clone())
        return predict(model, *args, **kwargs)

    monkeypatch.setattr(engine, "predict", spy)
    result = run_finetune(
        config(tiny, method="full", steps=8, eval_every=2, lr=1e-3),
        loaded=tiny,
        data=synthetic_data(),
    )
    dev = result.curves["dev"]
    best = max(v for _, v in dev)
    assert result.dev_score == best
    assert result.best_step == next(s for s, v in dev if v == best)  # the first best
    assert len(seen) == len(dev) + 1  # every dev evaluation, then the test part once
    best_index = [s for s, _ in dev].index(result.best_step)
    assert torch.equal(seen[-1], seen[best_index])  # the test part sees the best-dev state
    assert result.best_step < 8  # so the state really had to be restored
    assert not torch.equal(seen[-1], seen[-2])


def test_same_config_same_numbers(tiny):
    data = synthetic_data()
    cfg = config(tiny, method="heads", heads={1: [0, 2]}, seed=3)
    first = run_finetune(cfg, loaded=tiny, data=data)
    second = run_finetune(cfg, loaded=tiny, data=data)
    assert first.curves == second.curves
    assert first.score == second.score and first.dev_score == second.dev_score
    other = run_finetune(
        config(tiny, method="heads", heads={1: [0, 2]}, seed=4), loaded=tiny, data=data
    )
    assert other.curves["train_loss"] != first.curves["train_loss"]


def test_callbacks_progress_and_cancel(tiny):
    steps, evals, fractions = [], [], []
    result = run_finetune(
        config(tiny, method="frozen"),
        loaded=tiny,
        data=synthetic_data(),
        on_step=lambda step, m: steps.append((step, set(m))),
        on_eval=lambda step, m: evals.append((step, m)),
        progress=lambda f, msg: fractions.append(f),
    )
    assert [s for s, _ in steps] == list(range(1, 7))
    assert steps[0][1] == {"loss", "lr", "elapsed_s", "eta_s"}
    assert [s for s, _ in evals] == [3, 6]
    assert set(evals[0][1]) == {"dev", "train_loss"} and math.isfinite(evals[0][1]["train_loss"])
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert result.layers_backward == 0

    seen = []
    with pytest.raises(Cancelled):
        run_finetune(
            config(tiny, method="frozen"),
            loaded=tiny,
            data=synthetic_data(),
            on_step=lambda step, m: seen.append(step),
            should_stop=lambda: len(seen) >= 2,
        )
    assert seen == [1, 2]


@pytest.mark.parametrize("metric", ["accuracy", "f1", "mcc"])
def test_scores_match_scikit_learn(tiny, metric):
    data = synthetic_data(metric=metric)
    built = build_model(config(tiny, method="frozen"), tiny, 2, "cpu")
    part = encode_part(tiny.tokenizer, data.parts["test"], 64, regression=False)
    predictions = predict(built.model, part, 0, torch.device("cpu"), 7, lambda: _null())
    assert set(np.unique(predictions)) <= {0, 1}
    truth = data.parts["test"]["label"].to_numpy()
    reference = {"accuracy": accuracy_score, "f1": f1_score, "mcc": matthews_corrcoef}[metric]
    assert score_part(metric, part, predictions, False) == pytest.approx(
        reference(truth, predictions.astype(int))
    )
    # the batches are sorted by length: predictions must come back in the input order
    logits = built.model.eval()(**part.batch(list(range(len(part))), 0, torch.device("cpu")))
    assert np.array_equal(predictions, logits.argmax(-1).numpy())


def test_regression_trains_with_mse_and_scores_spearman(tiny):
    data = synthetic_data(regression=True)
    result = run_finetune(config(tiny, method="full", lr=1e-3), loaded=tiny, data=data)
    assert result.metric == "spearman" and result.score is not None
    built = build_model(config(tiny, method="frozen"), tiny, 1, "cpu")
    part = encode_part(tiny.tokenizer, data.parts["test"], 64, regression=True)
    predictions = predict(built.model, part, 0, torch.device("cpu"), 16, lambda: _null())
    truth = data.parts["test"]["label"].to_numpy()
    assert score_part("spearman", part, predictions, True) == pytest.approx(
        spearmanr(truth, predictions).statistic
    )


def test_without_a_dev_part_the_last_state_is_reported(tiny):
    result = run_finetune(
        config(tiny, method="frozen"), loaded=tiny, data=synthetic_data(dev=False)
    )
    assert result.dev_score is None and result.curves["dev"] == [] and result.best_step == 6
    assert result.score is not None


def test_labels_outside_the_classes_are_refused(tiny):
    data = synthetic_data()
    data.parts["train"].loc[0, "label"] = 5
    with pytest.raises(ValueError, match="outside the class ids"):
        run_finetune(config(tiny, method="frozen"), loaded=tiny, data=data)


def test_layers_beyond_the_model_are_refused(tiny):
    with pytest.raises(ValueError, match="this model has 3 layers"):
        run_finetune(
            config(tiny, method="layers", layers=(1, 4, 4)), loaded=tiny, data=synthetic_data()
        )


class FakeRecorder:
    instances: ClassVar[list[FakeRecorder]] = []

    def __init__(self, folder, layers, every, dtype, family=None):
        self.folder, self.layers, self.every, self.dtype = folder, list(layers), every, dtype
        self.family = family
        self.steps: list[int] = []
        self.closed = False
        FakeRecorder.instances.append(self)

    def maybe_record(self, step: int) -> None:
        self.steps.append(step)

    def close(self) -> dict:
        self.closed = True
        return {"snapshots": len([s for s in self.steps if s % self.every == 0])}


def test_trajectory_recorder_is_driven_by_the_loop(tiny, tmp_path, monkeypatch):
    from analysis.finetune import engine

    monkeypatch.setattr(engine, "TrajectoryRecorder", FakeRecorder)
    FakeRecorder.instances.clear()
    cfg = config(tiny, method="full", trajectory_every=2, trajectory_dtype="float16")
    result = run_finetune(cfg, loaded=tiny, data=synthetic_data(), run_dir=tmp_path)
    (recorder,) = FakeRecorder.instances
    assert recorder.steps == list(range(0, 7)) and recorder.closed
    assert recorder.folder == tmp_path / "trajectory" and result.trajectory_dir == str(
        tmp_path / "trajectory"
    )
    assert len(recorder.layers) == 3 and recorder.every == 2 and recorder.dtype == "float16"
    assert recorder.family == "bert"
    assert result.trajectory == {"snapshots": 4}

    with pytest.raises(ValueError, match="run folder"):
        run_finetune(cfg, loaded=tiny, data=synthetic_data())


def _null():
    from contextlib import nullcontext

    return nullcontext()


def test_real_trajectory_recorder_writes_snapshots(tiny, tmp_path):
    cfg = config(tiny, method="layers", layers=(1, 2, 2), trajectory_every=3)
    result = run_finetune(cfg, loaded=tiny, data=synthetic_data(), run_dir=tmp_path)
    folder = tmp_path / "trajectory"
    assert result.trajectory_dir == str(folder) and (folder / "index.json").is_file()
    assert json.loads(json.dumps(result.to_dict()))["trajectory"] is not None


def test_the_classifier_trains_at_its_own_learning_rate(tiny):
    from analysis.finetune.engine import make_optimizer

    cfg = config(tiny, method="layers", layers=(2, 2, 2), lr=5e-5, classifier_lr=2e-3)
    built = build_model(cfg, tiny, 2, "cpu")
    optimizer, _ = make_optimizer(built.prepared, cfg)
    classifier = {id(p) for p in built.model.classifier.parameters()}
    for group in optimizer.param_groups:
        ids = {id(p) for p in group["params"]}
        assert ids <= classifier or not ids & classifier  # no group mixes body and classifier
        assert group["initial_lr"] == (2e-3 if ids <= classifier else 5e-5)
    ratios = {g["lr"] / g["initial_lr"] for g in optimizer.param_groups}
    assert len(ratios) == 1  # one schedule scales both rates
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert classifier <= grouped


def test_result_carries_its_test_predictions(tiny):
    from analysis.predictions import decode_predictions
    from analysis.scores import task_score

    data = synthetic_data()
    result = run_finetune(config(tiny, method="frozen"), loaded=tiny, data=data)
    preds, labels, fingerprint = decode_predictions(result.to_dict()["test_predictions"])
    assert len(preds) == result.n_test == len(labels)
    assert task_score("accuracy", labels, preds) == pytest.approx(result.score)
    other = run_finetune(config(tiny, method="bitfit", seed=1), loaded=tiny, data=data)
    assert decode_predictions(other.test_predictions)[2] == fingerprint  # same test part
