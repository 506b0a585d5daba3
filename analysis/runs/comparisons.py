"""Paper 003's comparisons as runs: which runs they need, and how finished runs sort into them.

Intrinsic subspace vs random subspace vs frozen vs full fine-tuning (same model, data, budget and
seeds), and the disable experiment: full fine-tuning with the outlier weights zeroed vs as many
random weights zeroed. `comparison_configs` plans the runs; `comparison_table` sorts the
finished ones (rows of `RunsDB.list_runs`) into the groups; `summarise_comparison` gives each
group's mean and standard error over seeds; `comparison_verdicts` compares them
(`analysis.compare.compare`).

Only runs of one setting are averaged (docs/explanation/statistics.md, "Run groups: runs that
count as seeds"): a group's runs are split by their setting (`analysis.runs.record.run_setting`),
except that the zero-weights file of the disable experiment counts by its role (the random
control draws its weights with the run's seed, so its seeds zero different files by design). A
full run of 100 steps and one of 300 are two rows, never "n_seeds 2".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.compare import Arm, Comparison, compare
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.methods.subspace import SubspaceOptions
from analysis.finetune.registry import find_spec
from analysis.runs.chance import BOTH_AT_CHANCE, chance_flag, groups_at_chance
from analysis.runs.record import runs_of, setting_digest
from analysis.runs.results import budget_key, distinct_labels, newest_per_seed

COMPARISON_GROUPS = (
    "full",
    "intrinsic subspace",
    "random subspace",
    "frozen",
    "outliers zeroed",
    "random weights zeroed",
)


def comparison_group(
    config: dict[str, Any],
    source: Sequence[str],
    outlier_file: str | None,
    random_files: Sequence[str] = (),
) -> str | None:
    """Which bar of the comparison a run's config (flat, as `run_setting` gives it) belongs to
    (None: not part of it), asked of its method's spec: a method that reads a source run is the
    intrinsic subspace, or the random one where its spec is ``random``; one whose body does not
    train is frozen; the reference is full fine-tuning.

    ``source``: the names of the subspace's run (its id and/or trajectory folder), matched
    against the method's option of kind ``run`` (``subspace_from``); ``outlier_file`` /
    ``random_files``: the zero-weights files of the disable experiment, matched against
    ``zero_weights``.
    """
    spec = find_spec(config.get("method"))
    if spec is None:
        return None
    zero = config.get("zero_weights")
    reads = spec.option_field("run")
    if reads is not None:
        if config.get(reads.flat) not in source:
            return None
        return "random subspace" if spec.random else "intrinsic subspace"
    if not spec.has_body and not zero:
        return "frozen"
    if spec.reference:
        if not zero:
            return "full"
        if outlier_file and zero == outlier_file:
            return "outliers zeroed"
        if zero in random_files:
            return "random weights zeroed"
    return None


def comparison_table(
    runs: pd.DataFrame,
    source: Sequence[str],
    outlier_file: str | None = None,
    random_files: Sequence[str] = (),
) -> pd.DataFrame:
    """Completed runs (``RunsDB.list_runs`` rows, with ``config_json``) sorted into the groups.

    Columns: id, group, seed, score, flag (`analysis.runs.chance.chance_flag`: "" unless the run
    is at chance level), metric, n_trainable, setting (the run group, with a
    zero-weights file counted by its role; one run per setting and seed, the newest), budget (`analysis.runs.results.budget_key`), label
    (what tells settings apart), result (the run's result, for the comparisons' paired
    bootstrap).
    """
    rows, settings = [], {}
    for run, row in zip(runs_of(runs), runs.itertuples(index=False), strict=True):
        if run.status != "done" or not run.stored:
            continue
        setting = run.setting  # the flat form: its keys are the same for every run of a method
        group = comparison_group(setting, source, outlier_file, random_files)
        if group is None:
            continue
        if setting.get("zero_weights"):
            setting["zero_weights"] = group  # the role, not the file
        key = setting_digest(setting)
        settings[key] = setting
        rows.append(
            {"id": run.id, "group": group, "seed": run.seed, "score": row.score,
             "metric": getattr(row, "metric", None), "n_trainable": getattr(row, "n_trainable", None),
             "setting": key, "budget": budget_key(setting), "result": run.result}
        )  # fmt: skip
    columns = ["id", "group", "seed", "score", "flag", "metric", "n_trainable", "setting",
               "budget", "label", "result"]  # fmt: skip
    table = newest_per_seed(
        pd.DataFrame(rows, columns=[c for c in columns if c not in ("label", "flag")]), "setting"
    ).copy()
    labels = distinct_labels(settings)
    named = {
        key: _role_label(group, labels[key], settings[key])
        for group, key in zip(table["group"], table["setting"], strict=True)
    }
    clashes = pd.Series(named).duplicated(keep=False)
    named = {k: f"{v} · #{k[:4]}" if clashes[k] else v for k, v in named.items()}
    table["label"] = [named[key] for key in table["setting"]]
    table["flag"] = [chance_flag(r, s) for r, s in zip(table["result"], table["score"],
                                                         strict=True)]  # fmt: skip
    return table[columns]


# At most this many differing settings name a bar (the rest: "+ n more"), so a label says what
# differs in a few words, never every setting.
MAX_LABEL_PARTS = 2


def _role_label(group: str, label: str, setting: dict[str, Any]) -> str:
    """The comparison group's name plus what tells its settings apart (``full · steps 100``),
    at most `MAX_LABEL_PARTS` of them."""
    extra = label.split(" · ", 1)[1] if " · " in label else ""
    parts = [p for p in extra.split(" · ") if p and not p.startswith("zero")]
    if len(parts) > MAX_LABEL_PARTS:
        parts = [*parts[:MAX_LABEL_PARTS], f"+ {len(parts) - MAX_LABEL_PARTS} more"]
    return " · ".join([group, *parts])


def summarise_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per group and setting: n_seeds, mean score, score_sem = std(ddof=1)/√n (NaN with one
    seed), n_trainable; ``label`` names the group (and the setting, where a group has several)."""
    columns = ["group", "label", "setting", "budget", "n_seeds", "score", "score_sem",
               "n_trainable"]  # fmt: skip
    if table.empty:
        return pd.DataFrame(columns=columns)
    scores = table.assign(score=pd.to_numeric(table["score"], errors="coerce"))
    out = (
        scores.groupby(["group", "setting"], sort=False)
        .agg(
            label=("label", "first"),
            budget=("budget", "first"),
            n_seeds=("score", "count"),
            score=("score", "mean"),
            score_std=("score", "std"),
            n_trainable=("n_trainable", "mean"),
        )
        .reset_index()
    )
    out["score_sem"] = out["score_std"] / np.sqrt(out["n_seeds"].clip(lower=1))
    out.loc[out["n_seeds"] < 2, "score_sem"] = np.nan
    order = {g: i for i, g in enumerate(COMPARISON_GROUPS)}
    out = out.sort_values(
        ["group", "label"], key=lambda s: s.map(order) if s.name == "group" else s
    )
    return out.reset_index(drop=True)[columns]


