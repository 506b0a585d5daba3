"""Figures of the Runs page: several runs' curves overlaid."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ui.figures.baselines import score_frame

if TYPE_CHECKING:
    from analysis.runs.chance import Baseline

PALETTE = qualitative.Plotly


def overlay_curves(
    steps: Mapping[str, pd.DataFrame], metric: str = "score", baseline: Baseline | None = None
) -> go.Figure:
    """Train loss (top, its own axis) and dev score (bottom, bounded to the metric's range, with
    the majority-class and chance lines) of several runs against the step, one colour per run.
    steps: run name → its steps in long format (step, kind, key, value), as `RunsDB.steps`
    returns them."""
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
        subplot_titles=["train loss", f"dev {metric}"],
    )  # fmt: skip
    for i, (name, frame) in enumerate(steps.items()):
        colour = PALETTE[i % len(PALETTE)]
        train = frame[(frame["kind"] == "train") & (frame["key"] == "loss")]
        dev = frame[(frame["kind"] == "dev") & (frame["key"] == "dev")]
        fig.add_trace(
            go.Scatter(
                x=train["step"], y=train["value"], mode="lines", name=name, legendgroup=name,
                line={"color": colour, "width": 1.5},
                hovertemplate=f"{name}<br>step %{{x}}<br>loss %{{y:.4f}}<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=dev["step"], y=dev["value"], mode="lines+markers", name=name, legendgroup=name,
                showlegend=train.empty, line={"color": colour},
                hovertemplate=f"{name}<br>step %{{x}}<br>dev %{{y:.4f}}<extra></extra>",
            ),
            row=2, col=1,
        )  # fmt: skip
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text=metric, row=2, col=1)
    fig.update_layout(height=560, legend={"orientation": "h", "y": -0.12}, margin={"t": 40})
    return score_frame(fig, metric, baseline, row=2, col=1)
