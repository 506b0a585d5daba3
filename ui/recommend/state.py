"""The Recommend page's settings form and its cached recommendation (analyses, choices, costs).

The recommendation is computed in the compute workers (`ui.compute_pool`), as every page's
computations are: the extraction in one, the layer tables fanned out over them, then the rest —
the head statistics, the choices and their costs — in one (`ui.jobs.recommendation_job`).
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import ExtractConfig, default_of, help_of
from analysis.progress import Progress, scaled
from analysis.recommend.config import Budget, RecommendConfig
from analysis.recommend.evidence import layer_evidence
from analysis.recommend.recommendation import Recommendation, recommend
from ui import compute_pool
from ui.jobs import recommendation_job
from ui.loaders import get_model, get_states
from ui.memo import ProgressMemo

_RECOMMENDATIONS: ProgressMemo[Recommendation] = ProgressMemo(max_entries=4)
BUDGETS = {"none": "no limit: the cheapest that holds up", "params": "trainable share ≤",
           "time": "step time (× full) ≤"}  # fmt: skip
# The form's settings with RecommendConfig's defaults (the command line's too).
SETTINGS = ("steps", "batch_size", "n_eval", "eval_every", "delta", "repeats", "heads_n",
            "lora_r", "timed_steps", "design", "max_seeds")  # fmt: skip
DESIGNS = {"sequential": "sequential rounds, cheapest first", "fixed": "fixed grid",
           "whole-table": "every arm to the most seeds"}  # fmt: skip
DEFAULTS = {
    "rec_budget": "none", "rec_budget_value": 10.0,
    "rec_seeds": len(default_of(RecommendConfig, "seeds")),  # seeds 0 … n − 1
    "rec_n_train": default_of(RecommendConfig, "n_train") or 0,  # 0: all
    **{f"rec_{name}": default_of(RecommendConfig, name) for name in SETTINGS},
}  # fmt: skip
KEEP = "session"  # the form keeps its values across page switches


def settings_form(base: ExtractConfig) -> RecommendConfig:
    """The sidebar's model, data and sample with this page's budget and run settings."""
    state = st.session_state
    for key, value in DEFAULTS.items():
        state.setdefault(key, value)
    with st.form("rec_form"):
        b1, b2, c0, c1, c4, c2, c3 = st.columns([2, 1, 1.4, 1, 1, 1, 1])
        b1.radio("Budget", list(BUDGETS), format_func=BUDGETS.get, key="rec_budget",
                 persist_state=KEEP, horizontal=True)  # fmt: skip
        b2.number_input(
            "share (%)", 0.1, 100.0, step=1.0, key="rec_budget_value", persist_state=KEEP,
            help="Trainable parameters as a % of the model's, or step time as a % of full "
            "fine-tuning's; ignored without a budget.",
        )  # fmt: skip
        c0.selectbox("design", list(DESIGNS), format_func=DESIGNS.get, key="rec_design",
                     persist_state=KEEP, help=help_of(RecommendConfig, "design"))  # fmt: skip
        c1.number_input("seeds to start", 1, 50, key="rec_seeds", persist_state=KEEP,
                        help="r₀: the seeds every arm starts with (the sequential designs need "
                        "≥ 2; a fixed grid's seeds).")  # fmt: skip
        c4.number_input("most seeds", 2, 50, key="rec_max_seeds", persist_state=KEEP,
                        help=help_of(RecommendConfig, "max_seeds"))  # fmt: skip
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
        timed_steps=int(state["rec_timed_steps"]), design=str(state["rec_design"]),
        max_seeds=max(int(state["rec_max_seeds"]), int(state["rec_seeds"])),
    )  # fmt: skip


def get_recommendation(cfg: RecommendConfig) -> Recommendation:
    """The analyses (disk-cached), the choices and their measured costs (disk-cached), once per
    settings, with a progress bar. The comparison's seeds, design and δ change nothing here, so
    they are left out of the key."""
    key = dataclasses.replace(cfg, seeds=(0,), delta=1.0, design="fixed", max_seeds=1)
    rec = _RECOMMENDATIONS.get(
        canonical_json(dataclasses.asdict(key)),
        "Analyses, candidates and their costs",
        lambda progress: _recommend(cfg, progress),
    )
    return dataclasses.replace(rec, cfg=cfg)  # this view's seeds and δ


def _recommend(cfg: RecommendConfig, progress: Progress) -> Recommendation:
    if not compute_pool.enabled():
        return recommend(cfg, get_model(cfg.model), progress=progress)
    get_states(cfg.extract_config())  # extracted in a worker (the page's own call: shared)
    # the layer tables, fanned out over the workers from here, before the job reads them
    layer_evidence(cfg, get_model(cfg.model), scaled(progress, 0.0, 0.4))
    return compute_pool.compute(recommendation_job, cfg, progress=scaled(progress, 0.4, 1.0))