# The paper's questions, as (A, B) pairs of comparison groups.
VERDICT_PAIRS = (
    ("intrinsic subspace", "full"),
    ("intrinsic subspace", "random subspace"),
    ("random subspace", "frozen"),
    ("outliers zeroed", "random weights zeroed"),
)


def comparison_verdicts(table: pd.DataFrame, withheld: list[str] | None = None) -> list[Comparison]:
    """A vs B for each pair of `VERDICT_PAIRS` whose groups both have runs of one budget (the
    same model, data, steps, batch size…): the setting with the most seeds of each side.
    table: `comparison_table`.

    No verdict between two settings whose runs are all at chance level (`analysis.runs.chance`):
    each such pair's reason is appended to ``withheld`` instead."""
    if table.empty:
        return []
    summary = summarise_comparison(table)
    at_chance = groups_at_chance(table.assign(_key=table["group"] + "\0" + table["setting"]),
                                 "_key")  # fmt: skip
    out = []
    for a, b in VERDICT_PAIRS:
        for budget in summary["budget"].unique():
            here = summary[summary["budget"] == budget]
            side_a, side_b = here[here["group"] == a], here[here["group"] == b]
            if side_a.empty or side_b.empty:
                continue
            rows = [side.sort_values("n_seeds").iloc[-1] for side in (side_a, side_b)]
            if all(f"{r['group']}\0{r['setting']}" in at_chance for r in rows):
                if withheld is not None:
                    withheld.append(BOTH_AT_CHANCE.format(a=rows[0]["label"], b=rows[1]["label"]))
                continue
            out.append(compare(*(_arm(table, r) for r in rows)))
    return out


def _arm(table: pd.DataFrame, row: pd.Series) -> Arm:
    runs = table[(table["group"] == row["group"]) & (table["setting"] == row["setting"])]
    results = [
        {"metric": m, **(r or {}), "score": s}
        for m, r, s in zip(runs["metric"], runs["result"], runs["score"], strict=True)
    ]
    return Arm.from_results(str(row["label"]), results)


def comparison_configs(
    base: FinetuneConfig,
    source: str,
    seeds: Sequence[int],
    outlier_file: str | None = None,
    random_file: Callable[[int], str] | None = None,
    record_ends: bool = False,
) -> list[tuple[str, FinetuneConfig]]:
    """The runs of the paper's comparisons, per seed, as (group, config) pairs.

    ``base`` fixes model, data and budget; its method and subspace/zero-weights fields are
    replaced. Groups (`COMPARISON_GROUPS`): full, intrinsic subspace and random subspace (from
    run ``source``), frozen; with ``outlier_file``: full fine-tuning with the outliers zeroed,
    and with ``random_file(seed)`` as many random weights zeroed.

    No run records a trajectory unless ``record_ends``: then the two subspace runs snapshot their
    start and end (two snapshots, a full encoder's layers each), so that their learned update
    V θ̄ can be inspected for outliers on the Subspaces page.
    """
    out: list[tuple[str, FinetuneConfig]] = []
    from_source = SubspaceOptions(source)
    plain = dict(options=None, zero_weights=None, trajectory_every=None, lr=None)
    for seed in seeds:
        # Snapshots at step 0 and the last step only, and only when asked: each costs a copy of
        # the encoder's layers on disk.
        ends = dict(trajectory_every=base.steps) if record_ends else {}
        runs = [
            ("full", dict(method="full")),
            ("intrinsic subspace", dict(method="subspace", options=from_source, **ends)),
            ("random subspace", dict(method="subspace-random", options=from_source, **ends)),
            ("frozen", dict(method="frozen")),
        ]
        if outlier_file:
            runs.append(("outliers zeroed", dict(method="full", zero_weights=outlier_file)))
        if random_file is not None:
            runs.append(
                ("random weights zeroed", dict(method="full", zero_weights=random_file(seed)))
            )
        for group, fields in runs:
            out.append((group, dataclasses.replace(base, **{**plain, "seed": seed, **fields})))
    return out
