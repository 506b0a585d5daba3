"""What every score figure shares: an axis bounded to the metric's range, and the lines a score
must beat, the majority class and chance (`analysis.runs.chance`)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from analysis.runs.chance import Baseline, metric_range

MAJORITY_STYLE = dict(line_dash="dash", line_color="#444444", line_width=1)
CHANCE_STYLE = dict(line_dash="dot", line_color="#999999", line_width=1)


def bound_score_axis(fig: go.Figure, metric: str | None, **where: Any) -> None:
    """Fix the score axis to the metric's range ([0, 1] or [−1, 1]): never 1.06, never a zoom on
    0.450–0.460; ticked at round values (0, 0.2, … 1; −1, −0.5, … 1), never at a second axis'
    leftovers such as 0.255 / 0.544 / 0.833. ``where``: plotly's axis selectors (row/col,
    secondary_y)."""
    bounds = metric_range(metric)
    if bounds is not None:
        low, high = bounds
        step = 0.2 if high - low <= 1 else 0.5
        fig.update_yaxes(range=[low, high], tickmode="linear", tick0=low, dtick=step, **where)


def draw_baselines(fig: go.Figure, baseline: Baseline | None, **where: Any) -> None:
    """The majority-class line (dashed) and, for accuracy, chance 1/C (dotted), labelled."""
    if baseline is None:
        return
    fig.add_hline(
        y=baseline.majority, annotation_text=f"majority class {baseline.majority:.3f}",
        annotation_position="bottom right", **MAJORITY_STYLE, **where,
    )  # fmt: skip
    if baseline.chance is not None and abs(baseline.chance - baseline.majority) > 1e-9:
        fig.add_hline(
            y=baseline.chance, annotation_text=f"chance 1/{baseline.n_classes}",
            annotation_position="top left", **CHANCE_STYLE, **where,
        )  # fmt: skip


def score_frame(
    fig: go.Figure, metric: str | None, baseline: Baseline | None, **where: Any
) -> go.Figure:
    """`bound_score_axis` and `draw_baselines` at once; returns ``fig``."""
    bound_score_axis(fig, metric, **where)
    draw_baselines(fig, baseline, **where)
    return fig
