"""Figures of comparisons with verdicts (`analysis.compare`): a forest plot of differences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

VERDICT_COLOURS = {"A": "#2ca02c", "B": "#d62728", None: "#7f7f7f"}


def forest(frame: pd.DataFrame, metric: str = "score") -> go.Figure:
    """One row per comparison (frame: `analysis.compare.comparisons_frame`): the difference of
    mean test scores A − B as a dot with its ± t·s.e. interval (t at 97.5 %, Welch df); green when
    A is better, red when B is, grey when no difference is shown. The dashed line is "no difference"."""
    fig = go.Figure()
    names = [f"{a} − {b}" for a, b in zip(frame["a"], frame["b"], strict=True)]
    winners = [
        None if not str(v).endswith(" better") else ("A" if d > 0 else "B")
        for v, d in zip(frame["verdict"], frame["diff"], strict=True)
    ]
    half = (frame["hi"] - frame["diff"]).to_numpy(float)
    fig.add_trace(
        go.Scatter(
            x=frame["diff"],
            y=names,
            mode="markers",
            marker=dict(size=11, color=[VERDICT_COLOURS[w] for w in winners]),
            error_x=dict(type="data", array=np.nan_to_num(half), visible=True),
            customdata=np.stack(
                [frame["verdict"].astype(str), frame["n_seeds_a"], frame["n_seeds_b"]], axis=1
            ),
            hovertemplate="%{y}<br>diff %{x:+.4f}<br>%{customdata[0]}"
            "<br>n seeds %{customdata[1]}, %{customdata[2]}<extra></extra>",
        )
    )
    fig.add_vline(x=0, line_dash="dash", line_color="black")
    fig.update_layout(
        xaxis_title=f"difference of mean test {metric} (A − B, ± t·s.e., Welch)",
        height=120 + 40 * len(frame),
        margin=dict(t=20, b=40, l=10, r=10),
        showlegend=False,
    )
    fig.update_yaxes(autorange="reversed")
    return fig
