"""Paper check: each claim of the three papers re-measured on the current model and data."""

import streamlit as st

from ui.claims.demo import twelve_layer_note
from ui.claims.state import get_inputs, settings_form
from ui.claims.view import claims_view
from ui.loaders import get_model, show_error
from ui.nav import next_step
from ui.sidebar import settings
from ui.verdicts import explain

st.title("Paper check")
st.markdown(
    "The three papers make claims you may want to rely on: ν tracks a linear probe, the best "
    "layer sits mid-network, PageRank heads beat random ones, fine-tuning lives in a tiny "
    "subspace… This page re-measures each claim on **your** model and data and says whether it "
    "holds here — with our number, its interval and the rule behind the verdict. The layer "
    "claims come from bootstrap repeats of the layer metrics (N and seed from the sidebar); the "
    "others need fine-tuning runs over several seeds, queued below after an estimate of their "
    "time and reused whenever a finished run has the same settings."
)
with st.expander("How verdicts are reached"):
    st.markdown(
        "**holds** / **does not hold** when the interval supports it, **holds weakly** where the "
        "rule says so (X1), **inconclusive** when the interval covers both, **unstable** when "
        "independent samples disagree, **not measured yet** while runs are missing. Layer "
        "claims: each is judged on S samples of N examples (disjoint where the data allow); on "
        "each, the number shown is the full-sample value and its interval a 90 % BCa bootstrap "
        "interval around it from R repeats (R ≥ 50). Per repeat ν is recomputed on the "
        "resample; the probe's 5-fold cross-validated predictions are resampled, not refit (the "
        "refit's own variation is left out, so ρ(ν, s)'s interval is slightly narrow on that "
        "side). When the bootstrap cannot centre an interval on the estimate (every repeat on "
        "one side of it), none is shown and that sample is inconclusive. ℓ\\* counts: k of R "
        "≥ ⌈0.8 R⌉. Run claims: |diff| > t·s.e., t at 97.5 % with Welch degrees of freedom."
    )
    explain()

try:
    base = settings()
    twelve_layer_note(base.model.name)
    get_model(base.model)
    cfg = settings_form(base)
    inputs = get_inputs(cfg)
except ValueError as exc:
    show_error(exc)
    st.stop()
claims_view(cfg, inputs)
next_step("views/claims.py")
