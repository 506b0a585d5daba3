"""The Paper check page's settings form and its cached inputs (repeats, head selections)."""

from __future__ import annotations

import dataclasses

import streamlit as st

from analysis.cache import canonical_json
from analysis.claims import CLAIMS, ClaimInputs, ClaimsConfig, prepare
from analysis.claims.evaluate import heavy_inputs
from analysis.config import ExtractConfig, default_of
from analysis.progress import Progress
from ui import compute_pool
from ui.heads.state import get_head_stats
from ui.loaders import get_model, get_states
from ui.memo import ProgressMemo

_INPUTS: ProgressMemo[ClaimInputs] = ProgressMemo(max_entries=6)
# The form's settings with ClaimsConfig's defaults (the command line's too).
DEFAULTS = {
    "claims_seeds": len(default_of(ClaimsConfig, "seeds")),  # seeds 0 … n − 1
    **{f"claims_{name}": default_of(ClaimsConfig, name) for name in ("steps", "repeats",
                                                                     "samples", "k")},
    "claims_only": list(default_of(ClaimsConfig, "only")),
}  # fmt: skip
KEEP = "session"  # the form keeps its values across page switches


def settings_form(base: ExtractConfig) -> ClaimsConfig:
    """The sidebar's model, data, N, seed and max length with this page's run settings (the
    form keeps them across page switches, like the Heads form, and in the link)."""
    state, d = st.session_state, DEFAULTS
    keep = {"persist_state": KEEP, "bind": "query-params"}
    with st.form("claims_form"):
        c1, c2, c3, c5, c4 = st.columns(5)
        c1.number_input("seeds per run claim", 1, 10, d["claims_seeds"], key="claims_seeds",
                        help="A run claim gives a verdict only from ≥ 3 seeds per arm; with fewer "
                        "its numbers are shown, its verdict is inconclusive.", **keep)  # fmt: skip
        c2.number_input("steps per run", 1, 100_000, d["claims_steps"], step=50,
                        key="claims_steps", **keep)  # fmt: skip
        c3.number_input(
            "bootstrap repeats R (X1–X3)", 2, 500, d["claims_repeats"], key="claims_repeats",
            help="Per sample. 90 % BCa intervals around the full-sample values need R ≥ 50; with "
            "fewer the layer claims show s.e. only and stay inconclusive.", **keep,
        )  # fmt: skip
        c5.number_input(
            "samples S (X1–X3)", 1, 10, d["claims_samples"], key="claims_samples",
            help="Each layer claim is judged on S samples of N examples (disjoint where the data "
            "hold S·N, else overlapping); samples that disagree make the verdict unstable.",
            **keep,
        )  # fmt: skip
        c4.number_input("heads per layer k (H1, H2)", 1, 64, d["claims_k"], key="claims_k",
                        **keep)  # fmt: skip
        st.multiselect("claims", list(CLAIMS), d["claims_only"], key="claims_only", **keep)
        st.form_submit_button("Apply", type="primary")
    for key, value in DEFAULTS.items():  # (a widget not drawn yet this session: its default)
        state.setdefault(key, value)
    return ClaimsConfig(
        model=base.model, data=base.data, only=tuple(state["claims_only"]) or tuple(CLAIMS),
        n=base.sample.n, sample_seed=base.sample.seed, max_length=base.max_length,
        repeats=int(state["claims_repeats"]), samples=int(state["claims_samples"]),
        seeds=tuple(range(int(state["claims_seeds"]))),
        steps=int(state["claims_steps"]), k=int(state["claims_k"]),
    )  # fmt: skip


def get_inputs(cfg: ClaimsConfig) -> ClaimInputs:
    """`analysis.claims.prepare` once per settings (disk-cached underneath), with a progress bar.
    The run settings do not change the inputs, so they are left out of the key."""
    analyses = dataclasses.replace(cfg, seeds=(0,), steps=1)
    return _INPUTS.get(
        canonical_json(dataclasses.asdict(analyses)),
        "Repeats of the layer metrics and head statistics",
        lambda progress: _prepare(cfg, progress),
    )


def _prepare(cfg: ClaimsConfig, progress: Progress) -> ClaimInputs:
    """`prepare` here, once its extractions and head statistics are in the disk cache: computed
    in the compute workers (`ui.compute_pool`) through the pages' own calls (shared with the
    Layers and Heads pages); its layer tables fan out over the workers from here."""
    if compute_pool.enabled():
        extractions, stats = heavy_inputs(cfg)
        for extract in extractions:
            get_states(extract)
        if stats is not None:
            get_head_stats(stats)
    return prepare(cfg, get_model(cfg.model), progress=progress)
