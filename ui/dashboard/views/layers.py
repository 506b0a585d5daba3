"""Layers: per-layer task-specialty ν, CCA, rank ϱ and probes; ℓ*, what-ifs, a teaching view."""

import json

import streamlit as st

from analysis.layers.metrics import DEFAULT_BINS
from analysis.layers.repeats import DEFAULT_REPEATS, add_repeats, summarise_repeats
from analysis.layers.table import report, summary
from ui.datasets import data_label
from ui.export import recipe_button
from ui.figures import layers as figures
from ui.layers import text
from ui.layers.state import get_layer_metrics, get_layer_repeats
from ui.layers.view import layer_picture, metrics_figure, suggestion, teaching_view
from ui.layers.whatif import whatif_view
from ui.links import BIND
from ui.loaders import get_states, show_error
from ui.nav import next_step
from ui.sidebar import describe, settings
from ui.suggestions import remember_l_star

st.title("Layers")
st.markdown(text.INTRO)
# Only the chosen tab's content runs (Streamlit's lazy tabs: the bound key tracks the choice).
tab_metrics, tab_picture, tab_whatif, tab_teach = st.tabs(
    ["Metrics and ℓ*", "Layer picture", "What-ifs", "Teaching view"], key="layers_tab", bind=BIND
)
if tab_teach.open:
    with tab_teach:
        text.teaching()
        teaching_view()  # needs no model: works even when the sidebar settings do not

try:
    cfg = settings()
    states = get_states(cfg)
    df, hit = get_layer_metrics(states, cfg.sample.seed, DEFAULT_BINS)
except ValueError as exc:
    for tab in (tab_metrics, tab_picture, tab_whatif):
        if tab.open:
            with tab:
                show_error(exc)
    st.stop()

summ = summary(df)
result = report(cfg, df, hit)
if summ["l_star"] is not None:  # the Fine-tune page's default ℓ*, for exactly this extraction
    remember_l_star(cfg, summ["l_star"])

if tab_picture.open:
    with tab_picture:
        st.markdown(
            "Each dot is one example's pooled state at the chosen layer, projected to 2-D and coloured "
            "by its label. Move the slider and watch the classes pull apart (or not) layer by layer."
        )
        layer_picture(states, df, summ["l_star"], cfg.sample.seed)

if tab_whatif.open:
    with tab_whatif:
        text.whatifs()
        whatif_view(cfg, states.task_type == "classification", DEFAULT_BINS)

