"""Figures for the Heads page. Arrays follow analysis.heads: row ℓ − 1 is layer ℓ, heads 0-based."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

SCALE = "Viridis"
LAYER_ROW_PX = 34  # one layer's row in a layer × head heatmap
MARGIN = {
    "l": 60,
    "r": 20,
    "t": 40,
    "b": 50,
}  # px; plotly's default top margin (100) is blank space
PANEL_PX, PANEL_GAP_PX = 220, 70  # correlation grid: a panel, and the gap that holds the tick
# labels of the row above and this row's "layer ℓ" title


def layer_heatmap_layout(fig: go.Figure, n_layers: int, legend: bool = False) -> go.Figure:
    """Size a layer × head heatmap by its rows: LAYER_ROW_PX a layer plus fixed margins, so six
    layers are not squashed into a strip under plotly's default top margin."""
    margin = {**MARGIN, "t": MARGIN["t"] + (30 if legend else 0)}
    fig.update_layout(
        height=LAYER_ROW_PX * n_layers + margin["t"] + margin["b"] + 20,
        margin=margin,
        xaxis_title="head",
        yaxis_title="layer",
    )
    if legend:
        fig.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0})
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1)
    return fig


def richness_heatmap(richness: np.ndarray, richness_std: np.ndarray | None = None) -> go.Figure:
    """I_h as a layer × head heatmap (richness: (L, H)); the hover adds the spread over examples."""
    n_layers, n_heads = richness.shape
    std = richness_std if richness_std is not None else np.zeros_like(richness)
    fig = go.Figure(
        go.Heatmap(
            z=richness,
            x=list(range(n_heads)),
            y=list(range(1, n_layers + 1)),
            customdata=std,
            colorscale=SCALE,
            colorbar={"title": "I_h"},
            hovertemplate="layer %{y}, head %{x}<br>I_h %{z:.2f} ± %{customdata:.2f}<extra></extra>",
        )
    )
    return layer_heatmap_layout(fig, n_layers)


def correlation_grid(correlation: np.ndarray, n_cols: int = 4) -> go.Figure:
    """One H × H heatmap of r per layer (correlation: (L, H, H)), all on ONE shared colour scale."""
    n_layers, n_heads = correlation.shape[:2]
    n_cols = min(n_cols, n_layers)
    n_rows = math.ceil(n_layers / n_cols)
    plot_px = n_rows * PANEL_PX + (n_rows - 1) * PANEL_GAP_PX  # the panels and the gaps between
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=[f"layer {layer}" for layer in range(1, n_layers + 1)],
        horizontal_spacing=0.05,
        vertical_spacing=PANEL_GAP_PX / plot_px if n_rows > 1 else 0.0,
    )
    for i in range(n_layers):
        fig.add_trace(
            go.Heatmap(
                z=correlation[i],
                x=list(range(n_heads)),
                y=list(range(n_heads)),
                coloraxis="coloraxis",
                hovertemplate=f"layer {i + 1}<br>heads %{{y}} ↔ %{{x}}<br>r %{{z:.3g}}<extra></extra>",
            ),
            row=i // n_cols + 1,
            col=i % n_cols + 1,
        )
    fig.update_layout(
        coloraxis={"colorscale": SCALE, "cmin": 0.0, "cmax": float(correlation.max()) or 1.0,
                   "colorbar": {"title": "r"}},
        height=plot_px + MARGIN["t"] + MARGIN["b"], margin=MARGIN,
    )  # fmt: skip
    ticks = head_ticks(n_heads)
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=ticks, tickfont={"size": 9})
    fig.update_xaxes(tickmode="array", tickvals=ticks, tickfont={"size": 9})
    for col in range(1, n_cols + 1):  # axis titles once: bottom row and first column
        fig.update_xaxes(title_text="head", row=n_rows, col=col)
    for row in range(1, n_rows + 1):
        fig.update_yaxes(title_text="head", row=row, col=1)
    return fig


def head_ticks(n_heads: int) -> list[int]:
    """Head indices to label on an axis: every head up to 16 heads, else every second / fourth."""
    step = 1 if n_heads <= 16 else (2 if n_heads <= 32 else 4)
    return list(range(0, n_heads, step))


