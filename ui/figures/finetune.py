"""Figures of the fine-tune page: live loss curves and the paper's comparisons against baselines.

Every function takes tables (see analysis.runs.results) and returns a plotly Figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.finetune.registry import colours, find_spec, method_names
from analysis.runs.results import pareto_front
from ui.figures import log_ticks
from ui.figures.baselines import bound_score_axis, score_frame

if TYPE_CHECKING:
    from analysis.runs.chance import Baseline

# Blue ℓ*-down, green ℓ*-up, red baselines: the colours of the first paper's Figure 4; every
# other method has its own colour, declared in its spec (`MethodSpec.colour`).
STRATEGY_COLOURS = {
    "ℓ*-down": "#1f77b4",
    "ℓ*-up": "#2ca02c",
    "baseline": "#d62728",
    "middle": "#9467bd",
}
OTHER_COLOUR = "#7f7f7f"
LAYER_FAMILIES = ("ℓ*-down", "ℓ*-up", "middle")


def family_colours() -> dict[str, str]:
    """Every family's colour: the layer strategies', each method's own (from its spec), other."""
    return {**STRATEGY_COLOURS, **colours(), "other": OTHER_COLOUR}


FAMILY_COLOURS = family_colours()  # the built-in methods' (a registered method: family_colours)


def display_family(family: str, method: str) -> str:
    """The family a point is coloured and listed by: the layer strategy's family (ℓ*-down, ℓ*-up,
    middle, baseline for full and top-layer runs), else the method itself (heads, lora…). Full
    fine-tuning is a baseline whatever family its sweep recorded (sweeps before the fix queued it
    as ℓ*-down when ℓ* = L)."""
    spec = find_spec(method)
    if spec is not None and spec.reference:
        return "baseline"
    own = colours()  # methods with a colour of their own; full and layers have none
    if family in LAYER_FAMILIES or (method in method_names() and method not in own):
        return family if family in family_colours() else "other"
    return method if method in own else "other"


def _colour(family: str) -> str:
    return family_colours().get(family, OTHER_COLOUR)


def _families(summary: pd.DataFrame) -> pd.Series:
    return pd.Series(
        [display_family(str(f), str(m)) for f, m in zip(summary["family"], summary["method"],
                                                        strict=True)],
        index=summary.index, dtype=object,
    )  # fmt: skip


def loss_curve(steps: pd.DataFrame, title: str = "", metric: str | None = None) -> go.Figure:
    """Train loss per step (left axis, its own range) and the dev score at each evaluation
    (right axis, bounded to the metric's range: `ui.figures.baselines`; with no metric given,
    [0, 1] when every dev score is ≥ 0, else [−1, 1]).

    steps: long format (step, kind, key, value) as `RunsDB.steps` returns it.
    """
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    train = steps[(steps["kind"] == "train") & (steps["key"] == "loss")]
    fig.add_trace(
        go.Scatter(x=train["step"], y=train["value"], mode="lines", name="train loss"),
        secondary_y=False,
    )
    dev = steps[(steps["kind"] == "dev") & (steps["key"] == "dev")]
    if not dev.empty:
        fig.add_trace(
            go.Scatter(x=dev["step"], y=dev["value"], mode="lines+markers", name="dev score"),
            secondary_y=True,
        )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss", secondary_y=False)
    fig.update_yaxes(title_text=f"dev {metric or 'score'}", secondary_y=True, showgrid=False)
    if metric is None and not dev.empty:  # a live run: its metric is known once it is done
        metric = "accuracy" if dev["value"].min() >= 0 else "mcc"  # [0, 1] or [−1, 1]
    bound_score_axis(fig, metric, secondary_y=True)
    fig.update_layout(title=title, height=280, margin=dict(t=40, b=30, l=10, r=10))
    return fig