if tab_metrics.open:
    with tab_metrics:
        st.caption(describe(cfg))
        n_repeats = st.number_input(
            "Bootstrap repeats R (1 = the single table; intervals from R ≥ 50)", 1, 200,
            DEFAULT_REPEATS, key="layers_repeats", bind=BIND,
            help="Bootstrap resamples of the N extracted examples (the extraction is not repeated). "
            "ν, CCA and ϱ are recomputed on each; the probe's out-of-fold predictions are resampled, "
            "not refit (so its interval leaves out the refit's own variation). 90 % BCa intervals "
            "around the full-sample values need R ≥ 50; fewer give bootstrap s.e. only.",
        )  # fmt: skip
        rep = reps = se = None
        above, figure = st.container(), st.empty()
        if n_repeats > 1:  # the metrics first; the repeats' bands replace them when they are done
            figure.plotly_chart(metrics_figure(df, summ["l_star"], states.metric), width="stretch")
            try:
                rep, _ = get_layer_repeats(states, cfg.sample.seed, int(n_repeats), DEFAULT_BINS)
            except ValueError as exc:
                show_error(exc)
            else:
                reps, se = summarise_repeats(rep), rep.standard_errors()
                result = add_repeats(result, rep)
        with above:
            suggestion(summ, df, states.n_layers, reps)
            if summ["l_star"] is not None:  # ℓ*-down as a recipe for the user's own training
                l_star = int(summ["l_star"])
                recipe_button(cfg, {"l_star": l_star, "layers": [1, l_star, l_star]},
                              "layers_recipe", "ℓ*-down (1, ℓ*, ℓ*) as a recipe (zip)",
                              method="layers", layers=(1, l_star, l_star))  # fmt: skip
            if df.attrs.get("label_note"):
                st.warning(df.attrs["label_note"], icon=":material/info:")
        if se is not None or n_repeats <= 1:
            figure.plotly_chart(
                metrics_figure(df, summ["l_star"], states.metric, se), width="stretch"
            )
        rho = summ["rho"]
        c1, c2, c3, c4 = st.columns(4)
        count = None if reps is None else reps.l_star_counts.get(summ["l_star"], 0)
        c1.metric(
            "ℓ*", "-" if summ["l_star"] is None else summ["l_star"], delta_color="off",
            delta_arrow="off", delta=None if count is None else f"in {count} of {reps.repeats} repeats",
        )  # fmt: skip
        if reps is None:
            c2.metric(
                "ζ (smoothness of ν)", "-" if result["zeta"] is None else f"{summ['zeta']:.3g}"
            )
            c3.metric("ρ(ν, s)", text.signed(rho["nu"], 3))
            c4.metric(
                "ρ(CCA, s) / ρ(ϱ, s)", " / ".join(text.signed(rho[k]) for k in ("cca", "rank"))
            )
        else:
            c2.metric("ζ (smoothness of ν)", *text.tile(reps.zeta, signed=False), delta_color="off",
                      delta_arrow="off")  # fmt: skip
            for col, m, name in ((c3, "nu", "ρ(ν, s)"), (c4, "cca", "ρ(CCA, s)")):
                col.metric(name, *text.tile(reps.rho[m]), delta_color="off", delta_arrow="off")
            st.caption(
                "Tiles: the full-sample estimate, below it its 90 % bootstrap interval (BCa) from "
                f"R = {reps.repeats} repeats, shown only with R ≥ 50 and when the bootstrap can "
                "centre one on the estimate (else ± one bootstrap s.e.). " + " ".join(
                    f"{name}: {reps.rho[m].note}." for m, name in (("nu", "ρ(ν, s)"), ("cca", "ρ(CCA, s)"))
                    if reps.rho[m].note
                )
            )  # fmt: skip
            st.plotly_chart(
                figures.l_star_shares(reps.l_star_counts, states.n_layers, reps.repeats),
                width="stretch",
            )
            st.caption(text.X1_AND_THE_LAYERS_PAGE)
        source = (
            "served from the cache" if hit else f"computed in {df.attrs.get('seconds', 0):.1f} s"
        )
        st.caption(
            f"{cfg.model.name}: {states.n_layers} layers, d_model {states.d_model}; N = {states.n} examples "
            f"of {data_label(cfg.data.name)} ({cfg.sample.part} part, seed {cfg.sample.seed}), {cfg.pooling} pooling; "
            f"probe metric {states.metric}; metrics {source}. One seeded 80/10/10 split serves CCA; the probe is scored by 5-fold cross-validated predictions over all N"
            + (f"; ± : bootstrap standard errors over {n_repeats} resamples." if reps else ".")
            + (f" {df.attrs['route_note']}" if df.attrs.get("route_note") else "")
        )
        shown = (
            df
            if se is None
            else (
                df.drop(columns=["probe_se"])
                .merge(se, on="layer")
                .merge(rep.intervals(), on="layer")
            )
        )
        shown = shown.copy()
        shown.attrs = {}  # the probe predictions kept there are no part of the table
        st.dataframe(
            shown, hide_index=True, width="stretch", column_config=text.column_labels(shown)
        )
        d1, d2 = st.columns(2)
        d1.download_button("Table (CSV)", shown.to_csv(index=False), "layers.csv", "text/csv")
        d2.download_button(
            "Everything (JSON)", json.dumps(result), "layers.json", "application/json"
        )
        with st.expander("What the metrics mean (formulas)", expanded=True):
            for explain in (text.nu, text.cca, text.rank, text.probe, text.zeta, text.repeats):
                explain()

next_step("views/layers.py")
