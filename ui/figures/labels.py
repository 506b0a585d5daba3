"""Scatter labels that never overlap, placed from the figure's own geometry: each label gets a row
of its own (rows at least `LABEL_ROW_PX` apart, in the order of their points' heights), beside
its point and joined to it by a thin line, and a log axis ticked at its powers of ten only."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

LABEL_ROW_PX = 20  # one label's row: 12 px text and the room between two rows
LABEL_FONT = 12
LABEL_SHIFT_PX = 24  # from the point to its label, sideways


def spread(wanted: Sequence[float], gap: float, low: float, high: float) -> list[float]:
    """Positions near ``wanted`` (in its order) at least ``gap`` apart, inside [low, high] when
    they fit there: rows pushed up from the lowest, then back down from ``high``."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    rows: list[float] = []
    for i in order:
        rows.append(max(wanted[i], low, rows[-1] + gap if rows else low))
    for k in range(len(rows) - 1, -1, -1):
        rows[k] = min(rows[k], high if k == len(rows) - 1 else rows[k + 1] - gap)
    placed = [0.0] * len(wanted)
    for k, i in enumerate(order):
        placed[i] = rows[k]
    return placed


def label_points(
    fig: go.Figure,
    xs: Sequence[float],
    ys: Sequence[float],
    names: Sequence[str],
    *,
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    plot_px: float,
    xref: str = "x",
    yref: str = "y",
) -> None:
    """Label point i (``xs``, ``ys`` in axis units: log10 on a log axis) with ``names[i]``.

    ``y_range`` is the axis' fixed range and ``plot_px`` the plot's height in pixels, so a row is
    `LABEL_ROW_PX` high on screen. A label sits right of its point, left of it in the right part of
    the plot (so that it stays inside).
    """
    low, high = y_range
    gap = LABEL_ROW_PX * (high - low) / plot_px
    rows = spread(ys, gap, low + gap / 2, high - gap / 2)
    width = x_range[1] - x_range[0]
    for x, y, row, name in zip(xs, ys, rows, names, strict=True):
        left = (x - x_range[0]) / width > 0.55
        fig.add_annotation(
            x=x, y=y, xref=xref, yref=yref, text=name, showarrow=True, arrowhead=0,
            arrowwidth=1, arrowcolor="#888888", standoff=5, axref="pixel",
            ax=-LABEL_SHIFT_PX if left else LABEL_SHIFT_PX, ayref=yref, ay=row,
            xanchor="right" if left else "left", yanchor="middle", font=dict(size=LABEL_FONT),
            bgcolor="rgba(255, 255, 255, 0.7)",  # (a line under a label does not cross its text)
        )  # fmt: skip


def decades(values: Sequence[float]) -> tuple[tuple[float, float], list[float], list[str]]:
    """A log axis over positive ``values``: its range (log10 units, a little past the values and
    spanning two powers of ten at least) and ticks at the powers of ten inside it, labelled."""
    logs = [math.log10(v) for v in values if v > 0 and math.isfinite(v)] or [0.0]
    low = min(math.floor(min(logs)), min(logs) - 0.25)
    high = max(math.ceil(max(logs)), max(logs) + 0.25)
    ticks = [10.0**k for k in range(math.ceil(low), math.floor(high) + 1)]
    return (low, high), ticks, [f"{t:.{max(0, -round(math.log10(t)))}f}" for t in ticks]
