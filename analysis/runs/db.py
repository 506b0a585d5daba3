"""The runs database: every fine-tuning run and its per-step metrics, kept for good.

One embedded SQLite file, ``<cache root>/runs.sqlite``, shared by the app, the CLI and the
worker processes. Write-ahead logging (WAL) lets readers (the page polling every 2 s) run while
the worker writes; ``synchronous=NORMAL`` keeps a commit cheap without risking corruption (a
power cut may drop the last commits, a killed process loses nothing it committed).

Every write is one ``BEGIN IMMEDIATE … COMMIT`` transaction, so a run moves between states
atomically:

    queued ──claim──▶ running ──finish──▶ done        (the only state that holds a result)
       │                 ├──fail───────▶ failed      (error message kept)
       └──cancel──▶ cancelled ◀──cancel──┘

A CHECK constraint makes "a result exists only for a completed run" a property of the file, not
just of this code. The schema is versioned (``PRAGMA user_version`` plus a ``schema_version``
table); `migrate` upgrades an older file in place. Version 2 adds a free-text ``note`` per run
and a ``run_tags`` table (a run's tags, deleted with it).

Files a run owns live beside the database, under the cache root: ``runs/<id>/`` (what the run
wrote: its trajectory snapshots) and ``subspace/<id>/`` (the zero-weights files of the disable
experiment made from its trajectory). `RunsDB.delete_files` removes them, `RunsDB.delete_run`
the run too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.finetune.registry import method_names, method_spec
from analysis.finetune.spec import default_run_label
from analysis.finetune.stored import nested
from analysis.io import atomic_write_json, atomic_write_text, remove_folder
from analysis.runs.record import Run, source_run
from analysis.workspace import Workspace

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig


STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINAL_STATUSES = ("done", "failed", "cancelled")
STEP_KINDS = ("train", "dev")
TIME_COLUMNS = ("created", "started", "finished")  # stored as UNIX seconds, shown as UTC times
# Fields of a result lifted into columns of `list_runs` (the rest stays in result_json).
RESULT_COLUMNS = (
    "score",
    "metric",
    "dev_score",
    "n_trainable",
    "n_params",
    "share",
    "layers_forward",
    "layers_backward",
    "wall_s",
    "step_time_s",
    "peak_mem_mb",
)
RUN_COLUMNS = (
    "id",
    "created",
    "started",
    "finished",
    "status",
    "cancel_requested",
    "worker_pid",
    "device",
    "model",
    "data",
    "method",
    "label",
    "strategy",
    "seed",
    "sweep_id",
    "progress",
    "message",
    "error",
    "note",
)
MAX_NOTE_CHARS = 10_000
MAX_TAG_CHARS = 40
MAX_TAGS = 20

# Migration v → v+1 is MIGRATIONS[v]: a list of SQL statements run in one transaction.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            created REAL NOT NULL,
            started REAL,
            finished REAL,
            status TEXT NOT NULL
                CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            worker_pid INTEGER,
            device TEXT,
            model TEXT NOT NULL,
            data TEXT NOT NULL,
            method TEXT NOT NULL,
            label TEXT NOT NULL,
            strategy TEXT,
            seed INTEGER NOT NULL,
            sweep_id TEXT,
            config_json TEXT NOT NULL,
            result_json TEXT,
            error TEXT,
            progress REAL,
            message TEXT,
            CHECK (result_json IS NULL OR status = 'done')
        )""",
        "CREATE INDEX runs_by_status ON runs (status, created)",
        "CREATE INDEX runs_by_task ON runs (model, data, method)",
        """CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            step INTEGER NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('train', 'dev')),
            key TEXT NOT NULL,
            value REAL,
            t REAL NOT NULL,
            PRIMARY KEY (run_id, kind, key, step)
        ) WITHOUT ROWID""",
        """CREATE TABLE schema_version (
            version INTEGER PRIMARY KEY,
            applied REAL NOT NULL
        )""",
    ],
    # 2: a note and tags per run (the Runs page and `runs note` / `runs tag` edit them).
    [
        "ALTER TABLE runs ADD COLUMN note TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE run_tags (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            tag TEXT NOT NULL CHECK (length(tag) BETWEEN 1 AND 40),
            PRIMARY KEY (run_id, tag)
        ) WITHOUT ROWID""",
        "CREATE INDEX run_tags_by_tag ON run_tags (tag, run_id)",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


class RunNotFound(ValueError):
    """No run has this id (or the prefix matches none or several)."""


def db_path(root: Path | str | None = None) -> Path:
    """``<cache root>/runs.sqlite``; the root defaults to the current workspace's."""
    return (Workspace(root) if root is not None else Workspace.current()).runs_db


