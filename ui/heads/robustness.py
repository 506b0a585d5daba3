"""The Heads page's robustness view: the same statistics under a second setting, side by side."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from analysis.config import ExtractConfig
from analysis.heads.select import HeadAnalysis, analyse_heads, rank_agreement, selection_overlap
from ui.figures import heads as figures
from ui.heads.state import get_head_stats, stats_config
from ui.links import BIND
from ui.loaders import show_error


def robustness_view(base: ExtractConfig, result: HeadAnalysis) -> None:
    """Compare ``result`` with a second run at another n or another max length."""
    stats = result.stats
    with st.form("heads_robust_form"):
        c1, c2, c3 = st.columns(3)
        keep = {"persist_state": "session", "bind": BIND}
        vary = c1.radio("change", ["sample size n", "max length"], key="heads_vary", **keep)
        other_n = c2.number_input("other n", min_value=2, max_value=20_000, value=1000, step=50,
                                  key="heads_other_n", **keep)  # fmt: skip
        other_len = c3.number_input("other max length", min_value=8, max_value=512, value=64,
                                    step=8, key="heads_other_len", **keep)  # fmt: skip
        if st.form_submit_button("Compare"):
            st.session_state["heads_compare"] = (vary, int(other_n), int(other_len))
    choice = st.session_state.get("heads_compare")
    if not choice:
        st.caption("Choose a second setting and press Compare (this runs the model once more).")
        return
    vary, other_n, other_len = choice
    if vary == "sample size n":
        other_cfg = stats_config(base, other_n, stats.xi)
        label_a, label_b = f"n = {stats.n}", f"n = {other_n}"
    else:
        other_cfg = stats_config(base, stats.n, stats.xi, max_length=other_len)
        label_a, label_b = f"max length {base.max_length}", f"max length {other_len}"
    try:
        other_stats, _ = get_head_stats(other_cfg, f"Head statistics ({label_b})")
        other = analyse_heads(other_stats, result.config)
    except ValueError as exc:
        show_error(exc)
        return

    tau_richness = rank_agreement(stats.richness, other_stats.richness)
    tau_pagerank = rank_agreement(result.pagerank, other.pagerank)
    overlap = selection_overlap(result.selected, other.selected)
    c1, c2, c3 = st.columns(3)
    c1.metric("Kendall τ of I_h (mean over layers)", f"{tau_richness.overall:.2f}")
    c2.metric("Kendall τ of PageRank", f"{tau_pagerank.overall:.2f}")
    c3.metric("chosen heads in common", f"{100 * np.mean(list(overlap.values())):.0f} %")
    st.plotly_chart(
        figures.agreement_bars({"I_h": tau_richness.per_layer, "PageRank": tau_pagerank.per_layer}),
        width="stretch",
    )
    st.plotly_chart(
        figures.richness_profiles(
            stats.richness, other_stats.richness, label_a, label_b,
            stats.richness_std, other_stats.richness_std,
        ),
        width="stretch",
    )  # fmt: skip
    table = pd.DataFrame(
        {
            "layer": np.arange(1, stats.n_layers + 1),
            "tau_richness": tau_richness.per_layer,
            "tau_pagerank": tau_pagerank.per_layer,
            "overlap": [overlap.get(layer, np.nan) for layer in range(1, stats.n_layers + 1)],
            f"selected ({label_a})": [
                str(result.selected.get(layer, [])) for layer in range(1, stats.n_layers + 1)
            ],
            f"selected ({label_b})": [
                str(other.selected.get(layer, [])) for layer in range(1, stats.n_layers + 1)
            ],
        }
    )
    st.dataframe(table, hide_index=True, width="stretch")
    st.download_button(
        "Download the comparison (CSV)",
        table.to_csv(index=False),
        "heads_robustness.csv",
        "text/csv",
    )
