"""Paper 003's comparisons as runs: which runs they need, and how finished runs sort into them.

Intrinsic subspace vs random subspace vs frozen vs full fine-tuning (same model, data, budget and
seeds), and the disable experiment: full fine-tuning with the outlier weights zeroed vs as many
random weights zeroed. `comparison_configs` plans the runs; `comparison_table` sorts the
finished ones (rows of `RunsDB.list_runs`) into the groups; `summarise_comparison` gives each
group's mean and standard error over seeds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.finetune.config import FinetuneConfig, SubspaceOptions

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
    """Which bar of the comparison a run's config belongs to (None: not part of it).

    ``source``: the names of the subspace's run (its id and/or trajectory folder), matched
    against ``subspace_from``; ``outlier_file`` / ``random_files``: the zero-weights files of the
    disable experiment, matched against ``zero_weights``.
    """
    method = config.get("method")
    zero = config.get("zero_weights")
    if method in ("subspace", "subspace-random"):
        if config.get("subspace_from") not in source:
            return None
        return "intrinsic subspace" if method == "subspace" else "random subspace"
    if method == "frozen" and not zero:
        return "frozen"
    if method == "full":
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

    Columns: id, group, seed, score, metric, n_trainable.
    """
    rows = []
    for _, run in runs.iterrows():
        if run.get("status") != "done" or not isinstance(run.get("config_json"), str):
            continue
        group = comparison_group(json.loads(run["config_json"]), source, outlier_file, random_files)
        if group is not None:
            rows.append(
                {
                    "id": run["id"],
                    "group": group,
                    "seed": run["seed"],
                    "score": run["score"],
                    "metric": run.get("metric"),
                    "n_trainable": run.get("n_trainable"),
                }
            )
    return pd.DataFrame(rows, columns=["id", "group", "seed", "score", "metric", "n_trainable"])


def summarise_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per group: n_seeds, mean score, score_sem = std(ddof=1)/√n (NaN with one seed), n_trainable."""
    columns = ["group", "n_seeds", "score", "score_sem", "n_trainable"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    scores = table.assign(score=pd.to_numeric(table["score"], errors="coerce"))
    out = (
        scores.groupby("group", sort=False)
        .agg(
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
    return out.sort_values("group", key=lambda s: s.map(order)).reset_index(drop=True)[columns]


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
