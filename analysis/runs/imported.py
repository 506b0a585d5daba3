"""Runs trained outside tunescope, read into the runs database: a run folder that
``TunescopeCallback`` wrote (`analysis.export.tunescope_recipe.RunFolder`), or a finished
transformers Trainer output folder.

One reading of a run folder serves ``runs import``, the Runs page and tunescope's own callback,
which records into the database as it trains (`analysis.runs.callback`): `stored_config` makes the
run's config from what actually ran, `run_result` its result (the test score from its
predictions, by `analysis.scores.task_score`, as tunescope scores its own runs).

A run's config is what ran. With a recipe it is the recipe's config (method, options, layers…;
one a recipe of an earlier version wrote, under today's names: `analysis.runs.migration.today`),
else the method a spec recognises in what trained (`recognise`); then the Trainer's steps, batch
size, seed, learning rates, weight decay, warm-up, the evaluation interval, mixed precision and
the classifier's pooling. Imported runs carry ``origin`` in their config — ``kind`` (``trainer``:
recorded by the callback; ``trainer-import``: a Trainer output folder), the data fingerprint,
whether a recipe was applied, and since run folders: the model class (``model_class``:
``BertForSequenceClassification`` or ``TunescopeClassifier``), the precision and whether the best
evaluation's weights were restored — and the tag ``imported``. Run groups hash an imported
config as stored (`analysis.runs.record.run_setting`), so runs of different model classes never
share a group. A run recorded with ``join_groups`` (it reproduces tunescope's own loop) leaves
``origin`` out and joins the group of tunescope's runs of its setting: every run is recorded by
`analysis.runs.queue.RunQueue.enqueue`, which finds the group by the setting's key.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from analysis.export.tunescope_recipe import RUNS_FOLDER, CallbackError, read_run_folder
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_specs
from analysis.finetune.spec import TrainedModel, layer_of
from analysis.runs.db import RunsDB
from analysis.runs.migration import today

IMPORTED_TAG = "imported"
DEFAULT_METRIC = "accuracy"
ENDED_EARLY = "the training process ended before the run finished"


def database_error(path: Path, exc: BaseException) -> CallbackError:
    """One clear `CallbackError` for a database that refuses a write."""
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        why = "is locked by another process (another writer holds it): try again when it is done"
    elif "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        why = "is read-only: point the callback at a database you can write (cache=…)"
    else:
        why = f"cannot be written ({exc})"
    return CallbackError(f"The runs database {path} {why}.")


def recognise(trained: TrainedModel) -> tuple[str, dict[str, Any]]:
    """The tunescope method a model's set-up matches (each method's spec recognises its own:
    `analysis.finetune.spec.MethodSpec.recognise`) and what that implies for the config;
    ``("custom", {})`` when no method does."""
    for spec in method_specs():
        implied = spec.recognise(trained) if spec.recognise is not None else None
        if implied is not None:
            return spec.name, implied
    return "custom", {}


def stored_config(ran: dict[str, Any], trajectory_every: int | None = None) -> dict[str, Any]:
    """The config a run folder's ``ran`` is stored with (module docstring)."""
    model, optimizer, recipe = ran["model"], ran["optimizer"], ran.get("recipe")
    if recipe and recipe.get("config"):
        config = today(recipe["config"])
    else:
        rates = {"lr": optimizer["lr"], "classifier_lr": optimizer["classifier_lr"]}
        config = FinetuneConfig(**rates, weight_decay=optimizer["weight_decay"]).to_dict()
        peft = SimpleNamespace(peft_type=model["peft_type"]) if model.get("peft_type") else None
        names, trained = tuple(model["names"]), tuple(model["trained"])
        method, implied = recognise(TrainedModel(peft=peft, names=names, trained=trained))
        config.update(method=method, **implied)
    config["model"] = {**(config.get("model") or {}), "name": model["name"]}
    config["data"] = {**(config.get("data") or {}), "name": ran["data"]["name"]}
    config.update(steps=ran["steps"], batch_size=ran["batch_size"], seed=ran["seed"],
                  trajectory_every=trajectory_every, device=None)  # fmt: skip
    if ran.get("join_groups"):  # the recipe's own loop: its setting, so tunescope's run group
        return config
    evaluation = ran["evaluation"]
    config.update(
        lr=optimizer["lr"], classifier_lr=optimizer["classifier_lr"],
        weight_decay=optimizer["weight_decay"], warmup=optimizer["warmup"],
        pooling=model["pooling"], eval_every=evaluation["every"], n_eval=None,
        mixed_precision=ran["precision"] in ("bf16", "fp16"),
    )  # fmt: skip
    config["origin"] = {
        "kind": "trainer",
        "data_fingerprint": ran["data"]["fingerprint"],
        "recipe": recipe is not None,
        "model_class": model["class"],
        "precision": ran["precision"],
        "best_at_end": evaluation["best_at_end"],
    }
    return config


