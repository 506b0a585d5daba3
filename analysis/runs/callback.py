"""Bring a user's own ``transformers.Trainer`` runs into the runs database.

`TunescopeCallback` is a ``TrainerCallback``: ``Trainer(..., callbacks=[TunescopeCallback(...)])``
records the run as it trains — a ``running`` run at ``on_train_begin`` (its config: model, data,
its fingerprint when given, the method from the recipe or inferred from what trains, the Trainer's
budget and learning rates), every logged loss and learning rate (``on_log``), every evaluation
(``eval_<metric>`` as the dev curve), optionally trajectory snapshots every k steps
(`analysis.subspace.trajectory.TrajectoryRecorder`, the same format as tunescope's own runs, so
the Subspaces page reads them), and at ``on_train_end`` the result: the test score and per-example
test predictions when a test set is given, device, wall-clock, step time, peak memory,
trainable / total parameters.

How it ends: ``done`` with its result; a crash of the training leaves the run ``failed`` with
every step it logged — use the callback as a context manager (``with TunescopeCallback(...) as
cb: trainer.train()``) or let the process end (an exit hook fails a run still running; a killed
process is reaped like a dead worker: ``RunsDB.reap_dead``). A read-only or locked database is a
`CallbackError` (a ValueError) with one clear message, raised when the callback is made or at
the first write.

`import_trainer_folder(folder, …)` records a finished Trainer output folder (its
``trainer_state.json``: loss and eval curves, the best metric) as a ``done`` run.

Runs recorded here carry ``origin`` in their config (``trainer`` or ``trainer-import``) and the
tag ``imported``: `analysis.runs.results.run_setting` keeps such configs as stored, so they join a
run group only with runs of the very same settings (and origin). ``join_groups=True`` leaves
``origin`` out of the config (still in the result and the tag): the run then joins tunescope's own
group of the same setting, and so the Paper check's claims. All database writes go through
`RunsDB`'s public methods and `analysis.runs.execute.RunRecorder`.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import TrainerCallback

from analysis.runs.db import RunsDB
from analysis.workspace import Workspace

IMPORTED_TAG = "imported"
DEFAULT_METRIC = "accuracy"


class CallbackError(ValueError):
    """The runs database cannot take this run (read-only, locked, missing), or bad input."""


def _database_error(path: Path, exc: BaseException) -> CallbackError:
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        why = "is locked by another process (another writer holds it): try again when it is done"
    elif "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        why = "is read-only: point the callback at a database you can write (cache=…)"
    else:
        why = f"cannot be written ({exc})"
    return CallbackError(f"The runs database {path} {why}.")


def workspace_of(cache: str | Path | Workspace | None) -> Workspace:
    """The workspace of ``cache`` (a cache folder or a `Workspace`); None: the current one
    (`Workspace.current`: the entry point's, else the environment's)."""
    if isinstance(cache, Workspace):
        return cache
    return Workspace(cache) if cache is not None else Workspace.current()


def open_db(cache: str | Path | Workspace | None = None, lock_timeout_s: float = 5.0) -> RunsDB:
    """The runs database of ``cache`` (`workspace_of`), or a `CallbackError`."""
    workspace = workspace_of(cache)
    try:
        db = RunsDB(workspace)
        db.pragma(f"busy_timeout = {int(lock_timeout_s * 1000)}")
        return db
    except (sqlite3.Error, OSError) as exc:
        raise _database_error(workspace.runs_db, exc) from None


# -- what trains -----------------------------------------------------------------------------------


def _encoder(model: nn.Module) -> nn.Module:
    if hasattr(model, "peft_config"):
        model = model.get_base_model()
    inner = getattr(model, "encoder", None)
    if inner is not None and hasattr(inner, "config") and not hasattr(model, "base_model_prefix"):
        return inner  # a TunescopeClassifier: .encoder is the transformers model
    return getattr(model, "base_model", model)


def recognised(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """The tunescope method a user's model is set up as (each method's spec says how it
    recognises its own: `analysis.finetune.spec.MethodSpec.recognise`: what trains, the PEFT
    config, the modules added) and what that implies for the run's config; ``("custom", {})``
    when no method recognises it."""
    from analysis.finetune.registry import method_specs
    from analysis.finetune.spec import TrainedModel

    configs = getattr(model, "peft_config", None) or {}
    named = list(_encoder(model).named_parameters())
    trained = TrainedModel(
        peft=next(iter(configs.values()), None),
        names=tuple(n for n, _ in named),
        trained=tuple(n for n, p in named if p.requires_grad),
    )
    for spec in method_specs():
        implied = spec.recognise(trained) if spec.recognise is not None else None
        if implied is not None:
            return spec.name, implied
    return "custom", {}


def infer_method(model: nn.Module) -> str:
    """The tunescope method a model's set-up matches (`recognised`), ``custom`` when none."""
    return recognised(model)[0]


