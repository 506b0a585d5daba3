"""Figures of the Paper check page and the ``claims`` report: one per claim (data in, Plotly
figure out). Layer claims draw their repeats; run claims the forest plot of their comparisons."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from analysis.claims import ClaimResult
from analysis.compare import comparisons_frame
from analysis.layers.repeats import RHO_STRONG, RHO_WEAK
from ui.figures.compare import forest
from ui.figures.layers import l_star_shares

VERDICT_COLOURS = {
    "holds": "#2ca02c",
    "holds weakly": "#98df8a",
    "does not hold": "#d62728",
    "inconclusive": "#7f7f7f",
    "unstable": "#ff7f0e",
    "not measured yet": "#c7c7c7",
}
# The verdict column's width in pixels: the longest verdict whole ("does not hold", "not measured
# yet"), at about 8 px a character plus the cell's padding; "small" cut them ("does not ho").
VERDICT_WIDTH = 8 * max(len(v) for v in VERDICT_COLOURS) + 24


def rho_repeats(rho: Sequence[float], mean: float, interval: tuple[float, float]) -> go.Figure:
    """ρ(ν, s) of each repeat (dots), its mean (diamond) and 5th–95th percentile interval (bar);
    dashed: the paper's −0.85 and the −0.5 a weak agreement needs."""
    values = np.asarray(rho, dtype=float)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=values, y=["repeats"] * len(values), mode="markers", name="one repeat",
            marker=dict(size=10, color="#1f77b4", opacity=0.6),
            hovertemplate="ρ = %{x:+.3f}<extra></extra>",
        )
    )  # fmt: skip
    lo, hi = interval
    fig.add_trace(
        go.Scatter(
            x=[mean], y=["mean"], mode="markers", name="mean, 5th–95th percentile",
            marker=dict(size=13, symbol="diamond", color="black"),
            error_x=dict(type="data", symmetric=False, array=[hi - mean], arrayminus=[mean - lo]),
            hovertemplate="mean ρ = %{x:+.3f}<extra></extra>",
        )
    )  # fmt: skip
    for x, text in ((RHO_STRONG, "paper: ≤ −0.85"), (RHO_WEAK, "−0.5")):
        fig.add_vline(x=x, line_dash="dash", annotation_text=text, annotation_position="bottom")
    fig.update_layout(
        xaxis_title="ρ(ν, s) across layers", xaxis_range=[-1.05, 1.05], height=240,
        margin=dict(t=30, b=40), showlegend=False,
    )  # fmt: skip
    return fig


def zeta_pairs(zeta_mean: Sequence[float], zeta_first: Sequence[float]) -> go.Figure:
    """ζ of the ν curve per repeat, mean pooling vs first token, one line per repeat (the same
    resample): the claim holds when the first-token end is higher in ≥ 80 % of repeats."""
    fig = go.Figure()
    shown: set[str] = set()
    for i, (m, f) in enumerate(zip(zeta_mean, zeta_first, strict=True)):
        rougher = f > m
        colour = "#d62728" if rougher else "#1f77b4"
        group = "first token less smooth" if rougher else "first token as smooth or smoother"
        fig.add_trace(
            go.Scatter(
                x=["mean pooling", "first token"], y=[m, f], mode="lines+markers",
                line=dict(color=colour), name=f"repeat: {group}", legendgroup=group,
                showlegend=group not in shown,
                hovertemplate=f"repeat {i + 1}<br>%{{x}}: ζ = %{{y:.3g}}<extra></extra>",
            )
        )  # fmt: skip
        shown.add(group)
    fig.update_layout(yaxis_title="ζ (lower = smoother ν curve)", height=300, showlegend=True,
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=20, b=40))  # fmt: skip
    return fig


def sample_intervals(result: ClaimResult) -> go.Figure | None:
    """X1 / X3: each sample's full-sample value (dot) with its 90 % bootstrap interval (bar),
    coloured by that sample's verdict; a sample without an interval is drawn as a hollow dot.
    Dashed: the rule's thresholds (X1: −0.85 and −0.5; X3: 0)."""
    samples = result.values.get("samples") or []
    if not samples:
        return None
    fig = go.Figure()
    for i, smp in enumerate(samples):
        x = smp.get("ours")
        if x is None or not np.isfinite(x):
            continue
        interval = smp.get("interval")
        err = (
            dict(
                type="data", symmetric=False, array=[interval[1] - x], arrayminus=[x - interval[0]]
            )
            if interval
            else None
        )
        fig.add_trace(
            go.Scatter(
                x=[x], y=[smp["label"]], mode="markers", error_x=err,
                marker=dict(size=12, color=VERDICT_COLOURS.get(smp["verdict"], "#7f7f7f"),
                            symbol="circle" if interval else "circle-open"),
                name=f"sample {i + 1}: {smp['verdict']}",
                hovertemplate=f"{smp['label']}: %{{x:+.3f}} ({smp['verdict']})<extra></extra>",
            )
        )  # fmt: skip
    for x, text, colour, meaning in THRESHOLDS[result.id]:
        fig.add_vline(x=x, line_dash="dash", line_color=colour, annotation_text=text,
                      annotation_position="bottom")  # fmt: skip
        # a vertical line has no legend entry of its own: an empty trace drawn like it says what it is
        fig.add_trace(
            go.Scatter(x=[None], y=[None], mode="lines", name=meaning, hoverinfo="skip",
                       line=dict(dash="dash", color=colour))
        )  # fmt: skip
    title = "ρ(ν, s) across layers" if result.id == "X1" else "ζ(first) − ζ(mean)"
    fig.update_layout(
        xaxis_title=f"{title}: full-sample value (dot), 90 % BCa interval (bar)", showlegend=True,
        legend=dict(orientation="h", yanchor="top", y=-0.45), height=220 + 50 * len(samples),
        margin=dict(t=30, b=40),
    )  # fmt: skip
    return fig


# The dashed lines of `sample_intervals`: (x, label on the line, colour, legend entry).
THRESHOLDS = {
    "X1": (
        (RHO_STRONG, "paper: ≤ −0.85", "#2ca02c", "−0.85: the paper's ρ (holds at or below)"),
        (RHO_WEAK, "−0.5", "#ff7f0e", "−0.5: the interval's upper end must reach it"),
    ),
    "X3": (
        (0.0, "0", "#555555",
         "0: first token as smooth as mean pooling (holds when the interval lies right of it)"),
    ),
}  # fmt: skip


def claim_figure(result: ClaimResult, metric: str = "score") -> go.Figure | None:
    """The figure behind one claim's verdict, or None when there is nothing to draw yet."""
    values = result.values
    if result.id in ("X1", "X3") and values.get("samples"):
        return sample_intervals(result)
    if result.id == "X2" and "l_star_counts" in values:
        counts = {int(k): int(v) for k, v in values["l_star_counts"].items()}
        return l_star_shares(counts, values["n_layers"], result.repeats or 1)
    if result.comparisons:
        return forest(comparisons_frame(result.comparisons), metric)
    return None