def run_result(run: dict[str, Any]) -> dict[str, Any]:
    """The result of a finished run folder (`read_run_folder`): the test score and predictions,
    the best dev score, what trains against the whole, the timings."""
    from analysis.predictions import encode_predictions, fingerprint_of_part
    from analysis.scores import task_score

    ran, timings, test = run["ran"], run["result"] or {}, run.get("test")
    model, recipe, metric = ran["model"], ran.get("recipe"), ran["metric"]
    score = predictions = None
    if test:
        dtype = np.float64 if test["regression"] else np.int64
        truth, pred = np.asarray(test["labels"], dtype), np.asarray(test["predictions"], dtype)
        score = task_score(metric, truth, pred)
        fingerprint = fingerprint_of_part(test["keys"], test["labels"])
        predictions = encode_predictions(pred, truth, fingerprint, test["regression"])
    n_params = recipe["n_params"] if recipe else model["n_params"]  # the uncut model's
    layers = [layer for name in model["trained"] if (layer := layer_of(name))]
    n_layers = model["n_layers"] or 0
    description = (recipe or {}).get("description") or "method recognised in what trains"
    return {
        "score": score if score is not None and math.isfinite(score) else None,
        "metric": metric,
        "dev_score": timings.get("best_dev"),
        "n_trainable": model["n_trainable"],
        "n_params": n_params,
        "share": model["n_trainable"] / n_params if n_params else None,
        "layers_forward": n_layers,
        "layers_backward": n_layers - min(layers) + 1 if layers else 0,
        "wall_s": timings.get("wall_s"),
        "step_time_s": timings.get("step_time_s"),
        "peak_mem_mb": timings.get("peak_mem_mb"),
        "seed": ran["seed"],
        "device": ran["device"],
        "best_step": timings.get("global_step"),
        "n_eval": timings.get("n_eval"),
        "description": f"a transformers Trainer run of {model['class']} ({description})",
        "test_predictions": predictions,
        "n_test": test["n"] if test else 0,
        "origin": "trainer",
        "run_folder_id": run["id"],
    }


def run_folders(folder: str | Path) -> list[Path]:
    """The run folders in ``folder``: itself, or those the callback made in it (a Trainer's
    ``output_dir``: ``tunescope-runs/<id>/``), oldest first."""
    folder = Path(folder).expanduser()
    if (folder / "run.json").is_file():
        return [folder]
    return sorted(p.parent for p in (folder / RUNS_FOLDER).glob("*/run.json"))


def import_folder(
    folder: str | Path,
    *,
    db: RunsDB | None = None,
    cache: Any = None,
    model_name: str | None = None,
    data_name: str | None = None,
    **trainer_folder: Any,
) -> list[str]:
    """Import what ``folder`` holds: its run folders (`run_folders`, each once: one imported
    already is skipped), else a Trainer output folder (`import_trainer_folder`, with
    ``trainer_folder``'s settings: metric, recipe, seed); returns the new run ids. A
    CallbackError (a ValueError) when it holds neither."""
    folder = Path(folder).expanduser()
    found = run_folders(folder)
    if not found:
        if (folder / "trainer_state.json").is_file():
            return [import_trainer_folder(folder, model_name=model_name, db=db, cache=cache,
                                          data_name=data_name or "custom", **trainer_folder)]  # fmt: skip
        raise CallbackError(
            f"{folder} holds no run folder (run.json, written by TunescopeCallback) and no "
            "trainer_state.json (a Trainer output folder)."
        )
    if trainer_folder:
        flags = ", ".join(sorted(trainer_folder))
        raise CallbackError(
            f"{flags}: a run folder says these itself; give them for a Trainer output folder only."
        )
    db = db if db is not None else _open_db(cache)
    done = _imported_ids(db)
    return [run_id for path in found
            if (run_id := import_run_folder(path, db=db, model_name=model_name,
                                            data_name=data_name, skip=done)) is not None]  # fmt: skip


