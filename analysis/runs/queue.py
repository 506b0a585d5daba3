"""The queue: a run's life in the runs database (`RunQueue`, one half of
`analysis.runs.db.RunsDB`).

A run moves between states atomically (each move is one transaction of `RunsFile._write`):

    queued ──claim──▶ running ──finish──▶ done        (the only state that holds a result)
       │                 ├──fail───────▶ failed      (error message kept)
       └──cancel──▶ cancelled ◀──cancel──┘

While it runs, its process reports steps, progress and where it trains; a run whose process
died without a word is failed by `RunQueue.reap_dead`. `RunQueue.cancel_runs` cancels many runs
(a sweep's, a comparison's) in one transaction: a worker claiming at the same moment claims
before it (the run is running: asked to stop) or after it (the run is cancelled: never started).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.runs.record import setting_key
from analysis.runs.records import run_label
from analysis.runs.schema import RunNotFound, RunsFile, row_dict
from analysis.words import counted

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig

STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINAL_STATUSES = ("done", "failed", "cancelled")
STEP_KINDS = ("train", "dev")


def new_run_id(now: float | None = None) -> str:
    """``20261130-0812-ab12cd``: creation time (local, to the minute) and 6 random hex digits."""
    stamp = time.strftime("%Y%m%d-%H%M", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def _config_fields(cfg: FinetuneConfig | dict[str, Any]) -> dict[str, Any]:
    """The columns a run's config fills: model, data, method, label, seed, the full JSON and its
    setting's key (`analysis.runs.record.setting_key`)."""
    config = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    model = config.get("model") or {}
    data = config.get("data") or {}
    return {
        "model": model.get("name", str(model)) if isinstance(model, dict) else str(model),
        "data": data.get("name", str(data)) if isinstance(data, dict) else str(data),
        "method": str(config.get("method", "?")),
        "label": run_label(config),
        "seed": int(config.get("seed", 0)),
        "config_json": json.dumps(config, sort_keys=True, default=str),
        "setting_key": setting_key(config),
    }