def run_folder(root: Path | str, run_id: str) -> Path:
    """``<cache root>/runs/<run id>/`` (`Workspace.run_folder`)."""
    return Workspace(root).run_folder(run_id)


def disable_folder(root: Path | str, run_id: str) -> Path:
    """``<cache root>/subspace/<run id>/`` (`Workspace.disable_folder`)."""
    return Workspace(root).disable_folder(run_id)


def parse_tags(tags: str | Sequence[str]) -> tuple[str, ...]:
    """Tags from ``"a, b"`` or ``["a", "b"]``: stripped, duplicates and empties dropped, in the
    order given; a tag longer than 40 characters or more than 20 tags is a ValueError."""
    pieces = tags.split(",") if isinstance(tags, str) else list(tags)
    out: list[str] = []
    for piece in pieces:
        tag = " ".join(str(piece).split())
        if not tag or tag in out:
            continue
        if "," in tag or len(tag) > MAX_TAG_CHARS:
            raise ValueError(
                f"A tag is a short word or phrase without commas, at most {MAX_TAG_CHARS} "
                f"characters (got {tag[:60]!r})."
            )
        out.append(tag)
    if len(out) > MAX_TAGS:
        raise ValueError(f"At most {MAX_TAGS} tags per run (got {len(out)}).")
    return tuple(out)


