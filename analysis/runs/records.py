"""The records: every run kept for good, read, annotated, deleted and exported (`RunRecords`,
one half of `analysis.runs.db.RunsDB`).

A run's row holds its config and, once done, its result; its per-step metrics are rows of their
own; notes and tags annotate it. Files a run owns live in the workspace, beside the database:
``runs/<id>/`` (what the run wrote: its trajectory snapshots) and ``subspace/<id>/`` (the
zero-weights files of the disable experiment made from its trajectory); deleting them, and runs,
is `analysis.runs.deletion`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.finetune.registry import method_names, method_spec
from analysis.finetune.spec import default_run_label
from analysis.finetune.stored import nested
from analysis.io import atomic_write_json, atomic_write_text
from analysis.runs.deletion import RunDeletion
from analysis.runs.record import Run
from analysis.runs.schema import RunsFile, row_dict

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
    "family",
    "seed",
    "sweep_id",
    "progress",
    "message",
    "error",
    "note",
    "group_key",
    "setting_key",
)
MAX_NOTE_CHARS = 10_000
MAX_TAG_CHARS = 40
MAX_TAGS = 20


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


def _where(
    columns: dict[str, str | Sequence[str] | None], tag: str | Sequence[str] | None
) -> tuple[list[str], list[Any]]:
    """The WHERE clauses and their parameters of `RunRecords.list_runs`' filters: each column
    that is not None takes one value or a list; ``tag`` keeps runs carrying one of its tags."""
    where: list[str] = []
    params: list[Any] = []
    for column, wanted in columns.items():
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
    return where, params


def _iso(seconds: float | None) -> str | None:
    """UNIX seconds → ``2026-11-30T08:12:03.123+00:00`` (None stays None)."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="milliseconds")


class RunRecords(RunDeletion, RunsFile):
    """Read, list, annotate, delete and export the runs (module docstring)."""

    # ---- reading -----------------------------------------------------------------------------
    def get_run(self, run_id: str) -> dict[str, Any]:
        """One run with ``config`` and ``result`` (None unless done) parsed from JSON."""
        run_id = self.resolve_id(run_id)
        with self._connect() as conn:
            cursor = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,))
            run = row_dict(cursor, cursor.fetchone())
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
        where, params = _where(
            {
                "model": model,
                "data": data,
                "method": method,
                "status": status,
                "sweep_id": sweep_id,
            },
            tag,
        )
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

    # ---- annotating --------------------------------------------------------------------------
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

    def add_tags(self, run_ids: Sequence[str], tags: str | Sequence[str]) -> tuple[str, ...]:
        """Add ``tags`` (`parse_tags`) to every run of ``run_ids``, keeping the tags each has, in
        one transaction; a run that would carry more than 20 tags refuses them all (ValueError).
        Returns the tags added."""
        ids = [self.resolve_id(run_id) for run_id in run_ids]
        chosen = parse_tags(tags)
        with self._write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO run_tags (run_id, tag) VALUES (?, ?)",
                [(run_id, tag) for run_id in ids for tag in chosen],
            )
            crowded = conn.execute(
                f"""SELECT run_id FROM run_tags WHERE run_id IN ({", ".join("?" * len(ids))})
                    GROUP BY run_id HAVING COUNT(*) > ?""",
                [*ids, MAX_TAGS],
            ).fetchall()
            if crowded:
                runs = "run" if len(crowded) == 1 else "runs"
                raise ValueError(
                    f"At most {MAX_TAGS} tags per run: {runs} {', '.join(r for (r,) in crowded)} "
                    "would carry more; remove some of their tags first."
                )
        return chosen

    # ---- export -----------------------------------------------------------------------------
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
