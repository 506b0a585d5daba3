"""The Recommend page's figures (data in, plotly figure out): the comparison at equal budget, and
each candidate's cost. Used by the page and by the HTML report (`ui.recommend.report`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.recommend.outcome import POINTS, ArmOutcome
from analysis.runs.chance import metric_range
from ui.figures.baselines import bound_score_axis
from ui.figures.labels import LABEL_ROW_PX, decades, label_points

ROLE_SYMBOLS = {"reference": "square", "candidate": "star", "alternative": "circle"}
VERDICT_COLOURS = {"better": "#2ca02c", "worse": "#d62728", "none": "#7f7f7f"}
MARGIN = dict(t=20, b=110, l=10, r=10)  # b: the x axis' title, then the legend
LEGEND_BELOW_PX = 60  # from the plot's bottom edge to the legend, below the x axis' title


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
    as a share of full's (x) against mean test score ± s.e. (y), every point labelled (no two
    labels on one row), the frontier (no cheaper arm scores higher) as a line. Arms without runs
    are left out; a panel with nothing to show says what will appear there."""
    ran = [a for a in arms if a.n_seeds > 0]
    compared = [a for a in ran if a.role != "reference"]
    costed = [a for a in ran if a.step_time_ratio is not None]
    margin = {**MARGIN, "t": 50}  # the panels' titles
    height = max(360, 120 + 38 * len(compared), margin["t"] + margin["b"] + LABEL_ROW_PX *
                 (len(costed) + 1))  # fmt: skip
    plot_px = height - margin["t"] - margin["b"]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.5, 0.5],
        horizontal_spacing=0.14,
        subplot_titles=(
            "difference to full fine-tuning (points, ± t·se)",
            "cost against score (dashed: the frontier)",
        ),
    )
    if compared:
        _differences(fig, compared, delta_points)
    else:
        _empty(fig, 1, "Each arm's difference to full fine-tuning, with its interval and the −δ "
               "line, appears here<br>once runs of an arm other than full fine-tuning finish.")  # fmt: skip
    if costed:
        _cost_against_score(fig, costed, metric, plot_px)
    else:
        _empty(fig, 2, "Each arm's step time against its test score appears here once its<br>"
               "runs finish.")  # fmt: skip
    fig.update_layout(height=height, margin=margin, legend=legend_below(plot_px))
    return readable_axes(fig)


def _empty(fig: go.Figure, col: int, text: str) -> None:
    """Panel ``col`` without axes, saying what will appear there."""
    axis = "" if col == 1 else str(col)
    fig.add_annotation(text=text, xref=f"x{axis} domain", yref=f"y{axis} domain", x=0.5, y=0.5,
                       showarrow=False, font=dict(size=13, color="#666666"))  # fmt: skip
    fig.update_xaxes(visible=False, row=1, col=col)
    fig.update_yaxes(visible=False, row=1, col=col)


def _differences(fig: go.Figure, compared: Sequence[ArmOutcome], delta_points: float) -> None:
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


def _cost_against_score(
    fig: go.Figure, costed: Sequence[ArmOutcome], metric: str | None, plot_px: float
) -> None:
    for role in ("reference", "candidate", "alternative"):
        part = [a for a in costed if a.role == role]
        if not part:
            continue
        fig.add_trace(
            go.Scatter(
                x=[a.step_time_ratio for a in part],
                y=[a.mean for a in part],
                mode="markers",
                text=[a.name for a in part],
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
    x_range = (0.0, 1.15 * max([1.0, *(a.step_time_ratio for a in costed)]))
    y_range = metric_range(metric) or _around([a.mean for a in costed])
    label_points(fig, [a.step_time_ratio for a in costed], [a.mean for a in costed],
                 [a.name for a in costed], x_range=x_range, y_range=y_range, plot_px=plot_px,
                 xref="x2", yref="y2")  # fmt: skip
    fig.update_xaxes(title_text="step time (× full fine-tuning's)", range=x_range, row=1, col=2)
    fig.update_yaxes(title_text=f"test {metric or 'score'} (mean ± s.e.)", range=y_range,
                     row=1, col=2)  # fmt: skip
    bound_score_axis(fig, metric, row=1, col=2)


def _around(values: Sequence[float]) -> tuple[float, float]:
    """A range a little wider than ``values`` (a metric without known bounds)."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    low, high = min(finite), max(finite)
    pad = 0.15 * (high - low) or 0.1 * abs(high) or 1.0
    return low - pad, high + pad


def cost_figure(
    names: Sequence[str], shares: Sequence[float], ratios: Sequence[float], roles: Sequence[str]
) -> go.Figure:
    """Each choice's trainable share (x, log scale, %) against its step time as a share of full
    fine-tuning's (y), before anything is trained; every point labelled, no two labels on one row
    (`ui.figures.labels`)."""
    percent = [100 * share for share in shares]
    height = max(380, MARGIN["t"] + MARGIN["b"] + LABEL_ROW_PX * (len(names) + 1))
    plot_px = height - MARGIN["t"] - MARGIN["b"]
    x_range, ticks, tick_text = decades(percent)
    y_range = (0.0, 1.15 * max([1.0, *(r for r in ratios if math.isfinite(r))]))
    fig = go.Figure()
    for role in ("reference", "candidate", "alternative"):
        picked = [i for i, r in enumerate(roles) if r == role]
        if not picked:
            continue
        fig.add_trace(
            go.Scatter(
                x=[percent[i] for i in picked],
                y=[ratios[i] for i in picked],
                mode="markers",
                text=[names[i] for i in picked],
                marker=dict(size=12, symbol=ROLE_SYMBOLS[role]),
                name=role,
                hovertemplate="%{text}<br>%{x:.2f} % trainable<br>%{y:.2f}× full's step time"
                "<extra></extra>",
            )
        )
    label_points(fig, [math.log10(p) for p in percent], ratios, names, x_range=x_range,
                 y_range=y_range, plot_px=plot_px)  # fmt: skip
    fig.update_xaxes(type="log", range=x_range, tickvals=ticks, ticktext=tick_text,
                     title_text="trainable share of the parameters (%)")  # fmt: skip
    fig.update_yaxes(title_text="step time (× full fine-tuning's)", range=y_range)
    fig.update_layout(height=height, margin=MARGIN, legend=legend_below(plot_px))
    return readable_axes(fig)


def legend_below(plot_px: float) -> dict:
    """A horizontal legend under the x axis' title (at a fixed distance in pixels)."""
    return dict(orientation="h", yanchor="top", y=-LEGEND_BELOW_PX / plot_px, x=0)


def readable_axes(fig: go.Figure) -> go.Figure:
    """Margins that grow to fit tick labels and titles whatever the template (Streamlit's sets
    none), with the y title kept clear of its tick labels."""
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True, title_standoff=10)
    return fig
