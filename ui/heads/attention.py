"""The Heads page's "What a head attends to" view: one head's attention pattern on one example,
beside the head's information richness and PageRank. The layer, head and example live in the
link (``layer``, ``head``, ``example``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from analysis.config import ExtractConfig
from analysis.data import sample
from analysis.heads.attention import AttentionPattern, cached_attention_pattern
from analysis.heads.select import HeadAnalysis
from analysis.models import LoadedModel
from ui.figures import heads as figures
from ui.layers.view import shorten
from ui.links import BIND, check_page_link, publish, take_link, whole
from ui.loaders import get_data, show_error
from ui.memo import ProgressMemo

_PATTERNS: ProgressMemo[tuple[AttentionPattern, bool]] = ProgressMemo(max_entries=32)


def _pattern(
    fingerprint: str, text: str, pair: str | None, max_length: int, loaded: LoadedModel
) -> AttentionPattern:
    """One example's attention pattern: in this process, and on disk (a prepared lesson runs no
    model while the class follows)."""
    return _PATTERNS.get(
        (fingerprint, text, pair, max_length), "Running the model on the example",
        lambda progress: cached_attention_pattern(loaded, text, pair, max_length),
        served=lambda value: value[1],
    )[0]  # fmt: skip


def heads_sample(cfg: ExtractConfig) -> pd.DataFrame:
    """The examples the head statistics were computed on (text[, text_pair], label)."""
    return sample(get_data(cfg.data), cfg.sample).reset_index(drop=True)


def _forget_unless(key: str, allowed: range) -> None:
    """Start a widget on its default when the session holds a value it cannot take (a layer of
    the Layers page is 0..L, here 1..L; another model has fewer heads)."""
    value = st.session_state.get(key)
    if value is not None and value not in allowed:
        del st.session_state[key]


def attention_view(cfg: ExtractConfig, loaded: LoadedModel, result: HeadAnalysis) -> None:
    """Pick a layer, a head and an example (or type a text); show A_h as a token × token
    heatmap beside I_h, PageRank and whether the head is selected."""
    n_layers, n_heads = result.pagerank.shape
    rows = heads_sample(cfg)
    data = get_data(cfg.data)
    names = [
        data.label_names[int(v)] if data.task_type == "classification" else f"{v:.3g}"
        for v in rows["label"]
    ]
    for key, low, high, instead in (
        ("layer", 1, n_layers, "layer 1"),
        ("head", 0, n_heads - 1, "head 0"),
    ):
        check_page_link(
            key, lambda t, lo=low, hi=high: whole(t, lo, hi) is not None,
            f"is not within {low}..{high} here", instead,
        )  # fmt: skip
    last = len(rows) - 1
    take_link("example", lambda t: whole(t, 0, last), f"is not within 0..{last} here", "example 0")
    _forget_unless("layer", range(1, n_layers + 1))
    _forget_unless("head", range(n_heads))
    _forget_unless("example", range(len(rows)))
    c1, c2 = st.columns([1, 1])
    layer = c1.select_slider("layer", list(range(1, n_layers + 1)), key="layer", bind=BIND)
    head = c2.select_slider("head", list(range(n_heads)), key="head", bind=BIND)
    example = st.selectbox(
        f"example (of the n = {len(rows)} the statistics use)", list(range(len(rows))),
        format_func=lambda i: f"#{i} · {names[i]} · {shorten(rows.loc[i, 'text'], 100)}",
        key="example",
    )  # fmt: skip
    publish("example", example, 0)
    own = st.text_input(
        "…or type a text of your own", key="heads_own_text", placeholder="optional",
        persist_state="session", bind=BIND,
    )  # fmt: skip
    if own.strip():
        text, pair = own, None
    else:
        text = str(rows.loc[example, "text"])
        pair = str(rows.loc[example, "text_pair"]) if "text_pair" in rows else None
    try:
        pattern = _pattern(loaded.fingerprint, text, pair, cfg.max_length, loaded)
    except ValueError as exc:
        show_error(exc)
        return
    weights = pattern.head(layer, head)
    plot, numbers = st.columns([3, 1])
    plot.plotly_chart(
        figures.attention_heatmap(weights, pattern.tokens, layer, head), width="stretch"
    )
    row, stats = layer - 1, result.stats
    rank = int((result.pagerank[row] > result.pagerank[row, head]).sum()) + 1
    numbers.metric("information richness I_h", f"{stats.richness[row, head]:.2f}",
                   help=f"± {stats.richness_std[row, head]:.2f} over the n examples")  # fmt: skip
    numbers.metric("PageRank p*", f"{result.pagerank[row, head]:.4f}")
    numbers.metric("rank in its layer", f"{rank} of {n_heads}")
    numbers.metric("selected", "yes" if head in result.selected.get(layer, []) else "no")
    top = np.unravel_index(np.argsort(weights, axis=None)[::-1][:3], weights.shape)
    strongest = "; ".join(
        f"{pattern.tokens[i]} → {pattern.tokens[j]} ({weights[i, j]:.2f})"
        for i, j in zip(*top, strict=True)
    )
    st.caption(
        f"Row i is how token i spreads its attention over the {len(pattern.tokens)} tokens (each "
        f"row sums to 1; special tokens included, max length {cfg.max_length}). Strongest: "
        f"{strongest}. I_h and PageRank are this head's numbers over the whole sample; the "
        "pattern is one example's."
    )