def import_run_folder(
    folder: str | Path,
    *,
    db: RunsDB,
    model_name: str | None = None,
    data_name: str | None = None,
    skip: set[str] = frozenset(),
) -> str | None:
    """Record a run folder as a run (done with its result, or failed / cancelled with its
    steps) and return its id; None when its id is in ``skip`` (imported already)."""
    run = read_run_folder(folder)
    if run["id"] in skip:
        return None
    ran = run["ran"]
    if model_name:
        ran["model"]["name"] = model_name
    if data_name:
        ran["data"]["name"] = data_name
    try:
        run_id = db.enqueue(stored_config(ran), running_pid=os.getpid(), device=ran["device"])
        db.set_tags(run_id, [IMPORTED_TAG, *ran.get("tags", [])])
        if ran.get("note"):
            db.set_note(run_id, ran["note"])
        for entry in run["steps"]:
            values = {k: v for k, v in entry.items() if k not in ("step", "kind")}
            db.log_step(run_id, int(entry["step"]), values, kind=entry["kind"])
        if run["status"] == "done":
            db.finish(run_id, {**run_result(run), "imported_from": str(Path(folder).resolve())})
        elif run["status"] == "cancelled":
            db.mark_cancelled(run_id, run.get("error"))
        else:  # failed, or still "running": the process died without a word
            db.fail(run_id, run.get("error") or ENDED_EARLY)
    except (sqlite3.Error, OSError) as exc:
        raise database_error(db.path, exc) from None
    return run_id


def _imported_ids(db: RunsDB) -> set[str]:
    """The run folder ids of the runs ``db`` holds."""
    from analysis.runs.record import runs_of

    return {r.result["run_folder_id"] for r in runs_of(db.list_runs())
            if r.result and r.result.get("run_folder_id")}  # fmt: skip


def _open_db(cache: Any) -> RunsDB:
    from analysis.workspace import Workspace

    workspace = cache if isinstance(cache, Workspace) else (
        Workspace(cache) if cache is not None else Workspace.current()
    )  # fmt: skip
    try:
        return RunsDB(workspace)
    except (sqlite3.Error, OSError) as exc:
        raise database_error(workspace.runs_db, exc) from None


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
    cache: Any = None,
    db: RunsDB | None = None,
) -> str:
    """Record the Trainer output ``folder`` (its ``trainer_state.json``; ``test_results.json``
    when there is one) as a done run and return its id. Loss, learning-rate and eval curves
    come from ``log_history``; the test score from ``test_<metric>`` where the folder has it
    (``test_results.json`` / ``all_results.json``). The seed is the caller's: the Trainer's state
    file does not hold it. A Trainer folder does not say what ran (model class, precision…): a
    run folder does. The run goes into ``db``, else the runs database of ``cache`` (a cache
    folder or a `Workspace`; by default the current workspace's)."""
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
    recipe = read_recipe(recipe)
    extra = _json_or_empty(folder / "test_results.json") | _json_or_empty(
        folder / "all_results.json"
    )
    model_name = model_name or _model_of(folder) or str(folder)
    steps = int(state.get("max_steps") or state.get("global_step") or 0)
    if recipe is not None:
        config = today(recipe["provenance"]["config"])
    else:
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
        db = _open_db(cache)
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
        raise database_error(db.path, exc) from None
    return run_id


def read_recipe(recipe: dict[str, Any] | str | Path | None) -> dict[str, Any] | None:
    """A recipe given as a dict, a folder or its recipe.json (a CallbackError when unreadable)."""
    if recipe is None or isinstance(recipe, dict):
        return recipe
    path = Path(recipe)
    path = path / "recipe.json" if path.is_dir() else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CallbackError(f"Cannot read the recipe {path}: {exc}") from None


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
