"""Bring a user's own ``transformers.Trainer`` runs into the runs database as they train.

`TunescopeCallback` is the exported recipe module's callback
(`analysis.export.tunescope_recipe.TunescopeCallback`: it writes a run folder, the record of what
actually ran) writing into tunescope's runs database as well, where tunescope is installed in the
training environment: ``Trainer(..., callbacks=[TunescopeCallback(...)])`` records a ``running``
run at ``on_train_begin``, every logged loss and learning rate (``on_log``), every evaluation
(``eval_<metric>`` as the dev curve), optionally trajectory snapshots every k steps
(`analysis.subspace.trajectory.TrajectoryRecorder`, the same format as tunescope's own runs, so the
Subspaces page reads them), and at ``on_train_end`` the result that ``runs import`` would read
from its run folder (`analysis.runs.imported.run_result`): its config and result are those of an
imported run folder, by the same code. The run folder is the run's own folder in the workspace
(``runs/<id>/``).

How it ends: ``done`` with its result; a crash of the training leaves the run ``failed`` with
every step it logged — use the callback as a context manager (``with TunescopeCallback(...) as
cb: trainer.train()``) or let the process end (an exit hook fails a run still running; a killed
process is reaped like a dead worker: ``RunsDB.reap_dead``); cancelling it on the Runs page stops
the Trainer at its next step and leaves it ``cancelled``. A read-only or locked database is a
`CallbackError` (a ValueError) with one clear message, raised when the callback is made or at
the first write.

`import_trainer_folder` (`analysis.runs.imported`) records a finished Trainer output folder.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from analysis.export import tunescope_recipe
from analysis.export.tunescope_recipe import CallbackError, count_trainable
from analysis.finetune.spec import TrainedModel
from analysis.runs.db import RunsDB
from analysis.runs.imported import (
    DEFAULT_METRIC,
    IMPORTED_TAG,
    database_error,
    import_trainer_folder,
    read_recipe,
    recognise,
    run_result,
    stored_config,
)
from analysis.workspace import Workspace

__all__ = ["IMPORTED_TAG", "CallbackError", "TunescopeCallback", "count_trainable",
           "import_trainer_folder", "infer_method", "open_db", "recognised"]  # fmt: skip


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
        raise database_error(workspace.runs_db, exc) from None


def recognised(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """The tunescope method a user's model is set up as (`analysis.runs.imported.recognise` of
    what trains, the PEFT config, the modules added) and what it implies for the run's config."""
    configs = getattr(model, "peft_config", None) or {}
    named = list(tunescope_recipe.encoder_of(model).named_parameters())
    trained = TrainedModel(
        peft=next(iter(configs.values()), None),
        names=tuple(n for n, _ in named),
        trained=tuple(n for n, p in named if p.requires_grad),
    )
    return recognise(trained)


def infer_method(model: nn.Module) -> str:
    """The tunescope method a model's set-up matches (`recognised`), ``custom`` when none."""
    return recognised(model)[0]