def score_vs_layers(
    summary: pd.DataFrame,
    metric: str = "score",
    n_layers: int | None = None,
    baseline: Baseline | None = None,
) -> go.Figure:
    """The first paper's Figure 4: test score vs number of tuned layers, one colour per family,
    mean ± standard error over seeds (error bars). Circles: cut models (ℓ_cls < L); diamonds:
    the classifier reads the top layer L (the largest layers_forward when L is not given). The
    score axis spans the metric's range, with the majority-class and chance lines."""
    fig = go.Figure()
    points = summary.dropna(subset=["n_tuned_layers", "score"])
    top = n_layers if n_layers is not None else points["layers_forward"].max()
    for family, part in points.groupby(_families(points), sort=False):
        symbols = ["circle" if f < top else "diamond" for f in part["layers_forward"]]
        fig.add_trace(
            go.Scatter(
                x=part["n_tuned_layers"],
                y=part["score"],
                error_y=dict(type="data", array=part["score_sem"].fillna(0.0), visible=True),
                mode="markers",
                marker=dict(size=10, color=_colour(family), symbol=symbols),
                name=str(family),
                text=part["label"],
                customdata=part["n_seeds"],
                hovertemplate="%{text}<br>layers tuned %{x}<br>score %{y:.4f}"
                "<br>seeds %{customdata}<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis_title="number of tuned layers",
        yaxis_title=f"test {metric} (mean ± s.e. over seeds)",
        legend_title="family",
        showlegend=True,  # also for one family: the colour must say which one it is
        height=420,
    )
    fig.update_xaxes(dtick=1)
    return score_frame(fig, metric, baseline)


def score_vs_params(
    summary: pd.DataFrame, metric: str = "score", baseline: Baseline | None = None
) -> go.Figure:
    """Test score vs trainable parameters (log x) for every method, with the Pareto frontier:
    the runs that no other run beats with as few or fewer trainable parameters; the score axis
    spans the metric's range, with the majority-class and chance lines."""
    fig = go.Figure()
    points = summary.dropna(subset=["n_trainable", "score"]).reset_index(drop=True)
    for family, part in points.groupby(_families(points), sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["n_trainable"],
                y=part["score"],
                error_y=dict(type="data", array=part["score_sem"].fillna(0.0), visible=True),
                mode="markers",
                marker=dict(size=10, color=_colour(family)),
                name=str(family),
                text=part["label"],
                customdata=part["n_seeds"],
                hovertemplate="%{text}<br>n_trainable %{x:,}<br>score %{y:.4f}"
                "<br>n_seeds %{customdata}<extra></extra>",
            )
        )
    front = points[pareto_front(points["n_trainable"], points["score"])].sort_values("n_trainable")
    if not front.empty:
        fig.add_trace(
            go.Scatter(
                x=front["n_trainable"],
                y=front["score"],
                mode="lines",
                line=dict(shape="hv", dash="dot", color="black"),
                name="Pareto frontier",
                hoverinfo="skip",
            )
        )
    fig.update_layout(
        xaxis_title="trainable parameters (n_trainable, log scale)",
        yaxis_title=f"test {metric}",
        height=420,
    )
    fig.update_xaxes(type="log", **log_ticks(points["n_trainable"]))
    return score_frame(fig, metric, baseline)


def costs(summary: pd.DataFrame) -> go.Figure:
    """Wall-clock per run and peak memory per run group, side by side, sorted by wall-clock:
    bars are means over the group's seeds with ± standard-error bars, coloured by family, and
    each bar is labelled with its n_seeds."""
    data = summary.sort_values("wall_s", na_position="last")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("wall-clock (s)", "peak memory (MB)"))
    colours = [_colour(f) for f in _families(data)]
    seeds = [f"n={n}" for n in data["n_seeds"]]
    for col, (value, name) in enumerate((("wall_s", "wall-clock"), ("peak_mem_mb", "peak memory")),
                                        start=1):  # fmt: skip
        sem = data[f"{value}_sem"] if f"{value}_sem" in data else pd.Series(np.nan, data.index)
        fig.add_trace(
            go.Bar(
                x=data["label"],
                y=data[value],
                error_y=dict(type="data", array=sem.fillna(0.0).to_numpy(float), visible=True),
                marker_color=colours,
                name=name,
                text=seeds,
                textposition="inside",
                customdata=data["n_seeds"],
                hovertemplate="%{x}<br>%{y:.4g} (mean of %{customdata} seeds)<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_layout(showlegend=False, height=380)
    return fig


def compute_saved(
    saved: pd.DataFrame, metric: str = "score", baseline: Baseline | None = None
) -> go.Figure:
    """For every cut model (ℓ_cls < L): the share of step time saved against full fine-tuning
    (bars, left axis) and its test score (markers, right axis: the metric's range, with the
    majority-class line)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Bar(
            x=saved["label"],
            y=100 * saved["step_time_saved"],
            name="step time saved (%)",
            marker_color="#1f77b4",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Bar(
            x=saved["label"],
            y=100 * saved["layers_saved"],
            name="layers removed (%)",
            marker_color="#aec7e8",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=saved["label"],
            y=saved["score"],
            error_y=dict(type="data", array=np.nan_to_num(saved["score_sem"].to_numpy(float))),
            mode="markers",
            marker=dict(size=11, color="black"),
            name="test score",
        ),
        secondary_y=True,
    )
    fig.update_yaxes(title_text="saved vs full fine-tuning (%)", secondary_y=False)
    fig.update_yaxes(title_text=f"test {metric}", secondary_y=True, showgrid=False)
    score_frame(fig, metric, baseline, secondary_y=True)
    fig.update_layout(barmode="group", height=360)
    return fig
