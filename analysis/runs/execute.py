"""Run one recorded fine-tuning run: the glue between the training engine and the runs database.

Used by the worker process (queued runs) and by ``python -m tunescope finetune`` (foreground
runs); the Ray executor records through the same `RunRecorder`. Every train step and dev
evaluation is committed as it happens; the cancel flag is polled between steps; the run ends as
exactly one of done (with its result), cancelled or failed (with a message), never half-written.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.progress import Cancelled
from analysis.runs.db import RunsDB

if TYPE_CHECKING:
    from analysis.config import ModelSpec
    from analysis.finetune.config import FinetuneConfig
    from analysis.models import LoadedModel

StepListener = Callable[[int, dict[str, float]], None]


class ModelCache:
    """Keeps the last loaded model, so a sweep on one model loads it once per process."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.loaded: LoadedModel | None = None

    def get(self, spec: ModelSpec, device: str) -> LoadedModel:
        key = (spec, device)
        if key != self.key:
            from analysis.models import load_model  # torch: only once a run starts

            self.loaded = None  # let the old model go before the new one loads
            self.loaded = load_model(spec, device=device)
            self.key = key
        return self.loaded


def describe_error(exc: BaseException, device: str | None = None) -> str:
    """One clear line for the runs table: out-of-memory gets advice, anything else its type."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    if isinstance(exc, MemoryError) or "out of memory" in text.lower() or "OutOfMemory" in name:
        where = f" on {device}" if device else ""
        return (
            f"out of memory{where}: lower the batch size or max length, or train fewer layers"
            + (f" ({text[:160]})" if text else "")
        )
    return f"{name}: {text}" if text else name


def run_dir_for(db: RunsDB, run_id: str) -> Path:
    """Where run ``run_id`` of ``db`` keeps its files (`analysis.workspace.Workspace.run_folder`)."""
    return db.workspace.run_folder(run_id)


def trajectory_folder(db: RunsDB, source: str) -> Path:
    """The trajectory folder ``source`` names: the folder itself, or the folder of a run of this
    database (an id, or a unique part of one) that recorded a trajectory."""
    folder = Path(source).expanduser()
    if (folder / "index.json").is_file():
        return folder
    return db.trajectory_dir(source)


def source_trajectory(db: RunsDB, cfg: FinetuneConfig) -> Path | None:
    """The trajectory of the subspace methods' source run (``cfg.option("run")``), if any."""
    return trajectory_folder(db, cfg.option("run")) if cfg.option("run") else None


class RunRecorder:
    """Writes what one running run reports into the runs database, and how it ends.

    Shared by both executors: `execute_run` calls it from the training loop's callbacks in this
    process; the Ray executor (`analysis.runs.ray_executor`) calls it with the events a run on a
    Ray node streams back. So the database sees the same writes either way: every train step and
    dev score committed as it arrives, progress at most once a second, and exactly one ending —
    done (with its result), cancelled or failed (with a message), never a result otherwise.
    """

    def __init__(
        self,
        db: RunsDB,
        run_id: str,
        *,
        on_step: StepListener | None = None,
        on_progress: Callable[[float, str], None] | None = None,
        progress_every_s: float = 1.0,
    ) -> None:
        self.db, self.run_id = db, run_id
        self.on_step, self.on_progress = on_step, on_progress
        self.progress_every_s = progress_every_s
        self._last_progress = float("-inf")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.db.log_step(self.run_id, step, metrics, kind="train")
        if self.on_step is not None:
            self.on_step(step, metrics)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.db.log_step(self.run_id, step, metrics, kind="dev")

    def progress(self, fraction: float, message: str = "") -> None:
        if self.on_progress is not None:
            self.on_progress(fraction, message)
        now = time.monotonic()
        if now - self._last_progress > self.progress_every_s or fraction >= 1.0:
            self._last_progress = now
            self.db.set_progress(self.run_id, fraction, message)

    def done(self, result: dict[str, Any]) -> str:
        """Store the result of a completed run; returns the run's final status."""
        record = dict(result)
        # The per-step curves are already in the steps table; keeping them out of the result
        # keeps listing many runs cheap.
        record.pop("curves", None)
        record["run_id"] = self.run_id
        if not self.db.finish(self.run_id, record):
            # Cancelled (or reaped) between the last step and the end: that state stands.
            return self.db.get_run(self.run_id)["status"]
        # A planned experiment's next round, whoever is watching (analysis.runs.planner).
        from analysis.runs.planner import advance

        advance(self.db, (self.db.get_run(self.run_id) or {}).get("sweep_id"))
        return "done"

    def failed(self, error: str) -> str:
        self._closing_note("failed")
        self.db.fail(self.run_id, error)
        return "failed"

    def cancelled(self, note: str = "cancelled by the user") -> str:
        self._closing_note("cancelled")
        self.db.mark_cancelled(self.run_id, note)
        return "cancelled"

    def _closing_note(self, what: str) -> None:
        """The progress text of a run that ends early says where it ended ("failed at step
        18"), not the last note before that ("Step 13/120")."""
        run = self.db.get_run(self.run_id)
        if run is None or run["status"] not in ("queued", "running"):
            return
        last = self.db.latest_steps([self.run_id])
        where = f"at step {int(last['step'].iloc[0])}" if not last.empty else "before step 1"
        self.db.set_progress(self.run_id, float(run["progress"] or 0.0), f"{what} {where}")


def execute_run(
    db: RunsDB,
    run_id: str,
    cfg: FinetuneConfig,
    *,
    loaded: LoadedModel | None = None,
    on_step: StepListener | None = None,
    on_progress: Callable[[float, str], None] | None = None,
    cancel_poll_s: float = 0.5,
    log: Callable[[str], None] | None = None,
) -> str:
    """Train ``cfg`` as run ``run_id`` (already ``running``) in this process and record how it
    ends.

    Returns the final status: ``done``, ``cancelled`` or ``failed``. KeyboardInterrupt (Ctrl-C in
    the foreground) records the run as cancelled and is re-raised; SystemExit (the worker being
    stopped) records it as failed and is re-raised.
    """
    from analysis.finetune.engine import run_finetune  # torch: only once a run starts

    recorder = RunRecorder(db, run_id, on_step=on_step, on_progress=on_progress)
    last_poll = [0.0]

    def should_stop() -> bool:
        now = time.monotonic()
        if now - last_poll[0] < cancel_poll_s:
            return False
        last_poll[0] = now
        return db.cancel_requested(run_id)

    device = str(getattr(cfg, "device", None) or "")
    try:
        result = run_finetune(
            cfg,
            progress=recorder.progress,
            should_stop=should_stop,
            on_step=recorder.step,
            on_eval=recorder.eval,
            run_dir=run_dir_for(db, run_id),
            loaded=loaded,
            trajectory=source_trajectory(db, cfg),
        )
    except Cancelled:
        return recorder.cancelled("cancelled by the user")
    except KeyboardInterrupt:
        recorder.cancelled("interrupted (Ctrl-C)")
        raise
    except Exception as exc:
        if log is not None:
            log(traceback.format_exc())
        _free_device_memory()
        return recorder.failed(describe_error(exc, device))
    except BaseException as exc:
        recorder.failed(f"stopped: the process running it was terminated ({type(exc).__name__})")
        raise
    return recorder.done(result.to_dict() if hasattr(result, "to_dict") else dict(result))


def _free_device_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass
