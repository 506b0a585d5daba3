"""Heads: information richness, head-to-head correlation and PageRank head selection (HiFi)."""

import json

import streamlit as st

from analysis.heads.pagerank import initial_distribution, pagerank
from analysis.heads.select import analyse_heads, trainable_parameter_count
from ui.export import recipe_button
from ui.figures import heads as figures
from ui.heads import text
from ui.heads.attention import attention_view
from ui.heads.robustness import robustness_view
from ui.heads.runs import heads_runs_view
from ui.heads.state import get_head_stats, settings_form, stats_config
from ui.links import BIND
from ui.loaders import get_model, show_error
from ui.nav import next_step
from ui.sidebar import describe, settings
from ui.suggestions import remember_heads

st.title("Heads")
st.markdown(text.INTRO)
try:
    base = settings()
    loaded = get_model(base.model)
except ValueError as exc:
    show_error(exc)
    st.stop()

st.caption(describe(base, sample=False) + " · this page's own sample size n (below)")
n, xi, selection_cfg = settings_form(loaded.n_heads)
st.caption(text.SAMPLE_SIZES)
try:
    stats_cfg = stats_config(base, n, xi)
    stats, meta = get_head_stats(stats_cfg)
    result = analyse_heads(stats, selection_cfg)
except ValueError as exc:
    show_error(exc)
    st.stop()

count = trainable_parameter_count(result.selected, loaded.d_model, loaded.d_head, loaded.n_params)
selection = result.to_selection(
    loaded.name,
    {"data": base.data.name, "sample_seed": base.sample.seed, "max_length": base.max_length},
)
remember_heads(base, selection)  # the Fine-tune page's default, for this model and data only

c1, c2, c3, c4 = st.columns(4)
c1.metric("heads chosen", f"{selection.n_selected} of {loaded.n_layers * loaded.n_heads}")
c2.metric("n_trainable", f"{count.n_trainable:,}",
          help="The selected heads' rows of W_Q, W_K and W_V, and their biases.")  # fmt: skip
c3.metric("share of the encoder", f"{100 * count.share:.2f} %")
c4.metric("PageRank iterations", f"{result.iterations.min()}–{result.iterations.max()}")
source = "served from the cache" if meta["cache_hit"] else f"computed in {meta['seconds']:.1f} s"
st.caption(
    f"{loaded.name}: {loaded.n_layers} layers × {loaded.n_heads} heads, d_head {loaded.d_head}; "
    f"n = {stats.n} examples of {base.data.name}, max length {base.max_length}; statistics "
    f"{source} on {meta['device']}. n_trainable counts the selected heads' rows of W_Q, W_K, W_V "
    f"(each d_head × d_model) and their biases; the classifier comes on top. Per head: "
    f"3 · ({loaded.d_head} · {loaded.d_model} + {loaded.d_head}) = "
    f"{3 * (loaded.d_head * loaded.d_model + loaded.d_head):,} parameters."
)

# Only the chosen tab's content runs (Streamlit's lazy tabs: the bound key tracks the choice).
tab_rank, tab_attention, tab_rich, tab_corr, tab_robust, tab_runs = st.tabs(
    ["PageRank and selection", "What a head attends to", "Information richness", "Correlation",
     "Robustness", "PageRank vs random heads"], key="heads_tab", bind=BIND,
)  # fmt: skip
if tab_attention.open:
    with tab_attention:
        text.attention()
        attention_view(stats_cfg.extract, loaded, result)
if tab_rank.open:
    with tab_rank:
        text.pagerank()
        st.plotly_chart(figures.pagerank_heatmap(result.pagerank, result.selected), width="stretch")
        text.teleport_note()
        layer = st.select_slider(
            "layer (PageRank variants)",
            list(range(1, stats.n_layers + 1)),
            key="heads_layer",
            bind=BIND,
        )
        row = layer - 1
        both = {
            variant: pagerank(
                stats.richness[row],
                stats.correlation[row],
                selection_cfg.damping,
                selection_cfg.tol,
                variant,
            ).scores
            for variant in ("paper", "personalised")
        }
        p0 = initial_distribution(stats.richness[row])
        st.plotly_chart(
            figures.variant_bars(both["paper"], both["personalised"], p0, layer), width="stretch"
        )
if tab_rich.open:
    with tab_rich:
        text.richness()
        st.plotly_chart(
            figures.richness_heatmap(stats.richness, stats.richness_std), width="stretch"
        )
if tab_corr.open:
    with tab_corr:
        text.correlation()
        st.plotly_chart(figures.correlation_grid(stats.correlation), width="stretch")
if tab_robust.open:
    with tab_robust:
        text.robustness()
        robustness_view(base, result)
if tab_runs.open:
    with tab_runs:
        heads_runs_view(base, stats, selection_cfg, loaded, xi)

st.subheader("Export")
st.markdown(
    "The selection file lists the chosen heads of each layer with every setting that produced "
    "them; the Fine-tune page (method **heads**) and `python -m tunescope finetune` accept it. "
    "This page's selection is also the Fine-tune page's default."
)
table = result.heads_frame()
st.dataframe(table, hide_index=True, width="stretch", height=260)
c1, c2, c3 = st.columns(3)
c1.download_button(
    "Selection file (JSON)", selection.to_json(), "heads_selection.json", "application/json"
)
c2.download_button("Per-head table (CSV)", table.to_csv(index=False), "heads.csv", "text/csv")
full = {"settings": selection.settings, "n": stats.n, "layers": result.layers_table()}
c3.download_button(
    "Every layer, with correlations (JSON)",
    json.dumps(full),
    "heads_layers.json",
    "application/json",
)
recipe_button(base, {"selection": selection.settings}, "heads_recipe",
              "These heads as a recipe (zip)", method="heads",
              heads={str(k): list(v) for k, v in selection.layers},
              heads_settings=dict(selection.settings) or None)  # fmt: skip

next_step("views/heads.py")
