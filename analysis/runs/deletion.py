"""Deleting runs and the files they own (`RunDeletion`, part of `analysis.runs.records.RunRecords`):
``runs/<id>/`` (the run's trajectory) and ``subspace/<id>/`` (the zero-weights files made from it),
refused while the run or another queued or running run still needs them."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from analysis.io import remove_folder
from analysis.runs.record import source_run


class RunDeletion:
    """The deleting half of the records; the class that mixes it in gives ``workspace``,
    ``resolve_id``, ``_connect`` and ``_write``."""

    def run_files(self, run_id: str) -> list[Path]:
        """The folders run ``run_id`` owns that exist: its trajectory (``runs/<id>/``) and the
        zero-weights files made from it (``subspace/<id>/``)."""
        folders = (self.workspace.run_folder(run_id), self.workspace.disable_folder(run_id))
        return [f for f in folders if f.is_dir()]

    def delete_files(self, run_id: str) -> list[Path]:
        """Delete the folders run ``run_id`` owns (`run_files`); returns the ones removed.

        Refused (ValueError) while the run is queued or running, or while a queued or running
        run trains in its subspace or zeroes weights from its files: they still need them.
        """
        folders = self._deletable_files(self.resolve_id(run_id))
        return [folder for folder in folders if remove_folder(folder)]

    def delete_run(self, run_id: str) -> list[Path]:
        """Delete a run for good: its files (`delete_files`, same refusals), then the run and its
        steps. Returns the folders removed."""
        return self.delete_runs([run_id])

    def delete_runs(self, run_ids: Sequence[str]) -> list[Path]:
        """Delete runs for good: each one's files, then the runs with their steps, notes and tags
        in one transaction. Every run is checked first (`delete_files`' refusals), so a refusal
        deletes nothing. Returns the folders removed."""
        ids = list(dict.fromkeys(self.resolve_id(run_id) for run_id in run_ids))
        owned = [folder for run_id in ids for folder in self._deletable_files(run_id)]
        removed = [folder for folder in owned if remove_folder(folder)]
        with self._write() as conn:
            conn.execute(
                f"DELETE FROM runs WHERE id IN ({', '.join('?' * len(ids))})"
                " AND status NOT IN ('queued', 'running')",
                ids,
            )
        return removed

    def _deletable_files(self, run_id: str) -> list[Path]:
        """The folders run ``run_id`` owns, or a ValueError when the run or a queued or running
        run still needs them (`delete_files`)."""
        with self._connect() as conn:
            status = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
        if status in ("queued", "running"):
            raise ValueError(f"Run {run_id} is {status}: cancel it before deleting its files.")
        folders = self.run_files(run_id)
        users = self._runs_using(run_id, folders)
        if users:
            raise ValueError(
                f"{'Run' if len(users) == 1 else 'Runs'} {', '.join(users)} still "
                f"{'needs' if len(users) == 1 else 'need'} the files of run {run_id} (they train in "
                "its subspace or zero weights listed there): wait for them or cancel them first."
            )
        return folders

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
