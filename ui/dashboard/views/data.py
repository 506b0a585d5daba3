"""Data page: the chosen dataset, its parts, and what an extraction will compute and cache."""

import pandas as pd
import streamlit as st

from analysis.cache_admin import human_bytes, usage
from analysis.data import sample
from analysis.extract import token_lengths
from analysis.workspace import Workspace
from ui.figures import data as figures
from ui.loaders import get_data, get_model, show_error
from ui.nav import next_step
from ui.sidebar import describe, settings


@st.cache_data(ttl=30, show_spinner=False)
def cache_usage(root: str):
    """The cache folder's size and free space (a walk of the folder: at most every 30 s)."""
    return usage(Workspace(root))


st.title("Data")
st.markdown(
    "The dataset chosen in the sidebar, split into **train / dev / test** parts. The analyses use a "
    "sample of N examples of the train part; fine-tuning trains on train, selects on dev and "
    "reports the score on test."
)
try:
    cfg = settings()
    data = get_data(cfg.data)
except ValueError as exc:
    show_error(exc)
    st.stop()

st.caption(describe(cfg))
st.subheader(data.title)
for note in data.notes:
    st.info(note)
# (what looks wrong in the columns, data.warnings, is said once: in the sidebar, on every page)
sizes = {part: len(frame) for part, frame in data.parts.items()}
cols = st.columns(4)
cols[0].metric("train", f"{sizes['train']:,}")
cols[1].metric("dev", f"{sizes['dev']:,}")
cols[2].metric("test", f"{sizes['test']:,}")
cols[3].metric("task metric", data.metric)

if data.task_type == "classification":
    counts = pd.concat(
        [
            frame["label"].map(dict(enumerate(data.label_names))).value_counts().rename_axis("label")
            .reset_index(name="count").assign(part=part)
            for part, frame in data.parts.items()
        ]
    )  # fmt: skip
    st.plotly_chart(figures.class_counts(counts), width="stretch")
else:
    labels = pd.concat([frame[["label"]].assign(part=part) for part, frame in data.parts.items()])
    st.plotly_chart(figures.label_histogram(labels), width="stretch")

try:
    rows = sample(data, cfg.sample)
except ValueError as exc:
    show_error(exc)
    st.stop()

st.subheader(f"The sample: N = {len(rows):,} examples of the train part (seed {cfg.sample.seed})")
try:
    loaded = get_model(cfg.model)
except ValueError as exc:
    show_error(exc)
    st.stop()
lengths = token_lengths(loaded.tokenizer, rows)
shown = rows.assign(tokens=lengths)
if data.task_type == "classification":
    shown["label"] = shown["label"].map(dict(enumerate(data.label_names)))
names = data.label_names if data.task_type == "classification" else ()
st.plotly_chart(figures.length_histogram(shown, cfg.max_length, names), width="stretch")
truncated = int((lengths > cfg.max_length).sum())
st.caption(
    f"{truncated:,} of {len(rows):,} examples are longer than {cfg.max_length} tokens and will be truncated."
)
st.dataframe(shown.head(200), width="stretch", hide_index=True)
st.download_button("Download the sample (CSV)", shown.to_csv(index=False), "sample.csv", "text/csv")

st.subheader("What will be cached")
st.markdown(
    f"One forward pass of **{loaded.name}** ({loaded.model_family}, {loaded.n_layers} layers, "
    f"{loaded.n_heads} heads, d_model {loaded.d_model}) over these {len(rows):,} examples gives the "
    f"**{cfg.pooling}**-pooled state of every layer 0..{loaded.n_layers}: a tensor of "
    f"{loaded.n_layers + 1} × {len(rows):,} × {loaded.d_model} floats "
    f"({(loaded.n_layers + 1) * len(rows) * loaded.d_model * 4 / 1e6:.1f} MB), stored under the cache "
    "folder as safetensors + JSON, keyed by the model's weights, the data, the sample, the pooling "
    "and the max length. It is written to disk window by window as it is computed and read back "
    "memory-mapped, one layer at a time, so memory does not grow with the number of examples."
)
use = cache_usage(str(Workspace.current().root))
st.caption(
    f"The cache folder `{use.root}` holds {human_bytes(use.total_bytes)}; its disk has "
    f"{human_bytes(use.free_bytes)} free. `tunescope cache` lists what it holds (kind, model, "
    "data, N, size, last use) and `tunescope cache prune` frees it."
)
next_step("views/data.py")
