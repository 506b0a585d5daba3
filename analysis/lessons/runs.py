"""The runs database as preparing a lesson sees it (`analysis.lessons.library.LibraryRunner`):
the fine-tuning runs a Paper check step's claims need — queued, waited for, and remembered with
the plan they were queued for, so that asking whether they are done never computes the claims'
inputs — and the run a Subspaces step shows."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from analysis.progress import Progress, no_progress
from analysis.words import counted
from analysis.workspace import Workspace


class LessonRuns:
    """One workspace's runs, for lesson steps.

    wait: whether `claim_runs` waits for the runs to finish (the CLI's default) or only queues
    them for the background workers; poll_s: how often it looks while waiting; say: where
    progress sentences go."""

    def __init__(
        self, workspace: Workspace, wait: bool = True, poll_s: float = 10.0,
        say: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
    ) -> None:  # fmt: skip
        self.workspace = workspace
        self.wait, self.poll_s, self.say = wait, poll_s, say

    def db(self):
        """The workspace's runs database (`analysis.runs.db.RunsDB`)."""
        from analysis.runs.db import RunsDB

        return RunsDB(self.workspace)

    def claim_runs(self, cfg, inputs, progress: Progress = no_progress) -> bool:
        """Queue the runs the claims ``cfg`` (prepared as ``inputs``) need that the database lacks
        (in stages: the subspace claims' runs once their trajectory run is done); with ``wait``,
        until none is queued or running. True when none was missing or unfinished."""
        from analysis import claims

        db = self.db()
        queued: set = set()
        hit, start = True, time.perf_counter()
        while True:
            db.reap_dead()
            runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
            source = claims.source_run(cfg, runs) if {"S1", "S2"} & set(cfg.only) else None
            source_id = source["id"] if source and source["status"] == "done" else None
            root = self.workspace.root
            if (source_id and "S2" in cfg.only
                    and not Path(claims.outlier_file(root, source_id)).is_file()):  # fmt: skip
                claims.write_disable_files(db, source_id, cfg.seeds)
            planned = claims.plan_runs(cfg, inputs, source=source_id, root=root)
            self._remember_plan(cfg, planned, runs)
            missing = [p for p in claims.missing_runs(planned, runs) if p.key not in queued]
            if missing:
                hit = False
                seconds, _ = claims.estimate_seconds(missing, runs)
                self.say(f"queueing {counted(len(missing), 'fine-tuning run')}"
                         + ("" if seconds is None else f", about {seconds / 60:.0f} min of training"))  # fmt: skip
                claims.queue_runs(db, missing, f"lesson-{int(time.time())}")
                queued.update(p.key for p in missing)
                continue
            status = claims.run_status(planned, runs)
            done = sum(v["status"] == "done" for v in status.values())
            active = sum(v["status"] in ("queued", "running") for v in status.values())
            progress(done / max(len(planned), 1), f"{done} of {len(planned)} runs done")
            if active:
                hit = False
            if not self.wait or not active:
                return hit
            claims.queue_runs(db, [], f"lesson-{int(start)}")  # keeps a worker serving them
            time.sleep(self.poll_s)

    def planned(self, cfg) -> bool:
        """Whether the runs of the claims ``cfg`` were planned (their inputs computed for it)."""
        return self._plan_file(cfg).is_file()

    def claim_runs_done(self, cfg) -> bool:
        """Whether every run the claims ``cfg`` were planned with (when prepared) is done."""
        from analysis.runs.record import runs_of

        path = self._plan_file(cfg)
        if not path.is_file():
            return False
        wanted = {(key, int(seed)) for key, seed in json.loads(path.read_text())}
        runs = self.db().list_runs(model=cfg.model.name, data=cfg.data.name, status="done")
        done = {(r.group, int(r.stored.get("seed", 0))) for r in runs_of(runs) if r.stored}
        return bool(wanted) and wanted <= done

    def _plan_file(self, cfg) -> Path:
        """Where the runs the claims ``cfg`` were planned with are kept."""
        digest = hashlib.sha256(repr(cfg).encode()).hexdigest()[:16]
        return self.workspace.lessons / "plans" / f"{digest}.json"

    def _remember_plan(self, cfg, planned, runs) -> None:
        """Keep the (run group, seed) of every planned run (`PlannedRun.group_in` ``runs``)."""
        from analysis.io import atomic_write_json

        keys = sorted([list(p.group_in(runs)) for p in planned])
        path = self._plan_file(cfg)
        if not path.is_file() or json.loads(path.read_text()) != keys:
            atomic_write_json(path, keys)

    def trajectory_run(self, model: str, run: str | None = None) -> str | None:
        """The run a Subspaces step shows: ``run`` (its view's), else the model's newest done run
        that recorded a trajectory (the page's default)."""
        from analysis.runs.record import runs_of

        if run:
            return run
        for record in runs_of(self.db().list_runs(model=model, status="done")):  # newest first
            folder = (record.result or {}).get("trajectory_dir")
            if folder and (Path(folder) / "index.json").is_file():
                return record.id
        return None