def trained_layers(model: nn.Module) -> tuple[int, ...]:
    from analysis.models import encoder_layers

    blocks = encoder_layers(_encoder(model))
    return tuple(
        i + 1 for i, b in enumerate(blocks) if any(p.requires_grad for p in b.parameters())
    )


def count_trainable(model: nn.Module, recipe: dict[str, Any] | None) -> int:
    """Entries that train: the recipe's count when it was applied (head rows are part tensors),
    else every tensor with ``requires_grad``."""
    whole = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if recipe and recipe["train"].get("masks") and recipe["method"] == "heads":
        return int(recipe["train"]["n_trainable"])
    return whole


# -- the callback ----------------------------------------------------------------------------------


class TunescopeCallback(TrainerCallback):
    """Record a ``Trainer`` run in tunescope's runs database (module docstring).

    model_name / data_name: what the Runs page shows (a model folder or built-in name, a data
    set name); recipe: the applied recipe (a dict, or its folder / recipe.json), whose config,
    method and trainable count the run takes; data_fingerprint: any string that identifies the
    training data (runs on other data never group together); test_dataset: tokenized examples
    (dicts with ``labels``) scored at the end, with ``test_texts`` making their fingerprint the one
    tunescope's runs use, so `runs compare` pairs them example by example; metric: the task
    score (``accuracy``, ``f1``, ``mcc``, ``spearman``…) of the test set and of ``eval_<metric>``;
    trajectory_every: snapshot every encoder layer every k optimizer steps; cache: the cache
    folder (or `Workspace`) holding the database and the run's files (default: the current
    workspace, `Workspace.current`); tags / note: set on the run;
    join_groups: leave ``origin`` out of the config, so the run joins the run group (and the
    Paper check's claims) of tunescope runs of the very same setting — for a run that reproduces
    tunescope's loop (`TunescopeClassifier`, the recipe's optimizer, batches and seed); it is still
    tagged ``imported`` and its result says ``origin``.
    """

    def __init__(
        self,
        model_name: str,
        data_name: str = "custom",
        *,
        recipe: dict[str, Any] | str | Path | None = None,
        data_fingerprint: str | None = None,
        test_dataset: Sequence[dict[str, Any]] | None = None,
        test_texts: Sequence[str] | None = None,
        metric: str = DEFAULT_METRIC,
        trajectory_every: int | None = None,
        trajectory_dtype: str = "float32",
        cache: str | Path | Workspace | None = None,
        tags: Sequence[str] = (),
        note: str = "",
        lock_timeout_s: float = 5.0,
        join_groups: bool = False,
    ) -> None:
        if trajectory_every is not None and (
            not isinstance(trajectory_every, int) or trajectory_every < 1
        ):
            raise CallbackError("trajectory_every must be a positive whole number of steps.")
        if (
            test_texts is not None
            and test_dataset is not None
            and len(test_texts) != len(test_dataset)
        ):
            raise CallbackError("test_texts must hold one text per test example.")
        self.model_name, self.data_name = str(model_name), str(data_name)
        self.recipe = _read_recipe(recipe)
        self.data_fingerprint = data_fingerprint
        self.test_dataset, self.test_texts = test_dataset, test_texts
        self.metric = metric
        self.trajectory_every, self.trajectory_dtype = trajectory_every, trajectory_dtype
        self.tags, self.note = tuple(tags), note
        self.join_groups = bool(join_groups)
        self.workspace = workspace_of(cache)
        self.db = open_db(self.workspace, lock_timeout_s)
        self.run_id: str | None = None
        self.status: str | None = None
        self._recorder = None
        self._trajectory = None
        self._memory = None
        self._start = 0.0
        self._step_start: float | None = None
        self._step_times: list[float] = []
        self._best_dev: float | None = None
        self._device = "cpu"
        self._crash: BaseException | None = None

    # -- database writes, each with one clear message on failure --------------------------------
    def _db(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise _database_error(self.db.path, exc) from None

    # -- context manager: a crash inside marks the run failed ------------------------------------
    def __enter__(self) -> TunescopeCallback:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None:
            self.fail(exc)
        return False

    def fail(self, exc: BaseException | str) -> None:
        """Mark the run failed (its logged steps stay) unless it already ended."""
        if self.run_id is None or self.status is not None:
            return
        from analysis.runs.execute import describe_error

        message = exc if isinstance(exc, str) else describe_error(exc, self._device)
        self._close_trajectory()
        self._stop_memory()
        self.status = "failed"
        self._stop_watching()
        self._db(self.db.fail, self.run_id, message)

    def _at_exit(self) -> None:
        why = "the training process ended before the run finished"
        if self._crash is not None:
            from analysis.runs.execute import describe_error

            why += f" ({describe_error(self._crash, self._device)})"
        self.fail(why)

    def _watch_crash(self) -> None:
        """Remember an uncaught exception (the process is ending) for the exit hook's message."""
        previous = sys.excepthook

        def hook(kind, value, tb):
            self._crash = value
            previous(kind, value, tb)

        self._previous_hook = previous
        sys.excepthook = hook

    def _stop_watching(self) -> None:
        atexit.unregister(self._at_exit)
        if getattr(self, "_previous_hook", None) is not None:
            sys.excepthook, self._previous_hook = self._previous_hook, None

    # -- Trainer events ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from analysis.finetune.engine import PeakMemory
        from analysis.runs.execute import RunRecorder

        config = self._config(args, state, model)
        self._device = str(args.device)
        self.run_id = self._db(
            self.db.enqueue, config, running_pid=os.getpid(), device=self._device
        )
        self._db(self.db.set_tags, self.run_id, [IMPORTED_TAG, *self.tags])
        if self.note:
            self._db(self.db.set_note, self.run_id, self.note)
        self._recorder = RunRecorder(self.db, self.run_id)
        atexit.register(self._at_exit)
        self._watch_crash()
        self._start = time.perf_counter()
        self._memory = PeakMemory(torch.device(self._device))
        if self.trajectory_every and model is not None:
            self._start_trajectory(model)
            self._trajectory.maybe_record(0)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self._step_start is not None:
            self._step_times.append(time.perf_counter() - self._step_start)
        if self._memory is not None:
            self._memory.sample()
        if self._trajectory is not None:
            self._trajectory.maybe_record(state.global_step)
        if state.max_steps:
            fraction = state.global_step / state.max_steps
            self._db(self._recorder.progress, fraction, f"Step {state.global_step}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or self._recorder is None:
            return
        step = int(state.global_step)
        train = {}
        if "loss" in logs:
            train["loss"] = float(logs["loss"])
        if "learning_rate" in logs:
            train["lr"] = float(logs["learning_rate"])
        if "grad_norm" in logs:
            train["grad_norm"] = float(logs["grad_norm"])
        if train:
            train["elapsed_s"] = time.perf_counter() - self._start
            self._db(self._recorder.step, step, train)
        dev = {}
        if f"eval_{self.metric}" in logs:
            dev["dev"] = float(logs[f"eval_{self.metric}"])
            if self._best_dev is None or dev["dev"] > self._best_dev:
                self._best_dev = dev["dev"]
        if "eval_loss" in logs:
            dev["loss"] = float(logs["eval_loss"])
        if dev:
            self._db(self._recorder.eval, step, dev)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.run_id is None or self.status is not None:
            return
        try:
            result = self._result(args, state, model, kwargs)
        except Exception as exc:
            self.fail(exc)
            raise
        self._stop_watching()
        self.status = self._db(self._recorder.done, result)

    # -- pieces -------------------------------------------------------------------------------------
    def _config(self, args, state, model) -> dict[str, Any]:
        from analysis.finetune.config import FinetuneConfig

        if self.recipe is not None:  # the optimizer's settings are the recipe's (make_optimizer)
            config = dict(self.recipe["provenance"]["config"])
        else:  # one AdamW over every parameter: the classifier trains at the body's rate
            lr = float(args.learning_rate)
            config = FinetuneConfig(
                lr=lr, classifier_lr=lr, weight_decay=float(args.weight_decay)
            ).to_dict()
            method, implied = recognised(model) if model is not None else ("custom", {})
            config.update(method=method, **implied)
        config["model"] = {**(config.get("model") or {}), "name": self.model_name}
        config["data"] = {**(config.get("data") or {}), "name": self.data_name}
        config.update(
            steps=int(state.max_steps or args.max_steps or 0),
            batch_size=int(args.per_device_train_batch_size * args.gradient_accumulation_steps),
            seed=int(args.seed),
            trajectory_every=self.trajectory_every,
            device=None,
        )
        if not self.join_groups:
            config["origin"] = {
                "kind": "trainer",
                "data_fingerprint": self.data_fingerprint,
                "recipe": bool(self.recipe),
            }
        return config

    def _start_trajectory(self, model: nn.Module) -> None:
        from analysis.models import check_family, encoder_layers
        from analysis.subspace.trajectory import TrajectoryRecorder

        encoder = _encoder(model)
        folder = self.workspace.run_folder(self.run_id) / "trajectory"
        self._trajectory = TrajectoryRecorder(
            folder,
            list(encoder_layers(encoder)),
            self.trajectory_every,
            self.trajectory_dtype,
            family=check_family(encoder.config),
        )

    def _close_trajectory(self) -> dict[str, Any] | None:
        if self._trajectory is None:
            return None
        meta = self._trajectory.close()
        self._trajectory = None
        return meta

    def _stop_memory(self) -> float:
        if self._memory is None:
            return 0.0
        peak = self._memory.stop()
        self._memory = None
        return peak

    def _result(self, args, state, model, kwargs) -> dict[str, Any]:
        from analysis.models import encoder_layers

        trajectory_dir = None
        if self._trajectory is not None:
            trajectory_dir = str(self._trajectory.folder)
        trajectory = self._close_trajectory()
        peak = self._stop_memory()
        score, predictions = (None, None)
        if self.test_dataset is not None and model is not None:
            score, predictions = self._score_test(model, kwargs)
        n_params = sum(p.numel() for p in model.parameters()) if model is not None else 0
        if self.recipe is not None:  # the uncut model, as tunescope counts it
            n_params = int(self.recipe["train"]["n_params"])
        n_trainable = count_trainable(model, self.recipe) if model is not None else 0
        n_layers = len(encoder_layers(_encoder(model))) if model is not None else 0
        layers = trained_layers(model) if model is not None else ()
        timed = self._step_times[1:] if len(self._step_times) > 1 else self._step_times
        return {
            "score": score,
            "metric": self.metric,
            "dev_score": self._best_dev,
            "n_trainable": n_trainable,
            "n_params": n_params,
            "share": n_trainable / n_params if n_params else None,
            "layers_forward": n_layers,
            "layers_backward": (n_layers - min(layers) + 1) if layers else 0,
            "wall_s": time.perf_counter() - self._start,
            "step_time_s": float(np.mean(timed)) if timed else None,
            "peak_mem_mb": peak,
            "seed": int(args.seed),
            "device": self._device,
            "best_step": int(state.global_step),
            "description": f"a transformers Trainer run recorded by TunescopeCallback "
            f"({(self.recipe or {}).get('description') or 'method inferred from what trains'})",
            "trajectory_dir": trajectory_dir,
            "trajectory": trajectory,
            "test_predictions": predictions,
            "n_test": len(self.test_dataset) if self.test_dataset is not None else 0,
            "origin": "trainer",
        }

    def _score_test(self, model: nn.Module, kwargs) -> tuple[float | None, dict | None]:
        from analysis.predictions import encode_predictions, fingerprint_of_part
        from analysis.scores import task_score

        collate = _collator(kwargs.get("processing_class") or kwargs.get("tokenizer"))
        labels = np.asarray([_label_of(row) for row in self.test_dataset])
        regression = self.metric in ("spearman", "pearson")
        out = []
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        with torch.inference_mode():
            for start in range(0, len(self.test_dataset), 32):
                rows = [
                    {k: v for k, v in row.items() if k not in ("labels", "label")}
                    for row in self.test_dataset[start : start + 32]
                ]
                batch = {k: v.to(device) for k, v in collate(rows).items()}
                logits = _logits(model(**batch)).float()
                out.append(logits[:, 0] if regression else logits.argmax(dim=-1))
        model.train(was_training)
        predictions = torch.cat(out).cpu().numpy().astype(np.float64)
        truth = labels if regression else labels.astype(np.int64)
        pred = predictions if regression else predictions.astype(np.int64)
        score = task_score(self.metric, truth, pred)
        texts = self.test_texts or [f"#{i}" for i in range(len(labels))]
        fingerprint = fingerprint_of_part(list(texts), labels)
        record = encode_predictions(predictions, labels, fingerprint, regression)
        return (score if math.isfinite(score) else None), record


def _collator(tokenizer):
    if tokenizer is None:
        raise CallbackError(
            "Scoring the test set needs the Trainer's processing_class (tokenizer)."
        )
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer)


def _label_of(row: dict[str, Any]) -> float:
    value = row.get("labels", row.get("label"))
    if value is None:
        raise CallbackError("Every test example needs its label ('labels' or 'label').")
    return float(value)


def _logits(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def _read_recipe(recipe) -> dict[str, Any] | None:
    if recipe is None or isinstance(recipe, dict):
        return recipe
    path = Path(recipe)
    path = path / "recipe.json" if path.is_dir() else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CallbackError(f"Cannot read the recipe {path}: {exc}") from None


# -- a finished Trainer output folder --------------------------------------------------------------


def import_trainer_folder(
    folder: str | Path,
    *,
    model_name: str | None = None,
    data_name: str = "custom",
    metric: str = DEFAULT_METRIC,
    recipe: dict[str, Any] | str | Path | None = None,
    data_fingerprint: str | None = None,
    seed: int = 0,
    cache: str | Path | Workspace | None = None,
    db: RunsDB | None = None,
) -> str:
    """Record the Trainer output ``folder`` (its ``trainer_state.json``; ``test_results.json``
    when there is one) as a done run and return its id. Loss, learning-rate and eval curves
    come from ``log_history``; the test score from ``test_<metric>`` where the folder has it
    (``test_results.json`` / ``all_results.json``). The seed is the caller's: the Trainer's state
    file does not hold it. The run goes into ``db``, else the runs database of ``cache``
    (`workspace_of`: by default the current workspace's)."""
    folder = Path(folder).expanduser()
    state_file = folder / "trainer_state.json"
    if not state_file.is_file():
        raise CallbackError(
            f"{folder} holds no trainer_state.json: give a Trainer output folder (or one of its "
            "checkpoint-N folders)."
        )
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        history = list(state["log_history"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CallbackError(f"{state_file} is not a Trainer state file ({exc}).") from None
    recipe = _read_recipe(recipe)
    extra = _json_or_empty(folder / "test_results.json") | _json_or_empty(
        folder / "all_results.json"
    )
    model_name = model_name or _model_of(folder) or str(folder)
    steps = int(state.get("max_steps") or state.get("global_step") or 0)
    if recipe is not None:
        config = dict(recipe["provenance"]["config"])
    else:
        from analysis.finetune.config import FinetuneConfig

        config = FinetuneConfig().to_dict()
        config["method"] = "custom"
    config["model"] = {**(config.get("model") or {}), "name": model_name}
    config["data"] = {**(config.get("data") or {}), "name": data_name}
    config.update(steps=steps, seed=int(seed), device=None)
    if state.get("train_batch_size"):
        config["batch_size"] = int(state["train_batch_size"])
    config["origin"] = {
        "kind": "trainer-import",
        "data_fingerprint": data_fingerprint,
        "recipe": bool(recipe),
    }
    if db is None:
        db = open_db(cache)
    try:
        run_id = db.enqueue(config, running_pid=os.getpid())
        db.set_tags(run_id, [IMPORTED_TAG])
        dev_scores = []
        wall = None
        for entry in history:
            step = int(entry.get("step", 0))
            train = {k2: float(entry[k]) for k, k2 in
                     (("loss", "loss"), ("learning_rate", "lr"), ("grad_norm", "grad_norm"))
                     if isinstance(entry.get(k), (int, float))}  # fmt: skip
            if train:
                db.log_step(run_id, step, train, kind="train")
            dev = {}
            if isinstance(entry.get(f"eval_{metric}"), (int, float)):
                dev["dev"] = float(entry[f"eval_{metric}"])
                dev_scores.append(dev["dev"])
            if isinstance(entry.get("eval_loss"), (int, float)):
                dev["loss"] = float(entry["eval_loss"])
            if dev:
                db.log_step(run_id, step, dev, kind="dev")
            if isinstance(entry.get("train_runtime"), (int, float)):
                wall = float(entry["train_runtime"])
        score = extra.get(f"test_{metric}")
        result = {
            "score": float(score) if isinstance(score, (int, float)) else None,
            "metric": metric,
            "dev_score": max(dev_scores) if dev_scores else None,
            "n_trainable": (recipe or {}).get("train", {}).get("n_trainable"),
            "n_params": (recipe or {}).get("train", {}).get("n_params"),
            "wall_s": wall,
            "step_time_s": wall / steps if wall and steps else None,
            "best_step": int(state.get("global_step") or steps),
            "seed": int(config.get("seed", 0)),
            "description": f"imported from the Trainer folder {folder}",
            "imported_from": str(folder.resolve()),
            "origin": "trainer-import",
        }
        if result["n_trainable"] and result["n_params"]:
            result["share"] = result["n_trainable"] / result["n_params"]
        db.finish(run_id, result)
    except (sqlite3.Error, OSError) as exc:
        raise _database_error(db.path, exc) from None
    return run_id


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _model_of(folder: Path) -> str | None:
    """The model a Trainer folder saved (its config's name_or_path), if any."""
    config = _json_or_empty(folder / "config.json")
    return config.get("_name_or_path") or None