@dataclass(frozen=True)
class Cancelled:
    """What one `RunQueue.cancel_runs` did, as run ids: the queued runs cancelled, the running
    ones asked to stop (each stops at its next step), the finished ones left alone."""

    cancelled: tuple[str, ...] = ()
    stopping: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()

    def describe(self) -> str:
        return (
            f"{counted(len(self.cancelled), 'queued run')} cancelled, {len(self.stopping)} running asked "
            f"to stop at their next step, {len(self.finished)} finished left alone"
        )


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists on this machine and is not a zombie."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            # "pid (comm) S …": the state letter follows the last ')'.
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class RunQueue(RunsFile):
    """Queue runs, hand them to workers, record what a running run reports and how it ends
    (module docstring)."""

    def enqueue(
        self,
        cfg: FinetuneConfig | dict[str, Any],
        sweep_id: str | None = None,
        family: str | None = None,
        *,
        running_pid: int | None = None,
        device: str | None = None,
    ) -> str:
        """Record a new run and return its id.

        ``cfg`` is a FinetuneConfig (anything with ``to_dict()``, or a plain dict); ``family``
        the layer family of the sweep strategy that queues it, if one does. The run is ``queued``
        for a worker, or — with ``running_pid`` — ``running`` already, owned by that process (a
        foreground run from the CLI; no worker can claim it). Its ``group_key`` is that of the
        runs with its setting key (the oldest's), else its setting key: a new seed of an old
        setting joins the old group.
        """
        fields = _config_fields(cfg)
        now = time.time()
        run_id = new_run_id(now)
        status = "queued" if running_pid is None else "running"
        with self._write() as conn:
            joined = conn.execute(
                "SELECT group_key FROM runs WHERE setting_key = ? ORDER BY created, rowid LIMIT 1",
                (fields["setting_key"],),
            ).fetchone()
            conn.execute(
                """INSERT INTO runs (id, created, started, status, worker_pid, device, model, data,
                       method, label, family, seed, sweep_id, config_json, setting_key, group_key)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    run_id,
                    now,
                    None if running_pid is None else now,
                    status,
                    running_pid,
                    device,
                    fields["model"],
                    fields["data"],
                    fields["method"],
                    fields["label"],
                    family,
                    fields["seed"],
                    sweep_id,
                    fields["config_json"],
                    fields["setting_key"],
                    joined[0] if joined else fields["setting_key"],
                ),
            )
        return run_id

    def claim_next(self, worker_pid: int, device: str | None = None) -> dict[str, Any] | None:
        """Atomically take the oldest queued run (status → running) and return it, or None."""
        with self._write() as conn:
            row = conn.execute(
                "SELECT id FROM runs WHERE status = 'queued' ORDER BY created, rowid LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                """UPDATE runs SET status = 'running', started = ?, worker_pid = ?, device = ?
                   WHERE id = ? AND status = 'queued'""",
                (time.time(), worker_pid, device, row[0]),
            )
            cursor = conn.execute("SELECT * FROM runs WHERE id = ?", (row[0],))
            return row_dict(cursor, cursor.fetchone())

    def log_step(
        self, run_id: str, step: int, values: dict[str, float], kind: str = "train"
    ) -> None:
        """Record one step's metrics (``{'loss': …, 'lr': …}``) in one transaction."""
        if kind not in STEP_KINDS:
            raise ValueError(f"Unknown step kind {kind!r}: choose one of {', '.join(STEP_KINDS)}.")
        now = time.time()
        rows = [
            (run_id, int(step), kind, str(key), _number(value), now)
            for key, value in values.items()
        ]
        with self._write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO steps (run_id, step, kind, key, value, t)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )

    def set_progress(self, run_id: str, fraction: float, message: str = "") -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET progress = ?, message = ? WHERE id = ?",
                (float(fraction), message, run_id),
            )

    def set_device(self, run_id: str, device: str) -> None:
        """Where a running run trains, once known (the Ray executor: ``ray:NODE cpu``)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET device = ? WHERE id = ? AND status = 'running'", (device, run_id)
            )

    def finish(self, run_id: str, result: dict[str, Any]) -> bool:
        """A completed run: store its result (status → done). False if it was not running."""
        payload = json.dumps(result, sort_keys=True, default=str)
        with self._write() as conn:
            cursor = conn.execute(
                """UPDATE runs SET status = 'done', result_json = ?, finished = ?, error = NULL,
                       progress = 1.0
                   WHERE id = ? AND status = 'running'""",
                (payload, time.time(), run_id),
            )
            return cursor.rowcount == 1

    def fail(self, run_id: str, error: str) -> bool:
        """A crashed run: status → failed with ``error``; never a result."""
        return self._end(run_id, "failed", error)

    def mark_cancelled(self, run_id: str, note: str | None = None) -> bool:
        """A stopped run: status → cancelled; never a result."""
        return self._end(run_id, "cancelled", note)

    def _end(self, run_id: str, status: str, error: str | None) -> bool:
        with self._write() as conn:
            cursor = conn.execute(
                """UPDATE runs SET status = ?, error = ?, finished = ?, result_json = NULL
                   WHERE id = ? AND status IN ('queued', 'running')""",
                (status, error, time.time(), run_id),
            )
            return cursor.rowcount == 1

    def request_cancel(self, run_id: str) -> str:
        """Cancel a run: a queued one at once, a running one by raising its flag (the process
        running it stops at its next step). Returns the run's status afterwards."""
        run_id = self.resolve_id(run_id)
        self.cancel_runs([run_id])
        with self._connect() as conn:
            return conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]

    def cancel_runs(
        self, run_ids: Sequence[str] = (), sweep_id: str | None = None, stop: bool = True
    ) -> Cancelled:
        """Cancel ``run_ids`` (each a full id or a unique part of one) and every run of sweep
        ``sweep_id``, in one transaction: the queued ones become cancelled, the running ones are
        asked to stop, the finished ones and their steps and results stay as they are; with
        ``stop``, the planned experiments those runs belong to take no more rounds
        (`analysis.runs.experiments`). A sweep id that names no run is a `RunNotFound`."""
        ids = [self.resolve_id(run_id) for run_id in run_ids]
        with self._write() as conn:
            statuses = dict(
                conn.execute(
                    f"SELECT id, status FROM runs WHERE id IN ({', '.join('?' * len(ids))})"
                    " ORDER BY created, rowid",
                    ids,
                ).fetchall()
            )
            if sweep_id is not None:
                sweep = conn.execute(
                    "SELECT id, status FROM runs WHERE sweep_id = ? ORDER BY created, rowid",
                    (sweep_id,),
                ).fetchall()
                if not sweep:
                    raise RunNotFound(
                        f"No run belongs to sweep {sweep_id!r} (the id said when its runs were "
                        "queued, such as sweep-20261130-081203)."
                    )
                statuses.update(sweep)
            queued = tuple(i for i, status in statuses.items() if status == "queued")
            running = tuple(i for i, status in statuses.items() if status == "running")
            now = time.time()
            conn.executemany(
                """UPDATE runs SET status = 'cancelled', finished = ?,
                       error = 'cancelled before start' WHERE id = ? AND status = 'queued'""",
                [(now, run_id) for run_id in queued],
            )
            conn.executemany(
                "UPDATE runs SET cancel_requested = 1 WHERE id = ? AND status = 'running'",
                [(run_id,) for run_id in running],
            )
            if stop and statuses:
                conn.execute(
                    "UPDATE experiments SET stopped = 1 WHERE id IN (SELECT DISTINCT sweep_id "
                    f"FROM runs WHERE id IN ({', '.join('?' * len(statuses))}))",
                    list(statuses),
                )
        finished = tuple(i for i in statuses if i not in queued and i not in running)
        return Cancelled(queued, running, finished)

    def cancel_requested(self, run_id: str) -> bool:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT cancel_requested, status FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
        return bool(row and (row[0] or row[1] == "cancelled"))

    def reap_dead(self, alive: Callable[[int | None], bool] = pid_alive) -> list[str]:
        """Runs left ``running`` by a process that no longer exists → failed ("worker died")."""
        with self._write() as conn:
            rows = conn.execute(
                "SELECT id, worker_pid FROM runs WHERE status = 'running'"
            ).fetchall()
            dead = [run_id for run_id, pid in rows if not alive(pid)]
            for run_id in dead:
                conn.execute(
                    """UPDATE runs SET status = 'failed', finished = ?, result_json = NULL,
                           error = 'worker died (the process running it ended without a result)'
                       WHERE id = ? AND status = 'running'""",
                    (time.time(), run_id),
                )
        return dead
