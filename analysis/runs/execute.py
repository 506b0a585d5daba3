"""Run one recorded fine-tuning run: the glue between the training engine and the runs database.

Used by the worker process (queued runs) and by ``python -m analysis finetune`` (foreground
runs). Every train step and dev evaluation is committed as it happens; the cancel flag is polled
between steps; the run ends as exactly one of done (with its result), cancelled or failed (with
a message), never half-written.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.progress import Cancelled
from analysis.runs.db import RunsDB

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig
    from analysis.models import LoadedModel

StepListener = Callable[[int, dict[str, float]], None]


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
    """``<cache root>/runs/<run_id>/``: where a run keeps files (trajectory snapshots)."""
    return db.path.parent / "runs" / run_id


def trajectory_folder(db: RunsDB, source: str) -> Path:
    """The trajectory folder ``source`` names: the folder itself, or the folder of a run of this
    database (an id, or a unique part of one) that recorded a trajectory."""
    folder = Path(source).expanduser()
    if (folder / "index.json").is_file():
        return folder
    return db.trajectory_dir(source)


def source_trajectory(db: RunsDB, cfg: FinetuneConfig) -> Path | None:
    """The trajectory of the subspace methods' source run (``cfg.subspace_from``), if any."""
    return trajectory_folder(db, cfg.subspace_from) if cfg.subspace_from else None


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
    """Train ``cfg`` as run ``run_id`` (already ``running``) and record how it ends.

    Returns the final status: ``done``, ``cancelled`` or ``failed``. KeyboardInterrupt (Ctrl-C in
    the foreground) records the run as cancelled and is re-raised; SystemExit (the worker being
    stopped) records it as failed and is re-raised.
    """
    from analysis.finetune.engine import run_finetune  # torch: only once a run starts

    last_poll = [0.0]
    last_progress = [0.0, ""]

    def should_stop() -> bool:
        now = time.monotonic()
        if now - last_poll[0] < cancel_poll_s:
            return False
        last_poll[0] = now
        return db.cancel_requested(run_id)

    def record_step(step: int, metrics: dict[str, float]) -> None:
        db.log_step(run_id, step, metrics, kind="train")
        if on_step is not None:
            on_step(step, metrics)

    def record_eval(step: int, metrics: dict[str, float]) -> None:
        db.log_step(run_id, step, metrics, kind="dev")

    def progress(fraction: float, message: str = "") -> None:
        if on_progress is not None:
            on_progress(fraction, message)
        now = time.monotonic()
        if now - last_progress[0] > 1.0 or fraction >= 1.0:
            last_progress[0], last_progress[1] = now, message
            db.set_progress(run_id, fraction, message)

    device = str(getattr(cfg, "device", None) or "")
    try:
        result = run_finetune(
            cfg,
            progress=progress,
            should_stop=should_stop,
            on_step=record_step,
            on_eval=record_eval,
            run_dir=run_dir_for(db, run_id),
            loaded=loaded,
            trajectory=source_trajectory(db, cfg),
        )
    except Cancelled:
        db.mark_cancelled(run_id, "cancelled by the user")
        return "cancelled"
    except KeyboardInterrupt:
        db.mark_cancelled(run_id, "interrupted (Ctrl-C)")
        raise
    except Exception as exc:
        if log is not None:
            log(traceback.format_exc())
        db.fail(run_id, describe_error(exc, device))
        _free_device_memory()
        return "failed"
    except BaseException as exc:
        db.fail(run_id, f"stopped: the process running it was terminated ({type(exc).__name__})")
        raise
    record = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    # The per-step curves are already in the steps table; keeping them out of the result keeps
    # listing many runs cheap.
    record.pop("curves", None)
    record["run_id"] = run_id
    if not db.finish(run_id, record):
        # Cancelled (or reaped) between the last step and the end: that state stands.
        return db.get_run(run_id)["status"]
    return "done"


def _free_device_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass
