"""The experiments of the runs database: what a planned comparison is (its arms, seeds, policy and
rule, as `analysis.runs.planner.Experiment.to_dict` writes it), kept under the sweep id its runs
share, so that whichever process records one of its runs' end can take its next round.

An experiment is stopped when the rest of its runs are cancelled (`stop_experiment`): it then
takes no more rounds. Rounds of one experiment are taken one process at a time
(`experiment_lock`, a file lock beside the database), so two workers ending runs at once never
queue one run twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from typing import Any

from analysis.runs.schema import RunsFile


class RunExperiments(RunsFile):
    """Store, read and stop experiments (module docstring)."""

    def save_experiment(self, sweep_id: str, spec: dict[str, Any]) -> None:
        """Keep (or replace) the experiment of ``sweep_id``, not stopped."""
        with self._write() as conn:
            conn.execute(
                """INSERT INTO experiments (id, created, spec_json, stopped) VALUES (?, ?, ?, 0)
                   ON CONFLICT (id) DO UPDATE SET spec_json = excluded.spec_json, stopped = 0""",
                (sweep_id, time.time(), json.dumps(spec, sort_keys=True)),
            )

    def experiment_spec(self, sweep_id: str | None) -> dict[str, Any] | None:
        """The stored experiment of ``sweep_id`` (None: none, or stopped)."""
        if not sweep_id:
            return None
        with self._connect() as conn:
            row = conn.execute(
                "SELECT spec_json FROM experiments WHERE id = ? AND stopped = 0", (sweep_id,)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def stop_experiment(self, sweep_id: str) -> bool:
        """Take no more rounds of ``sweep_id``'s experiment; whether there was one running."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE experiments SET stopped = 1 WHERE id = ? AND stopped = 0", (sweep_id,)
            )
            return cursor.rowcount == 1

    @contextlib.contextmanager
    def experiment_lock(self, sweep_id: str) -> Iterator[None]:
        """Hold the lock on taking rounds of experiments (one file beside the database)."""
        path = self.path.with_name("experiments.lock")
        with open(path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
