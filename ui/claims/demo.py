"""When the 12-layer built-in shows what MiniLM cannot: one text for the Home page's teaching path
and the Paper check page (its numbers are those of ``claims --only X1,X2,X3 --n 1000`` on each
model)."""

from __future__ import annotations

import streamlit as st

TWELVE_LAYERS = (
    "**When to switch to the 12-layer model (`mpnet`).** On MiniLM (6 layers) ℓ\\* is "
    "the top layer on both built-in data sets, so *tune up to ℓ\\** has nothing to cut there and "
    "the ℓ\\* claims (X2 mid-network, X4 tuning up to ℓ\\*) cannot show the papers' story. Choose "
    "**mpnet** (all-mpnet-base-v2, 12 layers; about 6× slower per example) in the sidebar's model "
    "list to see it: on 1,000 movie snippets its ℓ\\* is **layer 10 of 12** on two of three "
    "disjoint samples (37 and 45 of 50 bootstrap repeats; the third sample picks 12), so the top "
    "two layers can be left frozen; ν tracks the probe closely (ρ(ν, s) = −0.97 [−0.99, −0.95], "
    "X1 holds on 3 of 3 samples) and first-token ν curves are much rougher than mean pooling's "
    "(X3 holds). ℓ\\* mid-network (X2) is still **unstable** there: the samples disagree "
    "between 10 and 12. MiniLM on the same samples: ℓ\\* = 6 of 6 in 48–50 of 50 repeats on "
    "every sample, X1 and X3 unstable. On trec6 mpnet's ℓ\\* is its top layer too (12 of 12 in "
    "every repeat), so there it shows no more than MiniLM: use movie snippets (or your own "
    "data) to see a layer cut."
)


def twelve_layer_note(model_name: str) -> None:
    """The note, as a call to action on MiniLM and as what to look for on mpnet."""
    if model_name == "mpnet":
        st.caption(TWELVE_LAYERS)
    else:
        st.info(TWELVE_LAYERS, icon=":material/layers:")
