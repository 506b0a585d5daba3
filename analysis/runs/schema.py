"""The runs database's file: its schema, the migrations between versions, and the one
connection a process keeps to it (`RunsFile`, the base of `analysis.runs.db.RunsDB`).

One embedded SQLite file, ``<cache root>/runs.sqlite`` (`analysis.workspace.Workspace.runs_db`),
shared by the app, the CLI and the worker processes. Write-ahead logging (WAL) lets readers (the
page polling every 2 s) run while the worker writes; ``synchronous=NORMAL`` keeps a commit cheap
without risking corruption (a power cut may drop the last commits, a killed process loses nothing
it committed). Every write is one ``BEGIN IMMEDIATE … COMMIT`` transaction (`RunsFile._write`).

A CHECK constraint makes "a result exists only for a completed run" a property of the file, not
just of this code. The schema is versioned (``PRAGMA user_version`` plus a ``schema_version``
table); `migrate` upgrades an older file in place. Version 2 adds a free-text ``note`` per run
and a ``run_tags`` table (a run's tags, deleted with it). Version 3 gives every stored word one
meaning (`analysis.runs.migration`): configs under today's names, the ``family`` column (was
``strategy``), and each run's ``group_key`` and ``setting_key``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from analysis.runs.migration import UPGRADE
from analysis.workspace import Workspace

# A step of a migration: an SQL statement, or a function of the connection (what SQL cannot say).
Step = str | Callable[[sqlite3.Connection], None]
# Migration v → v+1 is MIGRATIONS[v]: its steps, run in order in one transaction.
MIGRATIONS: list[list[Step]] = [
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
    # 3: one meaning per stored word (analysis.runs.migration).
    UPGRADE,
    # 4: planned experiments, under their runs' sweep id (analysis.runs.experiments).
    [
        """CREATE TABLE experiments (
            id TEXT PRIMARY KEY,
            created REAL NOT NULL,
            spec_json TEXT NOT NULL,
            stopped INTEGER NOT NULL DEFAULT 0
        )""",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


class RunNotFound(ValueError):
    """No run has this id (or the prefix matches none or several)."""


def migrate(conn: sqlite3.Connection, migrations: Sequence[Sequence[Step]] = MIGRATIONS) -> int:
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
                for step in migrations[version]:
                    if isinstance(step, str):
                        conn.execute(step)
                    else:
                        step(conn)
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


def row_dict(cursor: sqlite3.Cursor, row: tuple) -> dict[str, Any]:
    return {col[0]: value for col, value in zip(cursor.description, row, strict=True)}


class RunsFile:
    """The runs database file of ``workspace`` (default: the current workspace), open.

    Holds one connection, shared by the threads of a process under a lock (Streamlit runs
    scripts in threads). Keeping it open matters: closing the last connection to a WAL file
    checkpoints and fsyncs, which would make every small write cost tens of milliseconds.
    """

    def __init__(self, workspace: Workspace | None = None) -> None:
        self.workspace = workspace if workspace is not None else Workspace.current()
        self.path = self.workspace.runs_db
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
            raise RunNotFound(
                f"Run {run_id!r} matches {what}; see `python -m tunescope runs list`."
            )
        return rows[0][0]
