"""Figures of the subspace page (paper 003): spectra, the map of the learned update, recurring
hidden dimensions and the score comparisons. Each takes plain data and returns a plotly Figure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ui.figures.baselines import score_frame

if TYPE_CHECKING:
    from analysis.runs.chance import Baseline

GROUP_COLOURS = {
    "full": "#d62728",
    "intrinsic subspace": "#1f77b4",
    "random subspace": "#7f7f7f",
    "frozen": "#bcbd22",
    "outliers zeroed": "#9467bd",
    "random weights zeroed": "#c5b0d5",
}


def spectrum(layers: list[dict], share: float = 0.9) -> go.Figure:
    """Cumulative explained variance Σ_{i≤k} s_i² / Σ s² against k, one line per layer.

    layers: the ``layers`` of `SubspaceReport.to_dict` (layer, explained_variance_ratio).
    """
    fig = go.Figure()
    for entry in layers:
        ratio = np.asarray(entry["explained_variance_ratio"], dtype=float)
        fig.add_trace(
            go.Scatter(
                x=np.arange(1, len(ratio) + 1),
                y=np.cumsum(ratio),
                mode="lines+markers",
                name=f"layer {entry['layer']}",
            )
        )
    fig.add_hline(y=share, line_dash="dash", annotation_text=f"{share:.0%}")
    fig.update_layout(
        xaxis_title="number of directions k",
        yaxis_title="explained variance (cumulative)",
        yaxis_range=[0, 1.02],
        height=360,
        margin=dict(t=30, b=40, l=10, r=10),
    )
    return fig


def update_map(
    profiles: dict[int, np.ndarray], std: dict[int, float], outliers: pd.DataFrame
) -> go.Figure:
    """Layer × position picture of |u| / std(u): each cell the largest |u_i| over a run of
    consecutive coordinates (so a single spike stays visible); top outliers marked with x.

    profiles: layer -> (n_bins,) max |u| per bin; std: layer -> std(u); outliers: rows with
    layer, index, n_params (for the position), kind, param, row, col, value.
    """
    layers = sorted(profiles)
    n_bins = max(len(profiles[layer]) for layer in layers)
    z = np.full((len(layers), n_bins), np.nan)
    for i, layer in enumerate(layers):
        scale = std[layer] if std[layer] > 0 else 1.0
        z[i, : len(profiles[layer])] = profiles[layer] / scale
    x = (np.arange(n_bins) + 0.5) / n_bins
    fig = go.Figure(
        go.Heatmap(
            z=z, x=x, y=[f"layer {layer}" for layer in layers], colorscale="Viridis",
            colorbar=dict(title="|u| / σ"), hovertemplate="position %{x:.3f}<br>%{y}<br>|u|/σ %{z:.1f}<extra></extra>",
        )
    )  # fmt: skip
    if not outliers.empty:
        text = [
            f"{r.kind}: {r.param}[{r.row}, {'' if pd.isna(r.col) else int(r.col)}] = {r.value:+.3g}"
            for r in outliers.itertuples()
        ]
        fig.add_trace(
            go.Scatter(
                x=outliers["index"] / outliers["n_params"],
                y=[f"layer {layer}" for layer in outliers["layer"]],
                mode="markers",
                marker=dict(symbol="x", color="red", size=9),
                name="top outliers",
                text=text,
                hovertemplate="%{text}<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis_title="position in the layer's flattened parameters (share of D)",
        height=120 + 40 * len(layers),
        margin=dict(t=30, b=40, l=10, r=10),
        legend=dict(orientation="h", y=1.08),
    )
    return fig


def recurring_dims(recurring: list[dict], top: int = 20) -> go.Figure:
    """Bar chart: for each hidden dimension, the number of layers whose top outliers touch it."""
    rows = recurring[:top]
    fig = go.Figure(
        go.Bar(
            x=[str(r["hidden_dim"]) for r in rows],
            y=[r["n_layers"] for r in rows],
            hovertext=[f"layers {', '.join(map(str, r['layers']))}" for r in rows],
        )
    )
    fig.update_layout(
        xaxis_title="hidden dimension (d_model index)",
        yaxis_title="layers",
        xaxis_type="category",
        height=300,
        margin=dict(t=30, b=40, l=10, r=10),
    )
    return fig


def wrap_label(label: str, width: int = 18) -> str:
    """A bar's label on lines of about ``width`` characters, broken at its " · " parts."""
    lines: list[str] = []
    for part in str(label).split(" · "):
        if lines and len(lines[-1]) + len(part) + 3 <= width:
            lines[-1] += f" · {part}"
        else:
            lines.append(part)
    return "<br>".join(lines)


def comparison(
    summary: pd.DataFrame, metric: str = "score", baseline: Baseline | None = None
) -> go.Figure:
    """Mean test score per group (and setting, where a group has several: ``label``, what
    differs) with ± standard error over seeds (error bars), each bar labelled with its n_seeds;
    the score axis spans the metric's range, with the majority-class and chance lines."""
    names = summary["label"] if "label" in summary else summary["group"]
    fig = go.Figure(
        go.Bar(
            x=[wrap_label(n) for n in names],
            y=summary["score"],
            error_y=dict(type="data", array=summary["score_sem"].fillna(0.0), visible=True),
            marker_color=[GROUP_COLOURS.get(g, "#7f7f7f") for g in summary["group"]],
            text=[f"n={n}" for n in summary["n_seeds"]],
            textposition="outside",
            hovertext=list(names),
            hovertemplate="%{hovertext}<br>score %{y:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        yaxis_title=f"test {metric}",
        height=420,
        margin=dict(t=30, b=40, l=10, r=10),
        xaxis_tickangle=0,
        bargap=0.3,
    )
    return score_frame(fig, metric, baseline)
