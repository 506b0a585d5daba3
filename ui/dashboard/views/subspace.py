"""Subspaces: fine-tuning trajectories, their intrinsic subspace and its outlier weights (paper 003)."""

import json

import streamlit as st

from ui.figures import subspace as figures
from ui.finetune.state import get_db
from ui.links import BIND
from ui.loaders import get_data, get_model, show_error
from ui.nav import next_step
from ui.sidebar import describe, settings
from ui.subspace.live import follow_runs, remember_done
from ui.subspace.runs import comparison_view, pick_run
from ui.subspace.state import get_report, layer_param_counts

st.title("Subspaces")
st.markdown(
    "Fine-tuning moves millions of weights, yet the path it takes lies close to a space of a few "
    "dimensions. This page records that path (a *trajectory*), finds its principal directions, "
    "trains inside them, and looks at the few weights that move far more than the rest "
    "(*outlier dimensions*)."
)
try:
    cfg = settings()
    layer_params = layer_param_counts(get_model(cfg.model))
    get_data(cfg.data)  # a bad file is refused here, with the message every page gives
except ValueError as exc:
    show_error(exc)
    st.stop()
db = get_db()
st.caption(describe(cfg, sample=False))
remember_done(cfg.model.name)
follow_runs(cfg.model.name)  # queued and running runs, live; the page redraws when one finishes

st.header("1. A fine-tuning trajectory")
run = pick_run(db, cfg, layer_params)
if run is None:
    next_step("views/subspace.py")
    st.stop()
centre = st.toggle("Centre the snapshots instead of subtracting θ₀", key="sub_centre", bind=BIND)
try:
    report = get_report(run["trajectory_dir"], centre)
except ValueError as exc:
    show_error(exc)
    st.stop()
payload = report.to_dict() | {"run": run["id"]}

st.header("2. The spectrum of each layer's trajectory")
st.markdown(
    "Every k steps each layer's weights are flattened into one vector θ ∈ ℝᴰ. Stacking the moves "
    "from the start gives a t × D matrix per layer; its singular values say how many directions "
    "the trajectory really uses. Computed through the small t × t Gram matrix, one layer at a "
    "time, straight from the snapshot files."
)
st.latex(
    r"W = \begin{bmatrix}\theta_1-\theta_0\\ \vdots\\ \theta_t-\theta_0\end{bmatrix},\quad "
    r"W W^\top = U S^2 U^\top,\quad V = W^\top U S^{-1}\in\mathbb{R}^{D\times t}"
)
st.plotly_chart(figures.spectrum(payload["layers"]), width="stretch")
counts = ", ".join(f"layer {e['layer']}: {e['n_directions_90']}" for e in payload["layers"])
st.caption(f"Directions holding 90% of Σ s² — {counts} (of t = {payload['t']}).")

st.header("3. Outlier dimensions of the learned update")
st.markdown(
    "The learned update of a layer, u, is a vector with one entry per weight. Most entries are "
    "small; a few stand out by more than three standard deviations. For a run trained inside "
    "the intrinsic subspace, u = V θ̄ is the paper's update; for plain fine-tuning it is the "
    "final move θ_t − θ₀ (here projected on V, which leaves it unchanged)."
)
st.latex(
    r"u = V\bar\theta,\qquad \text{outlier: } |u_i - \operatorname{mean}(u)| > 3\,\operatorname{std}(u)"
)
std = {lo.layer: lo.std for lo in report.outliers}
table = report.outlier_table()
st.plotly_chart(figures.update_map(report.profiles, std, table), width="stretch")
st.caption(
    "Each cell is the largest |u_i| / std(u) over a run of consecutive weights (sorted parameter "
    "names, row-major); red crosses mark each layer's top outliers."
)
st.dataframe(table.drop(columns=["index", "n_params"]), hide_index=True, width="stretch")
c1, c2 = st.columns(2)
c1.download_button(
    "Download the top outliers (CSV)", table.to_csv(index=False), "outliers.csv", "text/csv"
)
c2.download_button(
    "Download the report (JSON)", json.dumps(payload, indent=1), "subspace.json", "application/json"
)
st.markdown(
    "**Recurring hidden dimensions.** The residual-stream index (0..d_model − 1) each top outlier "
    "reads from or writes to; an index that recurs across layers is the paper's O1."
)
recurring = [r for r in payload["recurring"] if r["n_layers"] > 1]
if recurring:
    st.plotly_chart(figures.recurring_dims(recurring), width="stretch")
else:
    st.caption("No residual-stream index recurs among the top outliers of two or more layers.")

st.header("4. Does the subspace matter?")
st.markdown(
    "Fine-tuning each layer only inside V — θ = θ₀ + V · mean(θ₁..θ₁₆), sixteen trainable "
    "vectors of t numbers — against a random subspace of the same size, a frozen encoder and full "
    "fine-tuning; and full fine-tuning with the outlier weights set to zero against as many random "
    "weights set to zero. Bars: mean test score over seeds, ± standard error."
)
st.latex(r"\theta_{\text{layer}} = \theta_0 + V\,\frac{1}{h}\sum_{j=1}^{h}\theta_j,\quad h = 16")
try:
    comparison_view(db, cfg, run, report, layer_params)
except ValueError as exc:
    show_error(exc)
next_step("views/subspace.py")
