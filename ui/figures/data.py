"""Figures for the Data page."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from ui.figures import class_colours


def class_counts(counts: pd.DataFrame) -> go.Figure:
    """counts: columns part, label, count."""
    fig = px.bar(counts, x="label", y="count", color="part", barmode="group", text="count")
    fig.update_layout(xaxis_title="label", yaxis_title="examples", legend_title="part", height=320)
    return fig


def label_histogram(labels: pd.DataFrame) -> go.Figure:
    """For regression: labels has columns part, label (a float score)."""
    fig = px.histogram(labels, x="label", color="part", barmode="overlay", nbins=40)
    fig.update_layout(xaxis_title="score", yaxis_title="examples", height=320)
    return fig


def length_histogram(
    lengths: pd.DataFrame, max_length: int, label_names: Sequence[str] = ()
) -> go.Figure:
    """lengths: columns tokens (per example, untruncated) and label (class names: coloured as
    on the Layers page, by their index in ``label_names``)."""
    fig = px.histogram(
        lengths, x="tokens", color="label", nbins=50, barmode="overlay", opacity=0.7,
        color_discrete_map=class_colours(label_names),
        category_orders={"label": [str(n) for n in label_names]} if label_names else None,
    )  # fmt: skip
    fig.add_vline(x=max_length, line_dash="dash", annotation_text=f"max length {max_length}")
    fig.update_layout(xaxis_title="tokens per example", yaxis_title="examples", height=320)
    return fig