def new_run_id(now: float | None = None) -> str:
    """``20261130-0812-ab12cd``: creation time (local, to the minute) and 6 random hex digits."""
    stamp = time.strftime("%Y%m%d-%H%M", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def migrate(conn: sqlite3.Connection, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Bring the file up to ``len(migrations)``; returns the version it ended at.

    Each step runs in its own IMMEDIATE transaction and re-reads the version inside it, so two
    processes opening a fresh file at once migrate it exactly once.
    """
    target = len(migrations)
    while True:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > target:
            raise RuntimeError(
                f"The runs database has schema version {version}, newer than this code knows "
                f"({target}); update tunescope or use another cache folder."
            )
        if version == target:
            return version
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            if current == version:
                for statement in migrations[version]:
                    conn.execute(statement)
                conn.execute(
                    "INSERT OR REPLACE INTO schema_version (version, applied) VALUES (?, ?)",
                    (version + 1, time.time()),
                )
                conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


def _row_dict(cursor: sqlite3.Cursor, row: tuple) -> dict[str, Any]:
    return {col[0]: value for col, value in zip(cursor.description, row, strict=True)}


def _config_fields(cfg: FinetuneConfig | dict[str, Any]) -> dict[str, Any]:
    """The columns a run's config fills: model, data, method, label, seed and the full JSON."""
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
    }


def run_label(config: dict[str, Any]) -> str:
    """A short human name for what a run trains: ``(1, 3, 3)``, ``heads ×6 pagerank``,
    ``lora 3,4``, ``subspace of ab12cd``, ``full · zeroed zero-outliers``…

    It names what tells runs of one method apart (the head selector, the subspace's source and
    kind, a zero-weights file); settings such as steps or learning rates are not in it
    (`analysis.runs.results.summarise` adds those where two groups would share a label).
    """
    method = str(config.get("method", "?"))
    zero = config.get("zero_weights")
    zeroed = f" · zeroed {Path(str(zero)).stem}" if zero else ""
    label_of = method_spec(method).run_label if method in method_names() else default_run_label
    return label_of(nested(config)) + zeroed


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


class RunsDB:
    """The runs database at ``path`` (default: ``<cache root>/runs.sqlite``).

    Holds one connection, shared by the threads of a process under a lock (Streamlit runs
    scripts in threads). Keeping it open matters: closing the last connection to a WAL file
    checkpoints and fsyncs, which would make every small write cost tens of milliseconds.
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._conn: sqlite3.Connection | None = None
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            migrate(conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ---- connections -------------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None or self._pid != os.getpid():
                # (A forked child never reuses its parent's connection.)
                conn = sqlite3.connect(
                    self.path, timeout=30.0, isolation_level=None, check_same_thread=False
                )
                conn.execute("PRAGMA busy_timeout = 30000")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
                self._conn, self._pid = conn, os.getpid()
            yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: all of it commits, or none of it."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def pragma(self, name: str) -> Any:
        """One PRAGMA's value (``journal_mode``, ``user_version``, ``integrity_check``…)."""
        with self._connect() as conn:
            return conn.execute(f"PRAGMA {name}").fetchone()[0]

    # ---- writing ------------------------------------------------------------------------------
    def enqueue(
        self,
        cfg: FinetuneConfig | dict[str, Any],
        sweep_id: str | None = None,
        strategy: str | None = None,
        *,
        running_pid: int | None = None,
        device: str | None = None,
    ) -> str:
        """Record a new run and return its id.

        ``cfg`` is a FinetuneConfig (anything with ``to_dict()``, or a plain dict). The run is
        ``queued`` for a worker, or — with ``running_pid`` — ``running`` already, owned by that
        process (a foreground run from the CLI; no worker can claim it).
        """
        fields = _config_fields(cfg)
        now = time.time()
        run_id = new_run_id(now)
        status = "queued" if running_pid is None else "running"
        with self._write() as conn:
            conn.execute(
                """INSERT INTO runs (id, created, started, status, worker_pid, device, model, data,
                       method, label, strategy, seed, sweep_id, config_json)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
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
                    strategy,
                    fields["seed"],
                    sweep_id,
                    fields["config_json"],
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
            return _row_dict(cursor, cursor.fetchone())

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

    def set_note(self, run_id: str, note: str) -> None:
        """Replace a run's note (free text, at most 10,000 characters; "" clears it)."""
        run_id = self.resolve_id(run_id)
        note = str(note).strip()
        if len(note) > MAX_NOTE_CHARS:
            raise ValueError(
                f"A note holds at most {MAX_NOTE_CHARS:,} characters (got {len(note):,})."
            )
        with self._write() as conn:
            conn.execute("UPDATE runs SET note = ? WHERE id = ?", (note, run_id))

    def set_tags(self, run_id: str, tags: str | Sequence[str]) -> tuple[str, ...]:
        """Replace a run's tags (``"baseline, good"`` or a list; see `parse_tags`); returns them."""
        run_id = self.resolve_id(run_id)
        chosen = parse_tags(tags)
        with self._write() as conn:
            conn.execute("DELETE FROM run_tags WHERE run_id = ?", (run_id,))
            conn.executemany(
                "INSERT INTO run_tags (run_id, tag) VALUES (?, ?)", [(run_id, t) for t in chosen]
            )
        return chosen

    def run_files(self, run_id: str) -> list[Path]:
        """The folders run ``run_id`` owns that exist: its trajectory (``runs/<id>/``) and the
        zero-weights files made from it (``subspace/<id>/``)."""
        root = self.path.parent
        return [f for f in (run_folder(root, run_id), disable_folder(root, run_id)) if f.is_dir()]

    def delete_files(self, run_id: str) -> list[Path]:
        """Delete the folders run ``run_id`` owns (`run_files`); returns the ones removed.

        Refused (ValueError) while the run is queued or running, or while a queued or running
        run trains in its subspace or zeroes weights from its files: they still need them.
        """
        run = self.get_run(run_id)
        run_id = run["id"]
        if run["status"] in ("queued", "running"):
            raise ValueError(
                f"Run {run_id} is {run['status']}: cancel it before deleting its files."
            )
        folders = self.run_files(run_id)
        users = self._runs_using(run_id, folders)
        if users:
            raise ValueError(
                f"Run(s) {', '.join(users)} still need the files of run {run_id} (they train in its "
                "subspace or zero weights listed there): wait for them or cancel them first."
            )
        return [folder for folder in folders if remove_folder(folder)]

    def delete_run(self, run_id: str) -> list[Path]:
        """Delete a run for good: its files (`delete_files`, same refusals), then the run and its
        steps. Returns the folders removed."""
        run_id = self.resolve_id(run_id)
        removed = self.delete_files(run_id)
        with self._write() as conn:
            conn.execute(
                "DELETE FROM runs WHERE id = ? AND status NOT IN ('queued', 'running')", (run_id,)
            )
        return removed

    def _runs_using(self, run_id: str, folders: Sequence[Path]) -> list[str]:
        """Queued or running runs whose config names run ``run_id`` or one of ``folders``."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, config_json FROM runs WHERE status IN ('queued', 'running') AND id != ?",
                (run_id,),
            ).fetchall()

        def inside(path: str) -> bool:
            return any(path == str(f) or path.startswith(str(f) + os.sep) for f in folders)

        users = []
        for other, raw in rows:
            config = json.loads(raw)
            source = str(source_run(config) or "")
            if source == run_id or inside(source) or inside(str(config.get("zero_weights") or "")):
                users.append(other)
        return users

    def request_cancel(self, run_id: str) -> str:
        """Cancel a run: a queued one at once, a running one by raising its flag (the process
        running it stops at its next step). Returns the run's status afterwards."""
        run_id = self.resolve_id(run_id)
        with self._write() as conn:
            conn.execute(
                """UPDATE runs SET status = 'cancelled', finished = ?, error = 'cancelled before start'
                   WHERE id = ? AND status = 'queued'""",
                (time.time(), run_id),
            )
            conn.execute(
                "UPDATE runs SET cancel_requested = 1 WHERE id = ? AND status = 'running'",
                (run_id,),
            )
            return conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]

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

    # ---- reading ------------------------------------------------------------------------------
    def resolve_id(self, run_id: str) -> str:
        """The full id of ``run_id`` or of the single run whose id ends/starts with it."""
        with self._connect() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
                return run_id
            rows = conn.execute(
                "SELECT id FROM runs WHERE id LIKE ? OR id LIKE ?",
                (f"{run_id}%", f"%{run_id}"),
            ).fetchall()
        if len(rows) != 1:
            what = "no run" if not rows else f"{len(rows)} runs"
            raise RunNotFound(f"Run {run_id!r} matches {what}; see `python -m analysis runs list`.")
        return rows[0][0]

    def get_run(self, run_id: str) -> dict[str, Any]:
        """One run with ``config`` and ``result`` (None unless done) parsed from JSON."""
        run_id = self.resolve_id(run_id)
        with self._connect() as conn:
            cursor = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,))
            run = _row_dict(cursor, cursor.fetchone())
        for column in TIME_COLUMNS:
            run[column] = _iso(run[column])
        record = Run.from_row(run)
        del run["config_json"], run["result_json"]
        run["config"], run["result"] = record.stored, record.result
        run["tags"] = self.tags(run_id)
        return run

    def tags(self, run_id: str) -> list[str]:
        """The tags of one run, sorted."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT tag FROM run_tags WHERE run_id = ? ORDER BY tag", (run_id,)
            ).fetchall()
        return [tag for (tag,) in rows]

    def all_tags(self) -> list[str]:
        """Every tag in use, sorted."""
        with self._connect() as conn:
            return [
                tag for (tag,) in conn.execute("SELECT DISTINCT tag FROM run_tags ORDER BY tag")
            ]

    def list_runs(
        self,
        model: str | Sequence[str] | None = None,
        data: str | Sequence[str] | None = None,
        method: str | Sequence[str] | None = None,
        status: str | Sequence[str] | None = None,
        sweep_id: str | None = None,
        limit: int | None = None,
        tag: str | Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """Runs (newest first, at most ``limit``) with the result's headline fields as columns
        (NaN unless done), their ``note`` and ``tags`` (comma-separated). ``tag``: only runs
        carrying one of these tags; the other filters take one value or a list, too."""
        where, params = [], []
        for column, wanted in (
            ("model", model),
            ("data", data),
            ("method", method),
            ("status", status),
            ("sweep_id", sweep_id),
        ):
            if wanted is None:
                continue
            values = [wanted] if isinstance(wanted, str) else list(wanted)
            where.append(f"{column} IN ({', '.join('?' * len(values))})")
            params.extend(values)
        if tag is not None:
            tags = [tag] if isinstance(tag, str) else list(tag)
            where.append(
                f"id IN (SELECT run_id FROM run_tags WHERE tag IN ({', '.join('?' * len(tags))}))"
            )
            params.extend(tags)
        tags_sql = (
            "(SELECT group_concat(tag, ', ') FROM (SELECT tag FROM run_tags"
            " WHERE run_tags.run_id = runs.id ORDER BY tag)) AS tags"
        )
        sql = f"SELECT {', '.join(RUN_COLUMNS)}, {tags_sql}, config_json, result_json FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, rowid DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._connect() as conn:
            frame = pd.read_sql_query(sql, conn, params=params)
        results = [Run.from_row(row).result or {} for row in frame.itertuples(index=False)]
        for column in RESULT_COLUMNS:
            frame[column] = [r.get(column) for r in results]
        frame["metric"] = frame["metric"].astype(object)
        for column in TIME_COLUMNS:
            frame[column] = pd.to_datetime(frame[column], unit="s", utc=True)
        frame["tags"] = frame["tags"].fillna("").astype(object)
        for column in RESULT_COLUMNS:
            if column != "metric":
                frame[column] = pd.to_numeric(frame[column], errors="coerce")
        return frame

    def trajectory_dir(self, run_ref: str) -> Path:
        """The trajectory folder of a finished run that recorded one (a clear ValueError else)."""
        run = self.get_run(run_ref)
        folder = (run.get("result") or {}).get("trajectory_dir")
        if not folder:
            if run["status"] != "done":
                raise ValueError(
                    f"Run {run['id']} is {run['status']}: its trajectory is not complete."
                )
            raise ValueError(
                f"Run {run['id']} recorded no trajectory: fine-tune with trajectory capture on "
                "(trajectory_every) to find a subspace."
            )
        return Path(folder)

    def steps(self, run_id: str, kind: str | None = None) -> pd.DataFrame:
        """Per-step metrics of a run, long format: step, kind, key, value, t (sorted by step)."""
        sql = "SELECT step, kind, key, value, t FROM steps WHERE run_id = ?"
        params: list[Any] = [run_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        with self._connect() as conn:
            return pd.read_sql_query(sql + " ORDER BY step, kind, key", conn, params=params)

    def curves(self, run_id: str) -> dict[str, list[list[float]]]:
        """``{"train_loss": [[step, loss], …], "dev": [[step, score], …]}`` from the steps table."""
        steps = self.steps(run_id)
        train = steps[(steps["kind"] == "train") & (steps["key"] == "loss")]
        dev = steps[(steps["kind"] == "dev") & (steps["key"] == "dev")]
        return {
            "train_loss": train[["step", "value"]].values.tolist(),
            "dev": dev[["step", "value"]].values.tolist(),
        }

    def latest_steps(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """The last train step of each run with its loss, elapsed_s and eta_s (one row a run)."""
        if not run_ids:
            return pd.DataFrame(columns=["run_id", "step", "loss", "elapsed_s", "eta_s"])
        marks = ", ".join("?" * len(run_ids))
        sql = f"""SELECT s.run_id, s.step, s.key, s.value FROM steps s
                  JOIN (SELECT run_id, MAX(step) AS step FROM steps
                        WHERE kind = 'train' AND run_id IN ({marks}) GROUP BY run_id) last
                  ON s.run_id = last.run_id AND s.step = last.step AND s.kind = 'train'"""
        with self._connect() as conn:
            long = pd.read_sql_query(sql, conn, params=list(run_ids))
        if long.empty:
            return pd.DataFrame(columns=["run_id", "step", "loss", "elapsed_s", "eta_s"])
        return long.pivot_table(
            index=["run_id", "step"], columns="key", values="value"
        ).reset_index()

    def step_times(self, model: str, method: str | None = None) -> pd.Series:
        """Measured seconds per step of earlier completed runs of ``model`` (and ``method``)."""
        runs = self.list_runs(model=model, method=method, status="done")
        return runs["step_time_s"].dropna()

    # ---- export -------------------------------------------------------------------------------
    def export_records(self, with_steps: bool = True, **filters: Any) -> list[dict[str, Any]]:
        """Every matching run as a JSON-ready dict (config, result, and optionally its steps)."""
        records = []
        for run_id in self.list_runs(**filters)["id"]:
            run = self.get_run(run_id)
            if with_steps:
                run["steps"] = self.steps(run_id).to_dict(orient="records")
            records.append(run)
        return records

    def export_json(self, path: Path | str, with_steps: bool = True, **filters: Any) -> int:
        records = self.export_records(with_steps=with_steps, **filters)
        atomic_write_json(path, records)
        return len(records)

    def export_csv(self, path: Path | str, **filters: Any) -> int:
        """One row a run: its columns, the result's headline fields and the config as JSON."""
        frame = self.list_runs(**filters).drop(columns=["result_json"])
        atomic_write_text(path, frame.to_csv(index=False))
        return len(frame)


def _iso(seconds: float | None) -> str | None:
    """UNIX seconds → ``2026-11-30T08:12:03.123+00:00`` (None stays None)."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="milliseconds")


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
