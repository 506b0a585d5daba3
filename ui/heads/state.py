"""The Heads page's settings form and its cached head statistics.

Head statistics (the expensive part: a forward pass with per-head SVDs) are disk-cached by
analysis.heads.collect and kept in a small in-process LRU here, keyed by the HeadStatsConfig.
Everything else (PageRank, selection) is recomputed from them on each rerun: it is cheap.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import ExtractConfig, SampleSpec, to_dict
from analysis.heads.collect import HeadStatsConfig, head_stats
from analysis.heads.select import HeadSelectionConfig
from analysis.heads.selection_file import PAGERANK_VARIANTS, SCOPES, SELECTOR_LABELS, SELECTORS
from analysis.heads.stats import HeadStats
from ui import compute_pool
from ui.jobs import head_stats_job
from ui.loaders import get_model
from ui.memo import ProgressMemo

DEFAULTS: dict[str, Any] = {
    "heads_n": 300,
    "heads_xi": 0.9,
    "heads_damping": 0.85,
    "heads_k": 3,
    "heads_variant": "paper",
    "heads_scope": "layer-wise",
    "heads_selector": "pagerank",
    "heads_seed": 0,
}

KEEP = "session"  # the form keeps its values across page switches…
BIND = "query-params"  # …and in the link: a copied link opens the same selection
_STATS: ProgressMemo[tuple[HeadStats, dict[str, Any]]] = ProgressMemo(max_entries=6)


def settings_form(n_heads: int) -> tuple[int, float, HeadSelectionConfig]:
    """Draw the form; return (n, ξ, selection config) from the last submitted values."""
    state = st.session_state
    d = DEFAULTS
    if int(state.get("heads_k", d["heads_k"])) > n_heads:  # a k of a model with more heads
        state["heads_k"] = n_heads
    keep = {"persist_state": KEEP, "bind": BIND}
    with st.form("heads_form"):
        c1, c2, c3, c4 = st.columns(4)
        c1.number_input(
            "n examples", min_value=2, max_value=20_000, value=d["heads_n"], step=50,
            key="heads_n", help="Examples the statistics average over (the paper: 300). "
            "Not the sidebar's N: head statistics cost an SVD per head and example.", **keep,
        )  # fmt: skip
        c2.slider("ξ (singular-value mass)", 0.5, 1.0, d["heads_xi"], step=0.01, key="heads_xi",
                  **keep)  # fmt: skip
        c3.slider("damping d", 0.0, 0.99, d["heads_damping"], step=0.01, key="heads_damping",
                  **keep)  # fmt: skip
        c4.number_input("k heads per layer", min_value=1, max_value=n_heads,
                        value=min(d["heads_k"], n_heads), key="heads_k", **keep)  # fmt: skip
        c1, c2, c3, c4 = st.columns([1, 1, 1.7, 0.9])  # the selectors' names are long
        c1.selectbox("PageRank teleport", PAGERANK_VARIANTS, key="heads_variant", **keep)
        c2.selectbox("layers", SCOPES, key="heads_scope", **keep)
        c3.selectbox("selector", SELECTORS, key="heads_selector",
                     format_func=SELECTOR_LABELS.get, **keep)  # fmt: skip
        c4.number_input("seed (random selector)", min_value=0, value=d["heads_seed"], step=1,
                        key="heads_seed", **keep)  # fmt: skip
        st.form_submit_button("Apply", type="primary")
    for key, value in DEFAULTS.items():  # (a widget not drawn yet this session: its default)
        state.setdefault(key, value)
    config = HeadSelectionConfig(
        k=int(state["heads_k"]),
        damping=float(state["heads_damping"]),
        variant=state["heads_variant"],
        scope=state["heads_scope"],
        selector=state["heads_selector"],
        seed=int(state["heads_seed"]),
    )
    return int(state["heads_n"]), float(state["heads_xi"]), config


def stats_config(
    base: ExtractConfig, n: int, xi: float, max_length: int | None = None
) -> HeadStatsConfig:
    """The sidebar's model, data and seed with this page's n, ξ (and optionally max length)."""
    extract = dataclasses.replace(
        base,
        sample=SampleSpec(n=n, seed=base.sample.seed),
        max_length=max_length or base.max_length,
    )
    return HeadStatsConfig(extract, xi=xi)


def get_head_stats(cfg: HeadStatsConfig, label: str = "Head statistics") -> tuple[HeadStats, dict]:
    """(stats, meta) from memory, the disk cache, or a forward pass with a progress bar."""

    def run(progress):
        if compute_pool.enabled():  # in a compute worker (ui/compute_pool.py)
            return compute_pool.compute(head_stats_job, cfg, progress=progress)
        return head_stats(cfg, progress=progress, loaded=get_model(cfg.extract.model))

    return _STATS.get(
        canonical_json(to_dict(cfg)),
        label,
        run,
        served=lambda value: bool(value[1].get("cache_hit")),
    )
