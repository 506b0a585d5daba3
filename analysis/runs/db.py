"""The runs database: every fine-tuning run and its per-step metrics, kept for good.

`RunsDB` is the workspace's runs database file (`analysis.runs.schema.RunsFile`: the schema,
its migrations, one shared connection) in three pieces:

- the queue (`analysis.runs.queue.RunQueue`): a run's life — queued, claimed by a worker, its
  steps and progress, finished, failed or cancelled, reaped when its process died;
- the records (`analysis.runs.records.RunRecords`): what is kept — read, listed, annotated with
  notes and tags, deleted with the files the run owns, exported;
- the experiments (`analysis.runs.experiments.RunExperiments`): planned comparisons whose
  rounds go on as their runs end (`analysis.runs.planner`).

Code that needs one piece only can say so in its signature (``RunQueue`` / ``RunRecords``);
both pieces share the one connection of a `RunsDB`.
"""

from __future__ import annotations

from analysis.runs.experiments import RunExperiments
from analysis.runs.queue import RunQueue
from analysis.runs.records import RunRecords


class RunsDB(RunQueue, RunRecords, RunExperiments):
    """The runs database of ``workspace`` (default: the current one): the queue and the records
    over one connection (module docstring). ``db.workspace`` names where its runs' files live."""
