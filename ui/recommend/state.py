"""The Recommend page's settings form and its cached recommendation (analyses, choices, costs)."""

from __future__ import annotations

import dataclasses

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import ExtractConfig
from analysis.recommend.config import Budget, RecommendConfig
from analysis.recommend.recommendation import Recommendation, recommend
from ui.loaders import get_model
from ui.memo import ProgressMemo

_RECOMMENDATIONS: ProgressMemo[Recommendation] = ProgressMemo(max_entries=4)
BUDGETS = {"none": "no limit: the cheapest that holds up", "params": "trainable share ≤",
           "time": "step time (× full) ≤"}  # fmt: skip
DEFAULTS = {"rec_budget": "none", "rec_budget_value": 10.0, "rec_seeds": 3, "rec_steps": 200,
            "rec_batch_size": 16, "rec_n_train": 0, "rec_n_eval": 1000, "rec_eval_every": 50,
            "rec_delta": 1.0, "rec_repeats": 50, "rec_heads_n": 300, "rec_lora_r": 8,
            "rec_timed_steps": 5}  # fmt: skip
KEEP = "session"  # the form keeps its values across page switches


def settings_form(base: ExtractConfig) -> RecommendConfig:
    """The sidebar's model, data and sample with this page's budget and run settings."""
    state = st.session_state
    for key, value in DEFAULTS.items():
        state.setdefault(key, value)
    with st.form("rec_form"):
        b1, b2, c1, c2, c3 = st.columns([2, 1, 1, 1, 1])
        b1.radio("Budget", list(BUDGETS), format_func=BUDGETS.get, key="rec_budget",
                 persist_state=KEEP, horizontal=True)  # fmt: skip
        b2.number_input(
            "share (%)", 0.1, 100.0, step=1.0, key="rec_budget_value", persist_state=KEEP,
            help="Trainable parameters as a % of the model's, or step time as a % of full "
            "fine-tuning's; ignored without a budget.",
        )  # fmt: skip
        c1.number_input("seeds per arm", 1, 10, key="rec_seeds", persist_state=KEEP,
                        help="A verdict needs ≥ 2 seeds a side; 3 is the default "
                        "(t ≈ 2.8–4.3 with 3 a side).")  # fmt: skip
        c2.number_input("steps per run", 1, 100_000, step=50, key="rec_steps", persist_state=KEEP)
        c3.number_input(
            "δ (points)", 0.1, 50.0, step=0.5, key="rec_delta", persist_state=KEEP,
            help="How much worse than full fine-tuning (in points of the metric, 1 point = "
            "0.01) a cheaper choice may be and still hold up: its interval's lower end ≥ −δ.",
        )  # fmt: skip
        with st.expander("More settings"):
            m = st.columns(4)
            m[0].number_input("batch size", 1, 4096, key="rec_batch_size", persist_state=KEEP)
            m[1].number_input("train examples (0: all)", 0, 10_000_000, step=100,
                              key="rec_n_train", persist_state=KEEP)  # fmt: skip
            m[2].number_input("dev / test examples", 1, 1_000_000, step=100, key="rec_n_eval",
                              persist_state=KEEP)  # fmt: skip
            m[3].number_input("dev score every k steps", 1, 100_000, key="rec_eval_every",
                              persist_state=KEEP)  # fmt: skip
            m = st.columns(4)
            m[0].number_input("bootstrap repeats (ℓ* counts)", 1, 500, key="rec_repeats",
                              persist_state=KEEP)  # fmt: skip
            m[1].number_input("head statistics: n examples", 2, 20_000, step=50,
                              key="rec_heads_n", persist_state=KEEP)  # fmt: skip
            m[2].number_input("LoRA rank r (total r · L)", 1, 1024, key="rec_lora_r",
                              persist_state=KEEP)  # fmt: skip
            m[3].number_input("timed steps per choice", 1, 100, key="rec_timed_steps",
                              persist_state=KEEP)  # fmt: skip
        st.form_submit_button("Apply", type="primary")
    kind = state["rec_budget"]
    budget = Budget() if kind == "none" else Budget(kind, float(state["rec_budget_value"]) / 100)
    return RecommendConfig(
        model=base.model, data=base.data, budget=budget, n=base.sample.n,
        sample_seed=base.sample.seed, pooling=base.pooling, max_length=base.max_length,
        repeats=int(state["rec_repeats"]), heads_n=int(state["rec_heads_n"]),
        lora_r=int(state["rec_lora_r"]), seeds=tuple(range(int(state["rec_seeds"]))),
        steps=int(state["rec_steps"]), batch_size=int(state["rec_batch_size"]),
        n_train=int(state["rec_n_train"]) or None, n_eval=int(state["rec_n_eval"]),
        eval_every=int(state["rec_eval_every"]), delta=float(state["rec_delta"]),
        timed_steps=int(state["rec_timed_steps"]),
    )  # fmt: skip


def get_recommendation(cfg: RecommendConfig) -> Recommendation:
    """The analyses (disk-cached), the choices and their measured costs, once per settings, with
    a progress bar. The comparison's seeds and δ change nothing here, so they are left out of
    the key."""
    key = dataclasses.replace(cfg, seeds=(0,), delta=1.0)
    rec = _RECOMMENDATIONS.get(
        canonical_json(dataclasses.asdict(key)),
        "Analyses, candidates and their costs",
        lambda progress: recommend(cfg, get_model(cfg.model), progress=progress),
    )
    return dataclasses.replace(rec, cfg=cfg)  # this view's seeds and δ