def attention_heatmap(
    weights: np.ndarray, tokens: Sequence[str], layer: int, head: int
) -> go.Figure:
    """One head's attention pattern on one example (weights: (S, S), row i = how token i
    attends to every token), with the tokens as axis labels. Tokens sit at positions 0..S-1
    (a text repeats tokens; plotly would merge repeated category names)."""
    n = len(tokens)
    positions = list(range(n))
    pairs = [[f"{tokens[i]} → {tokens[j]}" for j in positions] for i in positions]
    fig = go.Figure(
        go.Heatmap(
            z=weights,
            x=positions,
            y=positions,
            customdata=pairs,
            colorscale=SCALE,
            zmin=0.0,
            colorbar={"title": "attention"},
            hovertemplate="%{customdata}<br>weight %{z:.3f}<extra></extra>",
        )
    )
    labels = [f"{t} ·{i}" if tokens.count(t) > 1 else t for i, t in enumerate(tokens)]
    axis = {
        "tickmode": "array",
        "tickvals": positions,
        "ticktext": labels,
        "tickfont": {"size": 10},
    }
    fig.update_xaxes(title_text="attended token (key)", tickangle=-60, **axis)
    fig.update_yaxes(title_text="attending token (query)", autorange="reversed", **axis)
    fig.update_layout(
        title=f"layer {layer}, head {head}", height=max(360, min(900, 14 * n + 160)),
        margin={"t": 40},
    )  # fmt: skip
    return fig


def pagerank_heatmap(scores: np.ndarray, selected: Mapping[int, Sequence[int]]) -> go.Figure:
    """PageRank p*_h as a layer × head heatmap (scores: (L, H)); selected heads ringed."""
    n_layers, n_heads = scores.shape
    fig = go.Figure(
        go.Heatmap(
            z=scores,
            x=list(range(n_heads)),
            y=list(range(1, n_layers + 1)),
            colorscale=SCALE,
            colorbar={"title": "p*"},
            hovertemplate="layer %{y}, head %{x}<br>PageRank %{z:.4f}<extra></extra>",
        )
    )
    xs = [h for layer in sorted(selected) for h in selected[layer]]
    ys = [layer for layer in sorted(selected) for _ in selected[layer]]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers",
            name="selected",
            marker={"symbol": "circle-open", "size": 16, "color": "red", "line": {"width": 3}},
            hovertemplate="selected: layer %{y}, head %{x}<extra></extra>",
        )
    )
    return layer_heatmap_layout(fig, n_layers, legend=True)


def variant_bars(
    paper: np.ndarray, personalised: np.ndarray, p0: np.ndarray, layer: int
) -> go.Figure:
    """One layer's heads: p⁽⁰⁾ and both PageRank fixed points side by side. Each (H,)."""
    heads = list(range(len(paper)))
    fig = go.Figure(
        [
            go.Bar(x=heads, y=p0, name="P⁽⁰⁾ = I_h / Σ I", marker_color="lightgray"),
            go.Bar(x=heads, y=paper, name="paper (uniform teleport)"),
            go.Bar(x=heads, y=personalised, name="personalised teleport"),
        ]
    )
    fig.add_hline(y=1 / len(paper), line_dash="dot", annotation_text="1 / H")
    fig.update_layout(
        barmode="group",
        title=f"layer {layer}",
        xaxis_title="head",
        yaxis_title="probability",
        height=330,
        legend={"orientation": "h", "y": -0.25},
    )
    fig.update_xaxes(dtick=1)
    return fig


def agreement_bars(per_layer: Mapping[str, np.ndarray]) -> go.Figure:
    """Kendall τ per layer for each ranked quantity (name → (L,))."""
    fig = go.Figure(
        [
            go.Bar(x=list(range(1, len(tau) + 1)), y=tau, name=name)
            for name, tau in per_layer.items()
        ]
    )
    fig.update_layout(
        barmode="group",
        xaxis_title="layer",
        yaxis_title="Kendall τ",
        yaxis_range=[-1, 1],
        height=320,
    )
    fig.update_xaxes(dtick=1)
    return fig


def richness_profiles(
    a: np.ndarray, b: np.ndarray, label_a: str, label_b: str, std_a=None, std_b=None
) -> go.Figure:
    """I_h per head, one panel per layer, two settings overlaid (paper Fig. 3). a, b: (L, H)."""
    n_layers, n_heads = a.shape
    n_cols = min(4, n_layers)
    n_rows = math.ceil(n_layers / n_cols)
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=[f"layer {layer}" for layer in range(1, n_layers + 1)],
        shared_yaxes=True,
    )
    heads = np.arange(n_heads)
    settings = ((a, std_a, label_a, "#1f77b4", -0.12), (b, std_b, label_b, "#ff7f0e", 0.12))
    for values, std, label, color, shift in settings:  # shifted apart so both error bars show
        for i in range(n_layers):
            error = {"type": "data", "array": std[i], "visible": True} if std is not None else None
            fig.add_trace(
                go.Scatter(
                    x=heads + shift,
                    y=values[i],
                    error_y=error,
                    mode="lines+markers",
                    name=label,
                    legendgroup=label,
                    showlegend=i == 0,
                    line={"color": color},
                ),
                row=i // n_cols + 1,
                col=i % n_cols + 1,
            )
    fig.update_layout(
        height=230 * n_rows + 100,
        legend={"orientation": "h", "y": -0.12, "yanchor": "top"},
        yaxis_title="I_h",
    )
    return fig
