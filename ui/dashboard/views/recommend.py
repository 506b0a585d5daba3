"""Recommend: what to tune for this model and data, what it costs, the evidence — and, tested
against what a practitioner would otherwise do at the same budget, the answer in one sentence."""

import streamlit as st

from ui.loaders import get_model, show_error
from ui.nav import next_step
from ui.recommend.state import get_recommendation, settings_form
from ui.recommend.view import candidates_view, comparison_view
from ui.sidebar import describe, settings
from ui.verdicts import explain

st.title("Recommend")
st.markdown(
    "**Which layers and heads should I tune, and what does that buy?** This page runs (or reuses) "
    "the layer and head analyses for the sidebar's model, data and sample, proposes "
    "**candidates** — layers up to ℓ\\*, layers up to where the linear probe levels off, the "
    "top PageRank heads, LoRA ranks allocated by the probe's gain per layer — each with what it "
    "trains, its trainable share and its measured step time, and the evidence it rests on. "
    "**Test these** trains them, over several seeds, against full fine-tuning and against what "
    "you would do anyway at the same budget: the last k layers, k random layers, the k layers "
    "of highest weight signal-to-noise ratio (Spectrum), uniform LoRA, PEFT's EVA, BitFit."
)
with st.expander("How the recommendation is decided"):
    st.markdown(
        "**The budget**: a choice's trainable share (its trainable parameters, classifier "
        "included, over the model's) and its step time as a share of full fine-tuning's (the "
        "median of a few timed steps on one batch). An alternative is at a candidate's budget "
        "when its trainable count is within ±10 %; the table says when it is not, and by how "
        "much. **The sentence**: the cheapest arm (step time, then trainable share) whose "
        "difference to full fine-tuning is not shown worse by more than δ — the lower end of "
        "diff − t·se is at least −δ. If none: *too few seeds to tell* while some interval still "
        "reaches above −δ, else *no cheaper choice held up: fine-tune the whole model*."
    )
    explain()

try:
    base = settings()
    st.caption(describe(base))
    get_model(base.model)
    cfg = settings_form(base)
    rec = get_recommendation(cfg)
except ValueError as exc:
    show_error(exc)
    st.stop()
candidates_view(rec)
comparison_view(rec)
next_step("views/recommend.py")
