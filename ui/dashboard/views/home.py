"""Landing page: what tunescope answers, the path through it, and where to look."""

import streamlit as st

from ui.nav import lesson_link, next_step, path_links

DEMO = (
    "The sidebar starts on a demo that works offline and tells the papers' story: the packaged "
    "**all-mpnet-base-v2** encoder (12 layers, 12 heads) on **1,000 of 10,568 human-rated "
    "movie-review snippets** (negative / positive). There the layer that separates the classes "
    "best, ℓ\\*, is layer 10 of 12 (in 42 of 50 bootstrap resamples), so tuning only up to it "
    "has layers to cut. Take the "
    "built-in lesson (each step a page set up for you, with a note), or follow the pages in "
    "order — each ends with a link to the next one. (MiniLM, 6 layers, is in the Model list "
    "too: faster, but its ℓ\\* is its top layer on both built-in data sets.)"
)

st.title("tunescope")
st.markdown(
    """
**Which layers and heads of this pretrained encoder should I tune for my task — and what does
that choice cost and buy?**

Fine-tuning every parameter of an encoder is the default, but often unnecessary. tunescope looks
*inside* the model on your data and turns what it sees into concrete, cheaper fine-tuning choices,
then lets you test them.
"""
)
st.subheader("Start here: the papers' story, step by step")
st.markdown(DEMO)
lesson_link()
path_links()
st.markdown(
    """
| page | the question it answers |
|---|---|
| **Data** | What is in the dataset I chose, and what exactly will be analysed and cached? |
| **Layers** | Which layer already separates my classes best (the lowest *task-specialty* ν, called ℓ\\*)? Which examples does a layer confuse? |
| **Heads** | Which attention heads carry the most information and influence (HiFi's PageRank)? What does a head attend to? |
| **Fine-tune** | If I train only those layers / heads / adapters, how does the score compare with full fine-tuning, LoRA or BitFit — at what cost in time and memory? |
| **Subspaces** | In how few directions does fine-tuning actually move the weights, and which weights stick out? |
| **Runs** | Every run: its curves beside others', a note and tags, its files, an export. |
| **Paper check** | Do the three papers' claims hold on *my* model and data? Ours with its interval, and a verdict. |

**Your own data:** choose a file of the data folder in the sidebar's *Dataset* list, type its
path, or upload one (CSV, TSV, JSON lines or Parquet with a text and a label column). Every page
shares the sidebar's settings, and they live in the address bar: **copy the link** to come back to
(or share) exactly this view. Every long computation shows progress and is cached on disk, so
coming back is instant.
"""
)
st.caption(
    "Based on Xie et al. (hidden-state variability), HiFi (high-information heads) and Zhang et al. "
    "(fine-tuning happens in tiny subspaces). The formulas are shown on each page."
)
next_step("views/home.py")