class TunescopeCallback(tunescope_recipe.TunescopeCallback):
    """Record a ``Trainer`` run in tunescope's runs database as it trains (module docstring).

    model_name / data_name: what the Runs page shows (a model folder or built-in name, a data
    set name); recipe, data_fingerprint, test_dataset (a ``datasets.Dataset``, a list of dicts or
    a tokenized dataset), test_texts, text_column, metric, join_groups: as the exported module's
    callback (`analysis.export.tunescope_recipe.TunescopeCallback`); trajectory_every: snapshot
    every encoder layer every k optimizer steps; cache: the cache folder (or `Workspace`) holding
    the database and the run's files (default: the current workspace, `Workspace.current`);
    tags / note: set on the run; lock_timeout_s: how long a write waits for a locked database.
    """

    def __init__(
        self,
        model_name: str,
        data_name: str = "custom",
        *,
        recipe: dict[str, Any] | str | Path | None = None,
        data_fingerprint: str | None = None,
        test_dataset: Any = None,
        test_texts: Sequence[str] | None = None,
        text_column: str = "text",
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
        super().__init__(
            None, str(model_name), data_name, recipe=read_recipe(recipe),
            test_dataset=test_dataset, test_texts=test_texts, text_column=text_column,
            metric=metric, data_fingerprint=data_fingerprint, join_groups=join_groups,
            tags=tags, note=note,
        )  # fmt: skip
        self.trajectory_every, self.trajectory_dtype = trajectory_every, trajectory_dtype
        self.workspace = workspace_of(cache)
        self.db = open_db(self.workspace, lock_timeout_s)
        self._recorder = None
        self._trajectory = None
        self._memory = None
        self._cancelled = False

    def _db(self, call, *args, **kwargs):
        """A database write, with one clear message when the database refuses it."""
        try:
            return call(*args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise database_error(self.db.path, exc) from None

    # -- the exported callback's hooks: the database beside the run folder ----------------------
    def _open(self, args, ran: dict[str, Any]) -> Path:
        from analysis.runs.execute import RunRecorder

        config = stored_config(ran, trajectory_every=self.trajectory_every)
        self.run_id = self._db(
            self.db.enqueue, config, running_pid=os.getpid(), device=ran["device"]
        )
        self._db(self.db.set_tags, self.run_id, [IMPORTED_TAG, *self.tags])
        if self.note:
            self._db(self.db.set_note, self.run_id, self.note)
        self._recorder = RunRecorder(self.db, self.run_id)
        return self.workspace.run_folder(self.run_id)

    def _logged(self, step: int, kind: str, values: dict[str, float]) -> None:
        if kind == "train":
            self._db(self._recorder.step, step, values)
        else:
            self._db(self._recorder.eval, step, values)

    def _ended(self, status: str, error: str | None) -> None:
        trajectory_dir = self._trajectory.folder if self._trajectory is not None else None
        trajectory = self._trajectory.close() if self._trajectory is not None else None
        self._trajectory = None
        if self.run_id is None or self._recorder is None:
            return
        if status == "done":
            result = run_result(tunescope_recipe.read_run_folder(self.folder.path))
            result.update(trajectory_dir=str(trajectory_dir) if trajectory_dir else None,
                          trajectory=trajectory)  # fmt: skip
            self.status = self._db(self._recorder.done, result)
        elif status == "cancelled":
            self._db(self._recorder.cancelled, error or "cancelled by the user")
        else:
            self._db(self._recorder.failed, error)

    def _describe(self, exc: BaseException) -> str:
        from analysis.runs.execute import describe_error

        return describe_error(exc, self._device)

    def _memory_begin(self, device: str) -> None:
        from analysis.finetune.engine import PeakMemory

        self._memory = PeakMemory(torch.device(device))

    def _memory_peak(self) -> float | None:
        peak, self._memory = (self._memory.stop() if self._memory else None), None
        return peak

    # -- Trainer events ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        super().on_train_begin(args, state, control, model=model, **kwargs)
        if self.trajectory_every and model is not None:
            self._start_trajectory(model)
            self._trajectory.maybe_record(0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if self._memory is not None:
            self._memory.sample()
        if self._trajectory is not None:
            self._trajectory.maybe_record(state.global_step)
        if self._recorder is not None and state.max_steps:
            fraction = state.global_step / state.max_steps
            self._db(self._recorder.progress, fraction, f"Step {state.global_step}")
        if self.run_id is not None and self.db.cancel_requested(self.run_id):
            control.should_training_stop = True
            self._cancelled = True

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self._cancelled:
            self.fail("cancelled on the Runs page", status="cancelled")
            return
        super().on_train_end(args, state, control, model=model, **kwargs)

    def _start_trajectory(self, model: nn.Module) -> None:
        from analysis.models import check_family, encoder_layers
        from analysis.subspace.trajectory import TrajectoryRecorder

        encoder = tunescope_recipe.encoder_of(model)
        folder = self.workspace.run_folder(self.run_id) / "trajectory"
        self._trajectory = TrajectoryRecorder(
            folder,
            list(encoder_layers(encoder)),
            self.trajectory_every,
            self.trajectory_dtype,
            family=check_family(encoder.config),
        )
