"""Finished runs as tables for the paper's figures: run groups (the seeds of one setting), means
± standard error over seeds, the Pareto frontier of score vs trainable parameters, the compute a
cut model saves, and the learning rate a sweep's grid chose on the dev part.

**Run groups** (docs/explanation/statistics.md, "Run groups: runs that count as seeds"): runs are
seeds of one another only when their configs agree in everything but the seed — model, data,
sample, method and its options (head selection and its selector, adapter / LoRA placement,
subspace source and kind), steps, learning rates, batch size, pooling, max length, zero-weights
file… (`run_setting`; the device a run happened to run on is not a setting). Each run's group
is stored with it (``group_key``: `analysis.runs.queue.RunQueue.enqueue`), and `group_of` finds
the group of a config not run yet; `summarise` averages only within a group, and every aggregate
carries ``n_seeds``. Runs that differ in anything else — even only in steps — are never pooled.

Pure pandas: the page and the CLI both use these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.cache import canonical_json
from analysis.compare import Arm
from analysis.finetune.registry import method_names
from analysis.finetune.stored import stored_layers
from analysis.runs.db import RunsDB
from analysis.runs.record import Run, runs_of, setting_digest, setting_key
from analysis.runs.records import RESULT_COLUMNS, run_label
from analysis.strategies import family_of, n_tuned_layers
from analysis.words import counted

# What makes two runs' costs and scores comparable across methods: the same task and budget.
BUDGET = ("model", "data", "steps", "batch_size", "max_length", "n_train", "n_eval",
          "eval_every", "pooling", "weight_decay", "warmup", "mixed_precision")  # fmt: skip


def group_of(config: Mapping[str, Any], runs: pd.DataFrame) -> str:
    """The run group a stored config (a planned run's, say) belongs to among ``runs`` (rows of
    ``RunsDB.list_runs``): the ``group_key`` of the runs with its setting key, else that key —
    the group `analysis.runs.queue.RunQueue.enqueue` would record it in."""
    key = setting_key(config)
    if "setting_key" in runs and len(runs):
        found = runs.loc[runs["setting_key"] == key, "group_key"].dropna()
        if len(found):
            return str(found.iloc[-1])  # list_runs is newest first: the oldest run's group
    return key


def budget_key(setting: Mapping[str, Any]) -> str:
    """Task and training budget of a setting (`BUDGET`): runs of different methods are compared
    (cost saved, "vs full fine-tuning") only within one budget."""
    return setting_digest({k: setting.get(k) for k in BUDGET})


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_short(v) for v in value)
    if isinstance(value, dict):
        return "#" + hashlib.sha256(canonical_json(value).encode()).hexdigest()[:4]
    return str(value)


def distinct_labels(settings: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """A label per group (group → setting) that tells every group apart: `run_label`, plus the
    settings in which groups sharing that label differ (``full · steps 100``)."""
    base = {group: run_label(setting) for group, setting in settings.items()}
    out = dict(base)
    by_label: dict[str, list[str]] = {}
    for group, label in base.items():
        by_label.setdefault(label, []).append(group)
    for label, groups in by_label.items():
        if len(groups) < 2:
            continue
        keys = sorted({k for g in groups for k in settings[g]})
        differing = [
            k for k in keys if len({canonical_json(settings[g].get(k)) for g in groups}) > 1
        ]
        for group in groups:
            parts = [f"{k} {_short(settings[group].get(k))}" for k in differing]
            out[group] = " · ".join([label, *parts])
    return out


RESULT_TABLE_COLUMNS = [
    "id",
    "model",
    "data",
    "method",
    "label",
    "family",
    "seed",
    "n_tuned_layers",
    *RESULT_COLUMNS,
    "sweep_id",
    "group",
    "lr",
    "classifier_lr",
    "lr_sibling",
    "budget",
    "zero_weights",
]
NUMERIC = ["n_tuned_layers", *(c for c in RESULT_COLUMNS if c != "metric"), "lr", "classifier_lr"]
SEM_OF = ("score", "wall_s", "step_time_s", "peak_mem_mb")  # aggregates drawn with error bars


def results_table(
    runs: pd.DataFrame, l_star: int | None = None, n_layers: int | None = None
) -> pd.DataFrame:
    """One row per completed run (``RunsDB.list_runs`` output in), with its family, the number
    of tuned layers, its run ``group`` (its ``group_key``), a ``label`` that tells groups apart
    (`distinct_labels`), its learning rates, and ``lr_sibling``: the group it would be without its
    body learning rate (runs of one learning-rate grid share it). A seed run twice in one group
    counts once, its newest run (`newest_per_seed`).

    family: the one recorded by the sweep that queued the run, else derived from its layers and
    ``l_star`` (`strategies.family_of`). ``n_layers`` (L) defaults to the largest
    ``layers_forward`` among the runs (the full model's depth whenever any run reads layer L).
    """
    done = runs[runs["status"] == "done"].copy() if "status" in runs else runs.copy()
    if done.empty:
        return pd.DataFrame(columns=RESULT_TABLE_COLUMNS)
    if n_layers is None:
        forward = pd.to_numeric(done["layers_forward"], errors="coerce")
        n_layers = int(forward.max()) if forward.notna().any() else None
    families, tuned, groups, settings, siblings, methods = [], [], [], {}, [], []
    references = method_names(lambda spec: spec.reference)
    for _, row in done.iterrows():
        run = Run.from_row(row)
        setting = run.setting
        groups.append(run.group)
        settings.setdefault(run.group, setting)
        siblings.append(setting_digest({k: v for k, v in setting.items() if k != "lr"}))
        layers = stored_layers(run.stored)
        method = run.method  # (1, L, L) layers runs: full
        methods.append(method)
        big_l = n_layers or (layers[2] if layers else 1)
        families.append(run.family or family_of(layers, method, l_star, big_l))
        count = n_tuned_layers(layers, method, big_l)
        if method in references and pd.notna(row.get("layers_backward")):
            count = int(row["layers_backward"])
        tuned.append(count)
    done["method"] = methods
    done["family"] = families
    done["n_tuned_layers"] = tuned
    done["group"] = groups
    labels = distinct_labels(settings)
    done["label"] = [labels[g] for g in groups]
    done["lr"] = [settings[g].get("lr") for g in groups]
    done["classifier_lr"] = [settings[g].get("classifier_lr") for g in groups]
    done["lr_sibling"] = siblings
    done["budget"] = [budget_key(settings[g]) for g in groups]
    done["zero_weights"] = [settings[g].get("zero_weights") for g in groups]
    for column in RESULT_TABLE_COLUMNS:
        if column not in done:
            done[column] = np.nan
    table = newest_per_seed(done[RESULT_TABLE_COLUMNS], "group").reset_index(drop=True)
    for column in NUMERIC:
        table[column] = pd.to_numeric(table[column], errors="coerce")
    return table


def newest_per_seed(table: pd.DataFrame, group: str = "group") -> pd.DataFrame:
    """One run per (run group, seed): the first row, which is the newest in ``RunsDB.list_runs``
    order. The same setting trained twice with the same seed (queued from two pages, say) is one
    seed, not two: counting it twice would shrink the standard error over seeds without any new
    evidence. Rows with an unknown seed are all kept. ``table.attrs["repeated_seeds"]`` counts
    the rows left out."""
    repeated = table.duplicated(subset=[group, "seed"], keep="first") & table["seed"].notna()
    out = table[~repeated]
    out.attrs["repeated_seeds"] = len(table) - len(out)
    return out


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Mean ± standard error over the seeds of each run group (`results_table`'s ``group``).

    X_sem = std(X, ddof=1) / sqrt(n_seeds) (NaN with one seed) for the score, wall-clock, step
    time and peak memory; other costs are means. The step time is the exception: ``step_time_s``
    is the *median* over seeds, because one run slowed by a busy machine drags a mean (and every
    step-time ratio built on it); ``step_time_s_mean`` keeps the mean, with its s.e.
    ``step_time_s_sem``. One row per group, its label, family, method, learning rates and
    ``lr_sibling`` taken from its runs (equal within a group, family aside: the first run's).
    """
    keys = ["group"]
    firsts = [
        "family",
        "method",
        "label",
        "lr",
        "classifier_lr",
        "lr_sibling",
        "budget",
        "zero_weights",
    ]
    columns = [
        *keys,
        "family",
        "method",
        "label",
        "n_seeds",
        "score",
        "score_sem",
        "dev_score",
        "n_tuned_layers",
        "n_trainable",
        "share",
        "layers_forward",
        "wall_s",
        "wall_s_sem",
        "step_time_s",
        "step_time_s_mean",
        "step_time_s_sem",
        "peak_mem_mb",
        "peak_mem_mb_sem",
        "lr",
        "classifier_lr",
        "lr_sibling",
        "budget",
        "zero_weights",
    ]
    if table.empty:
        return pd.DataFrame(columns=columns)
    grouped = table.groupby(keys, dropna=False, sort=False)
    means = {c: (c, "mean") for c in ("dev_score", "n_tuned_layers", "n_trainable", "share",
                                       "layers_forward")}  # fmt: skip
    stats = {}
    for c in SEM_OF:
        stats[c] = (c, "mean")
        stats[f"{c}_std"] = (c, "std")
    out = grouped.agg(
        n_seeds=("score", "count"),
        **{c: (c, "first") for c in firsts},
        **stats,
        **means,
        step_time_s_median=("step_time_s", "median"),
    ).reset_index()
    out["step_time_s_mean"] = out["step_time_s"]
    out["step_time_s"] = out["step_time_s_median"]
    for c in SEM_OF:
        n = table.groupby(keys, sort=False)[c].count().reindex(out["group"]).to_numpy()
        out[f"{c}_sem"] = out[f"{c}_std"] / np.sqrt(np.clip(n, 1, None))
        out.loc[n < 2, f"{c}_sem"] = np.nan
    return out[columns]


def group_arms(table: pd.DataFrame, runs: pd.DataFrame) -> dict[str, Arm]:
    """Each run group's `analysis.compare.Arm` (its test scores, and its per-example test
    predictions where every run recorded them). table: `results_table`; runs: the
    ``RunsDB.list_runs`` rows it came from (for ``result_json``)."""
    results = {run.id: run.result for run in runs_of(runs)} if "id" in runs else {}
    arms = {}
    for group, part in table.groupby("group", sort=False):
        records = []
        for run_id, score, metric in zip(part["id"], part["score"], part["metric"], strict=True):
            record = results.get(run_id) or {}
            records.append({"metric": metric, **record, "score": score})
        arms[str(group)] = Arm.from_results(str(part["label"].iloc[0]), records)
    return arms


def lr_choices(summary: pd.DataFrame) -> pd.DataFrame:
    """A sweep's learning-rate grid, chosen on the dev part (never test): among groups that differ
    only in the body learning rate (same ``lr_sibling``, ≥ 2 rates), the one with the best mean
    dev score. Columns: lr_sibling, group, label, lr, n_seeds, dev_score, score, score_sem,
    chosen. Empty when no grid was run."""
    columns = ["lr_sibling", "group", "label", "lr", "n_seeds", "dev_score", "score",
               "score_sem", "chosen"]  # fmt: skip
    if summary.empty:
        return pd.DataFrame(columns=columns)
    grids = summary.groupby("lr_sibling").filter(lambda g: g["lr"].nunique() >= 2).copy()
    if grids.empty:
        return pd.DataFrame(columns=columns)
    grids["chosen"] = False
    for _, part in grids.groupby("lr_sibling", sort=False):
        dev = pd.to_numeric(part["dev_score"], errors="coerce")
        if dev.notna().any():
            grids.loc[dev.idxmax(), "chosen"] = True
    return grids.sort_values(["lr_sibling", "lr"])[columns].reset_index(drop=True)


def without_unchosen_lrs(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with each learning-rate grid reduced to the rate chosen on dev (`lr_choices`);
    groups outside any grid stay."""
    choices = lr_choices(summary)
    if choices.empty:
        return summary
    dropped = set(choices.loc[~choices["chosen"], "group"])
    return summary[~summary["group"].isin(dropped)].reset_index(drop=True)


def pareto_front(n_trainable: ArrayLike, score: ArrayLike) -> np.ndarray:
    """Boolean mask of the points no other point beats: none has ≤ parameters and a higher score
    (or fewer parameters and an equal score). NaNs are never on the front."""
    x = np.asarray(n_trainable, dtype=float)
    y = np.asarray(score, dtype=float)
    mask = np.zeros(len(x), dtype=bool)
    valid = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    # Fewest parameters first; among equals, best score first.
    order = valid[np.lexsort((-y[valid], x[valid]))]
    best = -np.inf
    for i in order:
        if y[i] > best:
            mask[i] = True
            best = y[i]
    return mask


def compute_saved(summary: pd.DataFrame, n_layers: int | None = None) -> pd.DataFrame:
    """Cut models against full fine-tuning: for every layer strategy whose classifier reads
    ℓ_cls < L, its score next to the share of forward layers, step time and peak memory saved.

    saved = 1 − cost / cost(full fine-tuning), against the full fine-tuning group of the same task
    and budget (`budget_key`); a cut model without one is left out.
    """
    columns = [
        "label",
        "family",
        "score",
        "score_sem",
        "layers_forward",
        "layers_saved",
        "step_time_saved",
        "memory_saved",
    ]
    refs = full_references(summary)
    if refs.empty or summary.empty:
        return pd.DataFrame(columns=columns)
    big_l = n_layers or refs["layers_forward"].max()
    strategies = summary["method"].isin(method_names(lambda spec: spec.needs_layers))
    cut = summary[strategies & (summary["layers_forward"] < big_l)]
    cut = cut.merge(
        refs[["budget", "step_time_s", "peak_mem_mb"]], on="budget", suffixes=("", "_full")
    )
    if cut.empty:
        return pd.DataFrame(columns=columns)
    cut["layers_saved"] = 1 - cut["layers_forward"] / big_l
    cut["step_time_saved"] = 1 - cut["step_time_s"] / cut["step_time_s_full"]
    cut["memory_saved"] = 1 - cut["peak_mem_mb"] / cut["peak_mem_mb_full"]
    return cut[columns].sort_values("layers_forward").reset_index(drop=True)


def full_references(summary: pd.DataFrame) -> pd.DataFrame:
    """Per budget, the full fine-tuning group to compare against: the reference method (``full``,
    `MethodSpec.reference`) without zeroed weights; of several such groups (other learning rates,
    say), the one with the most seeds."""
    if summary.empty:
        return summary
    reference = summary["method"].isin(method_names(lambda spec: spec.reference))
    full = summary[reference & summary["zero_weights"].isna()]
    full = full.sort_values("n_seeds", ascending=False, kind="stable")
    return full.drop_duplicates("budget").reset_index(drop=True)


def estimate_step_time(
    runs: pd.DataFrame, model: str, method: str, label: str | None = None
) -> tuple[float | None, str]:
    """Seconds per step for a new run, from earlier completed runs, and where the figure comes
    from: the same label (same layers), else the same method, else any method on this model."""
    done = runs[(runs["status"] == "done") & (runs["model"] == model)]
    done = done[pd.to_numeric(done["step_time_s"], errors="coerce").notna()]
    candidates = []
    if label is not None:
        candidates.append(
            ("earlier run", "earlier runs", f" of {label}", done[done["label"] == label])
        )
    candidates.append(
        (f"earlier {method} run", f"earlier {method} runs", "", done[done["method"] == method])
    )
    candidates.append(("earlier run", "earlier runs", " of other methods on this model", done))
    for one, many, of, subset in candidates:
        if not subset.empty:
            median = float(subset["step_time_s"].median())
            return median, f"measured: median of {counted(len(subset), one, many)}{of}"
    return None, "no earlier run of this model"


def with_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """``RunsDB.list_runs`` rows with each run's ``group`` (its stored ``group_key``, in place of
    the key columns), a ``label`` recomputed from its config (older runs stored shorter labels)
    and how it was ``imported`` (`imported_as`), for listings and exports."""
    records = runs_of(runs) if "id" in runs else []
    out = runs.drop(columns=["group_key", "setting_key"], errors="ignore")
    tags = out["tags"] if "tags" in out else [""] * len(records)
    out["group"] = [run.group for run in records]
    out["label"] = [run_label(run.stored) for run in records]
    out["imported"] = [imported_as(run, t) for run, t in zip(records, tags, strict=True)]
    return out


# How a run trained outside tunescope came in (`analysis.runs.callback`): its origin's kind.
IMPORT_KINDS = {"trainer": "callback", "trainer-import": "folder"}


def imported_as(run: Run, tags: str | None = "") -> str:
    """``callback`` (recorded by ``TunescopeCallback`` in the user's own Trainer), ``folder``
    (``runs import`` of a Trainer output folder), ``no`` (trained by tunescope). The origin is
    read from the config, else from the result (a run that joined tunescope's groups keeps it
    there only), else the ``imported`` tag says ``yes``."""
    origin = run.stored.get("origin")
    kind = origin.get("kind") if isinstance(origin, dict) else origin
    kind = kind or (run.result or {}).get("origin")
    if kind:
        return IMPORT_KINDS.get(str(kind), str(kind))
    tagged = "imported" in str(tags or "").split(", ")  # analysis.runs.callback.IMPORTED_TAG
    return "yes" if tagged else "no"


def export_records(db: RunsDB, with_steps: bool = True, **filters: Any) -> list[dict[str, Any]]:
    """`RunsDB.export_records` (every matching run: config, result, note, tags, steps) with each
    run's ``group`` (its stored ``group_key``) and ``label`` (recomputed from its config, as
    `with_groups` does): what the Runs page's JSON download and ``runs export --json`` write."""
    records = db.export_records(with_steps=with_steps, **filters)
    for record in records:
        record["group"] = record.pop("group_key")
        record.pop("setting_key")
        record["label"] = run_label(record["config"])
    return records


def resolve_group(runs: pd.DataFrame, ref: str) -> pd.DataFrame:
    """The finished runs of a run group named by ``ref``: a group key (or a unique prefix of one),
    or a run id (or a unique part of one), which stands for that run's whole group. A clear
    ValueError when ``ref`` names nothing or several."""
    grouped = with_groups(runs[runs["status"] == "done"]) if not runs.empty else runs
    if grouped.empty:
        raise ValueError("No finished runs yet: nothing to compare.")
    by_group = grouped[grouped["group"].str.startswith(ref)]
    groups = set(by_group["group"])
    if not groups:
        ids = grouped[(grouped["id"] == ref) | grouped["id"].str.endswith(ref)]
        ids = ids if len(ids) else grouped[grouped["id"].str.startswith(ref)]
        if len(ids) > 1:
            raise ValueError(f"{ref!r} matches {len(ids)} runs; give more of the run id.")
        groups = set(ids["group"])
    if len(groups) != 1:
        what = "no finished run or group" if not groups else f"{len(groups)} groups"
        raise ValueError(
            f"{ref!r} matches {what}; see `python -m tunescope runs groups` (or `runs list`)."
        )
    return grouped[grouped["group"] == groups.pop()]
