"""One run of the runs database as a typed record (`Run`), read in one place, and the one
migration of stored configs.

`Run.from_row` takes a row as the database gives it — a `RunsDB.claim_next` row, a row of
`RunsDB.list_runs` (a ``pandas`` row or an ``itertuples`` tuple) — and is the only code that reads
the stored ``config_json`` / ``result_json`` columns. Stored configs are migrated here: a run is
read under today's name for what it ran (`migrated`, its method's hook: a ``layers`` run that
trained everything is the ``full`` run it was); `migrate_config` reads a config of either stored
form (`analysis.finetune.stored`: options nested, or flat as before) into today's, a key missing
from an older config counting as its default, except that a config stored before the classifier
had its own learning rate trained its classifier at ``lr``, which is what its record says; and
`group_setting` renders any config the way run groups have always hashed it, so stored runs keep
their run groups.

`runs_frame` turns records into a table (one row a run, the result's headline fields as
columns).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import find_spec, method_spec
from analysis.finetune.spec import option_json

NOT_A_SETTING = ("seed", "device")  # which seed, and where it ran: not what was run
# The option keys every config carried, flat, before options were stored under "options" (each at
# its default where the run's method does not use it). Frozen: run groups hash exactly these
# (`group_setting`), whatever methods and options are added since.
FLAT_OPTION_DEFAULTS = {"heads": None, "heads_settings": None, "adapter_layers": None,
                        "adapter_size": 64, "lora_layers": None, "lora_r": 8, "lora_alpha": 16,
                        "subspace_from": None}  # fmt: skip


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


def migrate_config(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (either form) in today's stored form (`FinetuneConfig.to_dict`): missing
    keys take their defaults, and a config stored before the classifier had its own learning
    rate (neither ``classifier_lr`` nor its old key ``head_lr``) gets ``classifier_lr = lr`` (its
    classifier trained at ``lr``). A ValueError for a config `FinetuneConfig` refuses."""
    config = FinetuneConfig.from_dict(stored).to_dict()
    if "head_lr" not in stored and "classifier_lr" not in stored:
        config["classifier_lr"] = config["lr"]
    return config


def group_setting(config: Mapping[str, Any]) -> dict[str, Any]:
    """A migrated config (`migrate_config`) in the flat form run groups hash: the common
    settings, the classifier's learning rate under ``head_lr``, every key of
    `FLAT_OPTION_DEFAULTS` (the method's own value, else the default), and the method's other
    options under their flat names where they differ from their defaults. So a config hashes as
    it did when configs were stored flat, and a new method or option changes no other run's
    group."""
    flat = {k: v for k, v in config.items() if k not in ("options", "classifier_lr")}
    flat["head_lr"] = config["classifier_lr"]
    flat.update(FLAT_OPTION_DEFAULTS)
    options = config.get("options") or {}
    for option in method_spec(config["method"]).fields:
        value = options.get(option.name)
        if option.kind == "heads" and value is not None:
            flat[option.flat] = value["layers"]
            flat[f"{option.flat}_settings"] = value["settings"] or None
        elif option.flat in FLAT_OPTION_DEFAULTS or value != option_json(
            option.kind, option.default
        ):
            flat[option.flat] = value
    return flat


def source_run(stored: Mapping[str, Any]) -> str | None:
    """The run (id or folder) a stored config's method reads (its option of kind ``run``: the
    subspace methods' source), or None."""
    try:
        return FinetuneConfig.from_dict(migrate_config(stored)).option("run")
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


def run_setting(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a run's config says except the seed (and the device it ran on), migrated and
    in the form run groups hash (`group_setting`); a config `FinetuneConfig` refuses (an
    imported run's) is used as stored."""
    raw = {k: v for k, v in stored.items() if k != "device"}
    try:
        setting = group_setting(migrate_config(raw))
    except (ValueError, TypeError):
        setting = dict(raw)
    for key in NOT_A_SETTING:
        setting.pop(key, None)
    return setting


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
    family: str | None = None  # the family of the sweep's strategy (the "strategy" column)
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
            family=_get(row, "strategy") or None,
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
        """The run's config, migrated (`migrate_config`); a ValueError if it no longer loads."""
        return FinetuneConfig.from_dict(migrate_config(self.stored))

    @property
    def setting(self) -> dict[str, Any]:
        """`run_setting` of the stored config (what run groups hash)."""
        return run_setting(self.stored)

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
