"""One run of the runs database as a typed record (`Run`), read in one place, and the setting
run groups are keyed by.

`Run.from_row` takes a row as the database gives it — a `RunsDB.claim_next` row, a row of
`RunsDB.list_runs` (a ``pandas`` row or an ``itertuples`` tuple) — and is the only code that reads
the stored ``config_json`` / ``result_json`` columns. Stored configs are in today's stored form
(`analysis.finetune.stored`; the database's migration rewrote older ones,
`analysis.runs.migration`), except that a run is read under today's name for what it ran (`migrated`, its method's hook: a
``layers`` run that trained everything is the ``full`` run it was).

A run's **setting** (`run_setting`) is everything its config says but the seed and the device, in
the flat form run groups hash: the common settings and the run's own method's options that differ
from their defaults, under their flat names — nothing of any other method, so adding a method or
an option changes no key. `setting_key` is its digest; a run's **group** (``group_key``) is
stored beside it when the run is recorded (`analysis.runs.queue.RunQueue.enqueue`: the group of
the runs with its setting key, else the key itself).

`runs_frame` turns records into a table (one row a run, the result's headline fields as
columns).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.cache import canonical_json
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import find_spec, method_spec
from analysis.finetune.spec import option_json

NOT_A_SETTING = ("seed", "device")  # which seed, and where it ran: not what was run


def _get(row: Any, name: str) -> Any:
    """A column of a dict, a pandas row or an ``itertuples`` tuple; NaN / missing → None."""
    value = row.get(name) if hasattr(row, "get") else getattr(row, name, None)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _json(text: Any) -> dict[str, Any] | None:
    if isinstance(text, str) and text:
        return json.loads(text)
    return text if isinstance(text, dict) else None


def run_setting(stored: Mapping[str, Any], defaults: bool = False) -> dict[str, Any]:
    """What a stored config says but the seed and the device (module docstring): the common
    settings as stored (missing ones at their defaults) and the method's options that differ from
    their defaults under their flat names (a head selection as ``heads`` and
    ``heads_settings``); with ``defaults``, every option of the method (what labels compare: two
    settings that differ in an option say both values). A config `FinetuneConfig` refuses (an
    imported run's) is used as stored."""
    raw = {k: v for k, v in stored.items() if k not in NOT_A_SETTING}
    try:
        config = FinetuneConfig.from_dict(raw).to_dict()
    except (ValueError, TypeError):
        return raw
    options = config.pop("options") or {}
    setting = {k: v for k, v in config.items() if k not in NOT_A_SETTING}
    for option in method_spec(config["method"]).fields:
        value = options.get(option.name)
        if not defaults and value == option_json(option.kind, option.default):
            continue
        if option.kind == "heads":
            setting[option.flat] = value["layers"]
            setting[f"{option.flat}_settings"] = value["settings"] or None
        else:
            setting[option.flat] = value
    return setting


def setting_digest(value: Any) -> str:
    """SHA-256 (16 hex digits) of a value's canonical JSON: the key of a setting."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def setting_key(stored: Mapping[str, Any]) -> str:
    """The digest of a stored config's setting (`run_setting`): equal for configs that differ
    only in their seed (and device)."""
    return setting_digest(run_setting(stored))


def source_run(stored: Mapping[str, Any]) -> str | None:
    """The run (id or folder) a stored config's method reads (its option of kind ``run``: the
    subspace methods' source), or None."""
    try:
        return FinetuneConfig.from_dict(stored).option("run")
    except (ValueError, TypeError):
        return None


def migrated(stored: dict[str, Any], result: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored config as the run it was under today's names (one setting, one name, one run
    group): its method's ``MethodSpec.migrate`` (a ``layers`` run that trained everything is
    the ``full`` run it was), else as stored."""
    spec = find_spec(stored.get("method"))
    if spec is None or spec.migrate is None:
        return stored
    return spec.migrate(stored, result)


@dataclass(frozen=True)
class Run:
    """One run: what it is (its stored config and the migrated `config`), where it stands
    (status, progress, error), what it gave (result, None unless done) and its timings
    (UNIX seconds; None until they happen)."""

    id: str
    status: str
    stored: dict[str, Any] = field(repr=False)  # the config as stored (JSON-ready)
    result: dict[str, Any] | None = field(default=None, repr=False)
    method: str = "?"
    label: str = ""
    family: str | None = None  # the layer family of the sweep strategy that queued it
    group_key: str | None = None  # its run group, as stored (None: a row not from the database)
    setting_key: str | None = None
    seed: int = 0
    sweep_id: str | None = None
    device: str | None = None
    created: Any = None
    started: Any = None
    finished: Any = None
    error: str | None = None
    progress: float | None = None
    message: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> Run:
        """The record of one database row (a dict, a pandas row or an ``itertuples`` tuple)."""
        stored = _json(_get(row, "config_json"))
        if stored is None:
            stored = _json(_get(row, "config")) or {}
        result = _json(_get(row, "result_json")) or _json(_get(row, "result"))
        stored = migrated(stored, result)
        seed = _get(row, "seed")
        return cls(
            id=str(_get(row, "id")),
            status=str(_get(row, "status")),
            stored=stored,
            result=result,
            method=str(stored.get("method") or _get(row, "method") or "?"),
            label=str(_get(row, "label") or ""),
            family=_get(row, "family") or None,
            group_key=_get(row, "group_key") or _get(row, "group"),  # a listing's (with_groups)
            setting_key=_get(row, "setting_key"),
            seed=int(seed if seed is not None else stored.get("seed", 0)),
            sweep_id=_get(row, "sweep_id"),
            device=_get(row, "device") if isinstance(_get(row, "device"), str) else None,
            created=_get(row, "created"),
            started=_get(row, "started"),
            finished=_get(row, "finished"),
            error=_get(row, "error"),
            progress=_get(row, "progress"),
            message=_get(row, "message"),
        )

    @property
    def config(self) -> FinetuneConfig:
        """The run's config; a ValueError if it no longer loads."""
        return FinetuneConfig.from_dict(self.stored)

    @property
    def setting(self) -> dict[str, Any]:
        """`run_setting` of the stored config, every option of its method included (what
        labels and comparisons read)."""
        return run_setting(self.stored, defaults=True)

    @property
    def group(self) -> str:
        """The run's group: as stored, else (a row not from the database) its setting's key."""
        return self.group_key or setting_key(self.stored)

    @property
    def steps(self) -> int:
        """The optimizer steps the run was given."""
        return int(self.stored.get("steps") or 1)


def runs_of(frame: pd.DataFrame) -> list[Run]:
    """The records of a `RunsDB.list_runs` table (or any frame with its columns)."""
    return [Run.from_row(row) for row in frame.itertuples(index=False)]


def runs_frame(runs: Iterable[Run], columns: Iterable[str] = ()) -> pd.DataFrame:
    """A table of records: id, status, method, label, family, seed, device, error and the
    results' ``columns`` (NaN where a run has no result)."""
    rows = []
    for run in runs:
        result = run.result or {}
        rows.append(
            {"id": run.id, "status": run.status, "method": run.method, "label": run.label,
             "family": run.family, "seed": run.seed, "device": run.device, "error": run.error,
             **{c: result.get(c) for c in columns}}
        )  # fmt: skip
    return pd.DataFrame(rows)
