"""The Recommend page's figures (data in, plotly figure out): the comparison at equal budget, and
each candidate's cost. Used by the page and by the HTML report (`ui.recommend.report`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.recommend.outcome import POINTS, ArmOutcome
from ui.figures.baselines import bound_score_axis

ROLE_SYMBOLS = {"reference": "square", "candidate": "star", "alternative": "circle"}
VERDICT_COLOURS = {"better": "#2ca02c", "worse": "#d62728", "none": "#7f7f7f"}


def _colour(arm: ArmOutcome) -> str:
    """Green: the arm better than full; red: full better; grey: no difference shown or none."""
    if arm.verdict.endswith(" better"):
        return VERDICT_COLOURS["worse" if arm.verdict.startswith("full") else "better"]
    return VERDICT_COLOURS["none"]


def comparison_figure(
    arms: Sequence[ArmOutcome], delta_points: float, metric: str | None = None
) -> go.Figure:
    """Left: every arm's difference to full fine-tuning in points with its ± t·se interval (the
    dashed line at −δ: the lower end must stay right of it); right: cost against score — step time
    as a share of full's (x) against mean test score ± s.e. (y), the frontier (no cheaper arm
    scores higher) as a line. Arms without runs are left out."""
    ran = [a for a in arms if a.n_seeds > 0]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.5, 0.5],
        horizontal_spacing=0.14,
        subplot_titles=(
            "difference to full fine-tuning (points, ± t·se)",
            "cost against score (the frontier: no cheaper arm scores higher)",
        ),
    )
    compared = [a for a in ran if a.role != "reference"]
    fig.add_trace(
        go.Scatter(
            x=[POINTS * a.diff for a in compared],
            y=[a.name for a in compared],
            mode="markers",
            marker=dict(
                size=11,
                color=[_colour(a) for a in compared],
                symbol=[ROLE_SYMBOLS[a.role] for a in compared],
            ),
            error_x=dict(
                type="data",
                visible=True,
                # no bar where there is no interval (one seed a side), rather than a 0-wide one
                array=[POINTS * a.margin if math.isfinite(a.margin) else None for a in compared],
            ),
            customdata=[[a.verdict, a.n_seeds] for a in compared],
            hovertemplate="%{y}<br>%{x:+.1f} points<br>%{customdata[0]}<br>n seeds %{customdata[1]}"
            "<extra></extra>",
            name="difference to full",
            showlegend=False,
        ),
        row=1,
        col=1,
    )
    fig.add_vline(x=0, line_dash="dot", line_color="black", row=1, col=1)
    fig.add_vline(
        x=-delta_points,
        line_dash="dash",
        line_color="#d62728",
        row=1,
        col=1,
        annotation_text=f"−δ = −{delta_points:g}",
        annotation_position="bottom left",
    )
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="arm − full (points of the metric)", row=1, col=1)
    costed = [a for a in ran if a.step_time_ratio is not None]
    for role in ("reference", "candidate", "alternative"):
        part = [a for a in costed if a.role == role]
        if not part:
            continue
        fig.add_trace(
            go.Scatter(
                x=[a.step_time_ratio for a in part],
                y=[a.mean for a in part],
                mode="markers+text",
                text=[a.name for a in part],
                textposition="top center",
                marker=dict(size=12, symbol=ROLE_SYMBOLS[role]),
                error_y=dict(
                    type="data",
                    visible=True,
                    array=[a.se if math.isfinite(a.se) else None for a in part],
                ),
                customdata=[[a.n_seeds, 100 * (a.trainable_share or math.nan)] for a in part],
                hovertemplate="%{text}<br>step time %{x:.2f}× full<br>score %{y:.4f}"
                "<br>n seeds %{customdata[0]}<br>trainable %{customdata[1]:.2f} %<extra></extra>",
                name=role,
            ),
            row=1,
            col=2,
        )
    front = sorted((a for a in costed if a.frontier), key=lambda a: a.step_time_ratio)
    if len(front) > 1:
        fig.add_trace(
            go.Scatter(
                x=[a.step_time_ratio for a in front],
                y=[a.mean for a in front],
                mode="lines",
                line=dict(dash="dash", color="#444444"),
                name="frontier",
                hoverinfo="skip",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="step time (× full fine-tuning's)", row=1, col=2)
    fig.update_yaxes(title_text=f"test {metric or 'score'} (mean ± s.e.)", row=1, col=2)
    bound_score_axis(fig, metric, row=1, col=2)
    fig.update_layout(
        height=max(360, 120 + 38 * len(compared)),
        margin=dict(t=50, b=40, l=10, r=10),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def cost_figure(
    names: Sequence[str], shares: Sequence[float], ratios: Sequence[float], roles: Sequence[str]
) -> go.Figure:
    """Each choice's trainable share (x, log scale, %) against its step time as a share of full
    fine-tuning's (y), before anything is trained."""
    fig = go.Figure()
    for role in ("reference", "candidate", "alternative"):
        picked = [i for i, r in enumerate(roles) if r == role]
        if not picked:
            continue
        fig.add_trace(
            go.Scatter(
                x=[100 * shares[i] for i in picked],
                y=[ratios[i] for i in picked],
                mode="markers+text",
                text=[names[i] for i in picked],
                textposition="top center",
                marker=dict(size=12, symbol=ROLE_SYMBOLS[role]),
                name=role,
                hovertemplate="%{text}<br>%{x:.2f} % trainable<br>%{y:.2f}× full's step time"
                "<extra></extra>",
            )
        )
    fig.update_xaxes(type="log", title_text="trainable share of the parameters (%)")
    fig.update_yaxes(title_text="step time (× full fine-tuning's)", rangemode="tozero")
    fig.update_layout(
        height=380, margin=dict(t=20, b=40, l=10, r=10), legend=dict(orientation="h", y=-0.2)
    )
    return fig
