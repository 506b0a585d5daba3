"""Fine-tune: turn a choice of layers, heads or adapters into real training runs, and compare them
with the baselines the papers use."""

import streamlit as st

from ui.export import pick_run_recipe
from ui.finetune.form import chosen_l_star, launch_form
from ui.finetune.live import queue_view
from ui.finetune.results import results_view
from ui.finetune.state import get_db
from ui.loaders import get_data, get_model, show_error
from ui.nav import next_step
from ui.sidebar import describe, settings

st.title("Fine-tune")
st.markdown(
    "The layer and head analyses suggest what to tune; this page tests it. Each run fine-tunes a "
    "fresh copy of the model on the train part, picks its best state on the dev part and reports "
    "its score on the held-out **test** part, with its trainable parameters, wall-clock and peak "
    "memory. Runs are trained by a background worker, one after another, and kept for good in "
    "the runs database: page switches, reruns and closing the tab do not stop them."
)
with st.expander("What the strategies mean"):
    st.markdown(
        "A layer strategy is written (ℓ_bottom, ℓ_top, ℓ_cls): layers ℓ_bottom..ℓ_top train, all "
        "others stay frozen; the classifier (dense → tanh → linear on the pooled states) reads "
        "layer ℓ_cls and the layers above it are removed, so they cost no time or memory. "
        "ℓ* is the layer with the lowest task-specialty ν (Layers page). **ℓ*-down** tunes up to "
        "ℓ*; **ℓ*-up** tunes the layers above it, a deep classifier on top of ℓ*; the "
        "**baselines** are full fine-tuning (1, L, L) and tuning the top 1–3 layers. Other "
        "methods: **heads** (HiFi: only the selected heads' Q/K/V rows train), Houlsby "
        "**adapters**, **LoRA**, **BitFit** (biases only), **frozen** (classifier only)."
    )

try:
    cfg = settings()
    loaded = get_model(cfg.model)
except ValueError as exc:
    show_error(exc)
    st.stop()

db = get_db()
st.header("Launch")
st.caption(
    f"{describe(cfg, sample=False)} · L = {loaded.n_layers} layers, {loaded.n_heads} heads · max "
    "length and pooling come from the sidebar. On a CPU keep runs short (a few hundred steps); on "
    "a GPU the same code uses mixed precision."
)
try:
    get_data(cfg.data)  # refused here with the message every page gives, not in the worker
    launch_form(cfg, loaded, db)
except ValueError as exc:
    show_error(exc)

st.header("Queue (live)")
queue_view()

st.header("Results against baselines")
results_view(cfg.model.name, cfg.data.name, loaded.n_layers, chosen_l_star(cfg, loaded.n_layers))
st.caption("Every run, with its config and curves, is on the **Runs** page.")
pick_run_recipe(db, db.list_runs(model=cfg.model.name, data=cfg.data.name), "finetune_recipe")
next_step("views/finetune.py")
