"""Finished runs as tables for the paper's figures: per-run results, means ± standard error over
seeds, the Pareto frontier of score vs trainable parameters, and the compute a cut model saves.

Pure pandas: the page and the CLI both use these.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.runs.db import RESULT_COLUMNS
from analysis.strategies import family_of, n_tuned_layers

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
]
NUMERIC = ["n_tuned_layers", *(c for c in RESULT_COLUMNS if c != "metric")]


def results_table(
    runs: pd.DataFrame, l_star: int | None = None, n_layers: int | None = None
) -> pd.DataFrame:
    """One row per completed run (``RunsDB.list_runs`` output in), with its family and the number
    of tuned layers.

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
    families, tuned = [], []
    for _, row in done.iterrows():
        config = _config(row)
        layers = config.get("layers")
        method = str(row["method"])
        big_l = n_layers or (int(layers[2]) if layers else 1)
        stored = row.get("strategy")
        families.append(
            stored
            if isinstance(stored, str) and stored
            else family_of(layers, method, l_star, big_l)
        )
        count = n_tuned_layers(layers, method, big_l)
        if method == "full" and pd.notna(row.get("layers_backward")):
            count = int(row["layers_backward"])
        tuned.append(count)
    done["family"] = families
    done["n_tuned_layers"] = tuned
    for column in RESULT_TABLE_COLUMNS:
        if column not in done:
            done[column] = np.nan
    table = done[RESULT_TABLE_COLUMNS].reset_index(drop=True)
    for column in NUMERIC:
        table[column] = pd.to_numeric(table[column], errors="coerce")
    return table


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Mean ± standard error over seeds per (family, method, label).

    score_sem = std(score, ddof=1) / sqrt(n_seeds) (NaN with one seed); costs are means.
    """
    keys = ["family", "method", "label"]
    columns = [
        *keys,
        "n_seeds",
        "score",
        "score_sem",
        "n_tuned_layers",
        "n_trainable",
        "share",
        "layers_forward",
        "wall_s",
        "step_time_s",
        "peak_mem_mb",
    ]
    if table.empty:
        return pd.DataFrame(columns=columns)
    grouped = table.groupby(keys, dropna=False, sort=False)
    out = grouped.agg(
        n_seeds=("score", "count"),
        score=("score", "mean"),
        score_std=("score", "std"),
        n_tuned_layers=("n_tuned_layers", "mean"),
        n_trainable=("n_trainable", "mean"),
        share=("share", "mean"),
        layers_forward=("layers_forward", "mean"),
        wall_s=("wall_s", "mean"),
        step_time_s=("step_time_s", "mean"),
        peak_mem_mb=("peak_mem_mb", "mean"),
    ).reset_index()
    out["score_sem"] = out["score_std"] / np.sqrt(out["n_seeds"].clip(lower=1))
    out.loc[out["n_seeds"] < 2, "score_sem"] = np.nan
    return out[columns]


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
    ℓ_head < L, its score next to the share of forward layers, step time and peak memory saved.

    saved = 1 − cost / cost(full fine-tuning) (same data, model and budget assumed).
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
    full = summary[summary["method"] == "full"]
    if full.empty or summary.empty:
        return pd.DataFrame(columns=columns)
    ref = full.iloc[0]
    big_l = n_layers or ref["layers_forward"]
    cut = summary[(summary["method"] == "layers") & (summary["layers_forward"] < big_l)].copy()
    if cut.empty:
        return pd.DataFrame(columns=columns)
    cut["layers_saved"] = 1 - cut["layers_forward"] / big_l
    cut["step_time_saved"] = 1 - cut["step_time_s"] / ref["step_time_s"]
    cut["memory_saved"] = 1 - cut["peak_mem_mb"] / ref["peak_mem_mb"]
    return cut[columns].sort_values("layers_forward").reset_index(drop=True)


def estimate_step_time(
    runs: pd.DataFrame, model: str, method: str, label: str | None = None
) -> tuple[float | None, str]:
    """Seconds per step for a new run, from earlier completed runs, and where the figure comes
    from: the same label (same layers), else the same method, else any method on this model."""
    done = runs[(runs["status"] == "done") & (runs["model"] == model)]
    done = done[pd.to_numeric(done["step_time_s"], errors="coerce").notna()]
    candidates = []
    if label is not None:
        candidates.append((f"earlier run(s) of {label}", done[done["label"] == label]))
    candidates.append((f"earlier {method} run(s)", done[done["method"] == method]))
    candidates.append(("earlier run(s) of other methods on this model", done))
    for what, subset in candidates:
        if not subset.empty:
            return float(
                subset["step_time_s"].median()
            ), f"measured: median of {len(subset)} {what}"
    return None, "no earlier run of this model"


def _config(row: pd.Series) -> dict[str, Any]:
    raw = row.get("config_json")
    if isinstance(raw, str):
        return json.loads(raw)
    config = row.get("config")
    return config if isinstance(config, dict) else {}
