"""Landing page: what tunescope answers and where to look."""

import streamlit as st

st.title("tunescope")
st.markdown(
    """
**Which layers and heads of this pretrained encoder should I tune for my task — and what does
that choice cost and buy?**

Fine-tuning every parameter of an encoder is the default, but often unnecessary. tunescope looks
*inside* the model on your data and turns what it sees into concrete, cheaper fine-tuning choices,
then lets you test them.

| page | the question it answers |
|---|---|
| **Data** | What is in the dataset I chose, and what exactly will be analysed and cached? |
| **Layers** | Which layer already separates my classes best (the lowest *task-specialty* ν, called ℓ\\*)? |
| **Heads** | Which attention heads carry the most information and influence (HiFi's PageRank)? |
| **Fine-tune** | If I train only those layers / heads / adapters, how does the score compare with full fine-tuning, LoRA or BitFit — at what cost in time and memory? |
| **Subspace** | In how few directions does fine-tuning actually move the weights, and which weights stick out? |

Choose a **model** and a **dataset** in the sidebar (the defaults work offline: the packaged
all-MiniLM-L6-v2 encoder and 10,605 human-rated Rotten Tomatoes sentences). Every page shares those
settings; every long computation shows progress and is cached on disk, so coming back is instant.
"""
)
st.caption(
    "Based on Xie et al. (hidden-state variability), HiFi (high-information heads) and Zhang et al. "
    "(fine-tuning happens in tiny subspaces). The formulas are shown on each page."
)
