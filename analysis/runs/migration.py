"""The runs database's step to schema version 3: every stored word takes its one meaning.

Before it, stored configs (``config_json``) came in the forms of the code that stored them: flat
(every method's options beside the common keys) or nested (options under ``"options"``), the
classifier's learning rate sometimes under ``head_lr``, the classifier's layer only as the third
element of ``layers``, and LoRA's (adapters', IA³'s, EVA's) placement under ``"layers"`` beside
the config's own. The ``strategy`` column held a layer family, or the name of the arm that had
queued the run (``recommend <arm>``, ``claims <arm>``, a subspace comparison's group). The run
group was a hash of the config in the flat form of those days, every method's option defaults
included, recomputed on every read.

`UPGRADE`, the steps of version 3, rewrites every run once (`rewrite_runs`):

- ``config_json`` in today's stored form (`today`): ``classifier_lr`` (a config stored before
  the classifier had its own rate gets ``lr``: its classifier trained at ``lr``),
  ``layers`` [ℓ_bottom, ℓ_top] and ``classifier_layer``, the placement under
  ``layers_to_transform``; a config today's code refuses (an imported run's) keeps its keys
  but under today's names;
- ``strategy`` becomes ``family``, holding a layer family or nothing (an arm's name is not a
  family: the runs are matched to their arms by run group and seed);
- ``group_key``: the run group the run had (`old_group_key`: the formula of schema version 2,
  frozen here and used nowhere else), so every old run keeps its group; ``setting_key``: today's
  key of its setting (`analysis.runs.record.setting_key`). A run recorded later joins the group
  of the runs with its setting key (`analysis.runs.queue.RunQueue.enqueue`).

`today` also reads a config that a recipe exported before this version carries
(`analysis.runs.imported`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_spec
from analysis.finetune.spec import option_json
from analysis.finetune.stored import stored_layers
from analysis.runs.record import setting_digest, setting_key

# The layer families a sweep records (`analysis.strategies.LAYER_FAMILIES` when this was written).
FAMILIES = ("ℓ*-down", "ℓ*-up", "baseline", "middle")
# Methods whose placement option was stored as "layers" (now "layers_to_transform").
PLACED = ("lora", "adapter", "ia3", "lora-eva")
# The option keys every flat config carried (each at its default where the run's method does not
# use it): schema version 2's run groups hashed exactly these.
FLAT_OPTION_DEFAULTS = {"heads": None, "heads_settings": None, "adapter_layers": None,
                        "adapter_size": 64, "lora_layers": None, "lora_r": 8, "lora_alpha": 16,
                        "subspace_from": None}  # fmt: skip


def renamed(stored: Mapping[str, Any]) -> dict[str, Any]:
    """``stored`` with today's names, nothing checked: ``head_lr`` → ``classifier_lr`` (unless
    both are given, which stays an error), ``layers`` (ℓ_bottom, ℓ_top, ℓ_cls) → ``layers`` and
    ``classifier_layer``, a placing method's option ``layers`` → ``layers_to_transform``."""
    out = dict(stored)
    if "head_lr" in out and "classifier_lr" not in out:
        out["classifier_lr"] = out.pop("head_lr")
    layers = out.get("layers")
    if isinstance(layers, list) and len(layers) == 3 and "classifier_layer" not in out:
        out["layers"], out["classifier_layer"] = layers[:2], layers[2]
    options = out.get("options")
    if out.get("method") in PLACED and isinstance(options, Mapping) and "layers" in options:
        out["options"] = {
            ("layers_to_transform" if k == "layers" else k): v for k, v in options.items()
        }
    return out


def today(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config of any earlier form in today's stored form (module docstring); one
    `FinetuneConfig` refuses keeps its keys, renamed (`renamed`)."""
    return _loaded(stored) or renamed(stored)


def _loaded(stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """`today` of a config `FinetuneConfig` loads, else None."""
    try:
        config = FinetuneConfig.from_dict(renamed(stored)).to_dict()
    except (ValueError, TypeError):
        return None
    if "head_lr" not in stored and "classifier_lr" not in stored:
        config["classifier_lr"] = config["lr"]  # stored before the classifier had its own rate
    return config


def old_group_key(stored: Mapping[str, Any], result: Mapping[str, Any] | None) -> str:
    """The run group schema version 2 gave a run (its config as stored, its result): the digest
    of the config in the flat form of its day — the common settings, ``head_lr``, the layer
    triple, every key of `FLAT_OPTION_DEFAULTS` (the method's own value, else the default) and
    the method's other options under their flat names where they differ from their defaults; a
    config that does not load, as stored — without the seed and the device. A ``layers`` run
    that trained everything counted as the ``full`` run it was."""
    raw = {k: v for k, v in stored.items() if k != "device"}
    trained, total = (result or {}).get("n_trainable"), (result or {}).get("n_params")
    if raw.get("method") == "layers" and trained and trained == total:
        raw = {**raw, "method": "full", "layers": None}
    config = _loaded(raw)
    if config is None:
        setting = raw
    else:
        setting = {k: v for k, v in config.items()
                   if k not in ("options", "classifier_lr", "classifier_layer")}  # fmt: skip
        triple = stored_layers(config)
        setting["layers"] = list(triple) if triple else None
        setting["head_lr"] = config["classifier_lr"]
        setting.update(FLAT_OPTION_DEFAULTS)
        options = config.get("options") or {}
        for option in method_spec(config["method"]).fields:
            value = options.get(option.name)
            if option.kind == "heads" and value is not None:
                setting[option.flat] = value["layers"]
                setting[f"{option.flat}_settings"] = value["settings"] or None
            elif option.flat in FLAT_OPTION_DEFAULTS or value != option_json(
                option.kind, option.default
            ):
                setting[option.flat] = value
    return setting_digest({k: v for k, v in setting.items() if k not in ("seed", "device")})


def rewrite_runs(conn: sqlite3.Connection) -> None:
    """Every run's config in today's form, its old group as ``group_key`` and its setting's
    key as ``setting_key``."""
    rows = conn.execute("SELECT id, config_json, result_json FROM runs").fetchall()
    for run_id, config_json, result_json in rows:
        stored = json.loads(config_json)
        result = json.loads(result_json) if result_json else None
        config = today(stored)
        conn.execute(
            "UPDATE runs SET config_json = ?, group_key = ?, setting_key = ? WHERE id = ?",
            (json.dumps(config, sort_keys=True, default=str), old_group_key(stored, result),
             setting_key(config), run_id),
        )  # fmt: skip


UPGRADE = [
    "ALTER TABLE runs RENAME COLUMN strategy TO family",
    f"UPDATE runs SET family = NULL WHERE family NOT IN ({', '.join(repr(f) for f in FAMILIES)})",
    "ALTER TABLE runs ADD COLUMN group_key TEXT",
    "ALTER TABLE runs ADD COLUMN setting_key TEXT",
    rewrite_runs,
    "CREATE INDEX runs_by_setting ON runs (setting_key)",
]
