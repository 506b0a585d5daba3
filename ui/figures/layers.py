"""Figures for the Layers page. Frames follow analysis.layers.table: one row per layer 0..L."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.figures import PALETTE, class_colour

TITLES = {
    "nu": "ν task-specialty (log; lower = more specialised)",
    "cca": "CCA score",
    "rank": "rank ϱ",
    "probe": "probe score",
}
SYMBOLS = {"nu": "ν", "cca": "CCA", "rank": "ϱ", "probe": "probe"}
COLOURS = {"nu": "#1f77b4", "cca": "#2ca02c", "rank": "#9467bd", "probe": "#d62728"}


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def metrics_figure(
    df: pd.DataFrame,
    l_star: int | None,
    probe_label: str = "probe",
    se: pd.DataFrame | None = None,
) -> go.Figure:
    """ν (log scale), CCA, ϱ and probe score against layer, one panel each, sharing the layer axis;
    ℓ* marked by a dashed line on every panel and a star on ν; hover gives exact values.

    se: per layer nu_se, cca_se, rank_se, probe_se (`LayerRepeats.standard_errors`): a shaded
    band of ± one bootstrap standard error around each curve (on the log ν axis the band's lower
    edge is kept above zero)."""
    metrics = ["nu", "cca", "rank", "probe"]
    titles = [TITLES[m] if m != "probe" else f"probe score ({probe_label})" for m in metrics]
    fig = make_subplots(
        rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=titles
    )
    layers = df["layer"].to_numpy()
    for row, metric in enumerate(metrics, start=1):
        values = df[metric].to_numpy(dtype=float)
        if se is not None and f"{metric}_se" in se:
            half = se[f"{metric}_se"].to_numpy(dtype=float)
            lo, hi = values - half, values + half
            if metric == "nu":
                lo = np.maximum(lo, values * 0.05)
            ok = np.isfinite(lo) & np.isfinite(hi)
            fig.add_trace(
                go.Scatter(
                    x=np.r_[layers[ok], layers[ok][::-1]],
                    y=np.r_[hi[ok], lo[ok][::-1]],
                    fill="toself",
                    fillcolor=_rgba(COLOURS[metric], 0.18),
                    mode="lines",  # a fill only: no markers on its edges that look like data
                    line={"width": 0},
                    name=f"{SYMBOLS[metric]} ± s.e.",
                    hoverinfo="skip",
                ),
                row=row,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=layers,
                y=values,
                name=SYMBOLS[metric],
                mode="lines+markers",
                line={"color": COLOURS[metric]},
                customdata=(
                    se[f"{metric}_se"].to_numpy(dtype=float)
                    if se is not None and f"{metric}_se" in se
                    else None
                ),
                hovertemplate=(
                    f"layer %{{x}}<br>{SYMBOLS[metric]} = %{{y:.6g}}"
                    + (" ± %{customdata:.3g}" if se is not None else "")
                    + "<extra></extra>"
                ),
            ),
            row=row,
            col=1,
        )
    if l_star is not None:
        star = df.loc[df["layer"] == l_star, "nu"].to_numpy(dtype=float)
        fig.add_trace(
            go.Scatter(
                x=[l_star],
                y=star,
                name="ℓ*",
                mode="markers",
                marker={"symbol": "star", "size": 16, "color": "#ff7f0e"},
                hovertemplate="ℓ* = layer %{x}<br>ν = %{y:.6g}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_vline(x=l_star, line_dash="dash", line_color="#ff7f0e", row="all", col=1)
    nu_values = df["nu"].to_numpy(dtype=float)
    if np.all(np.isfinite(nu_values) & (nu_values > 0)):
        fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(dtick=1, title_text="layer (0 = embeddings)", row=len(metrics), col=1)
    fig.update_layout(height=760, showlegend=False, hovermode="x unified", margin={"t": 40})
    return fig


def layer_scatter(
    xy: np.ndarray,
    labels: np.ndarray,
    label_names: Sequence[str],
    layer: int,
    method: str,
    regression: bool = False,
    examples: pd.DataFrame | None = None,
    mark_mistakes: bool = False,
) -> go.Figure:
    """One layer's states in 2-D (xy: (N, 2)) coloured by label: a trace per class, or a colour
    scale of the score for regression.

    examples: one row per point (N rows, in the order of xy) with ``example`` (its number),
    ``text`` (already shortened), ``label`` and ``predicted`` (the probe's held-out prediction)
    and, for classes, ``correct``; each point's customdata is [example, text, label, predicted]
    and its hover shows them. mark_mistakes: the probe's wrong predictions drawn as crosses.
    """
    fig = go.Figure()
    hover, custom = _example_hover(examples, regression)
    marking = mark_mistakes and examples is not None and "correct" in examples
    if regression:
        fig.add_trace(
            go.Scatter(
                x=xy[:, 0],
                y=xy[:, 1],
                mode="markers",
                marker={
                    "color": labels,
                    "colorscale": "Viridis",
                    "size": 6,
                    "colorbar": {"title": "score"},
                },
                customdata=custom,
                hovertemplate=hover or "score %{marker.color:.3g}<extra></extra>",
                name="examples",
            )
        )
    else:
        for code in np.unique(labels):
            mask = labels == code
            name = label_names[int(code)] if int(code) < len(label_names) else str(code)
            marker = {"size": 6, "opacity": 0.75, "color": class_colour(int(code))}
            if marking:
                wrong = ~examples["correct"].to_numpy(dtype=bool)[mask]
                marker["symbol"] = np.where(wrong, "x", "circle").tolist()
                marker["size"] = np.where(wrong, 9, 6).tolist()
            fig.add_trace(
                go.Scatter(
                    x=xy[mask, 0],
                    y=xy[mask, 1],
                    mode="markers",
                    name=name,
                    marker=marker,
                    customdata=None if custom is None else custom[mask],
                    hovertemplate=hover or f"{name}<extra></extra>",
                )
            )
        if marking:  # a legend entry saying what a cross means
            fig.add_trace(
                go.Scatter(
                    x=[None], y=[None], mode="markers", name="× the probe is wrong",
                    marker={"symbol": "x", "size": 9, "color": "#444"}, hoverinfo="skip",
                )
            )  # fmt: skip
    axis = "PC" if method == "pca" else "UMAP "
    fig.update_layout(
        title=f"layer {layer}: {method.upper()} of the pooled states",
        xaxis_title=f"{axis}1",
        yaxis_title=f"{axis}2",
        height=480,
        legend_title_text="label",
        dragmode="lasso" if examples is not None else "zoom",
    )
    return fig


def _example_hover(
    examples: pd.DataFrame | None, regression: bool
) -> tuple[str | None, np.ndarray | None]:
    if examples is None:
        return None, None
    custom = examples[["example", "text", "label", "predicted"]].to_numpy(dtype=object)
    value = ":.3g" if regression else ""
    hover = (
        "<b>#%{customdata[0]}</b> %{customdata[1]}<br>"
        f"label: %{{customdata[2]{value}}} · probe: %{{customdata[3]{value}}}<extra></extra>"
    )
    return hover, custom


def whatif_figure(curves: pd.DataFrame, value: str = "nu", title: str = "") -> go.Figure:
    """One curve per setting (curves: setting, layer, nu, probe), overlaid; ν on a log axis."""
    fig = go.Figure()
    for i, (name, group) in enumerate(curves.groupby("setting", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=group["layer"],
                y=group[value],
                name=str(name),
                mode="lines+markers",
                line={"color": PALETTE[i % len(PALETTE)]},
                hovertemplate=f"{name}<br>layer %{{x}}<br>{SYMBOLS[value]} = %{{y:.6g}}<extra></extra>",
            )
        )
    positive = curves[value].to_numpy(dtype=float)
    if value == "nu" and np.all(np.isfinite(positive) & (positive > 0)):
        fig.update_yaxes(type="log")
    fig.update_layout(
        title=title,
        xaxis_title="layer",
        yaxis_title=SYMBOLS[value],
        height=380,
        legend_title_text="setting",
    )
    fig.update_xaxes(dtick=1)
    return fig


def whatif_bars(table: pd.DataFrame) -> go.Figure:
    """ζ (smoothness of the ν curve; lower = smoother) and |ρ(ν, s)| per setting, side by side."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=["ζ (lower = smoother ν curve)", "|ρ(ν, s)|"]
    )
    names = table["setting"].astype(str).tolist()
    for col, (column, colour) in enumerate((("zeta", "#1f77b4"), ("abs_rho", "#d62728")), start=1):
        fig.add_trace(
            go.Bar(
                x=names,
                y=table[column],
                marker_color=colour,
                name=column,
                hovertemplate=f"%{{x}}<br>{column} = %{{y:.4g}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(height=320, showlegend=False, margin={"t": 40})
    return fig


def band_figure(curves: pd.DataFrame, band: pd.DataFrame, value: str = "nu") -> go.Figure:
    """Several seeds: each seed's curve thin, the mean bold, the min–max band shaded.
    band: analysis.layers.whatif.seed_band (layer, mean, std, lo, hi)."""
    fig = go.Figure()
    colour = COLOURS[value]
    fig.add_trace(
        go.Scatter(
            x=np.r_[band["layer"], band["layer"][::-1]],
            y=np.r_[band["hi"], band["lo"][::-1]],
            fill="toself",
            fillcolor="rgba(31, 119, 180, 0.18)" if value == "nu" else "rgba(214, 39, 40, 0.18)",
            mode="lines",
            line={"width": 0},
            name="min–max over seeds",
            hoverinfo="skip",
        )
    )
    for name, group in curves.groupby("setting", sort=False):
        fig.add_trace(
            go.Scatter(
                x=group["layer"],
                y=group[value],
                mode="lines",
                line={"width": 1, "color": colour},
                opacity=0.4,
                name=str(name),
                hovertemplate=f"{name}<br>layer %{{x}}<br>{SYMBOLS[value]} = %{{y:.6g}}<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=band["layer"],
            y=band["mean"],
            customdata=band["std"],
            mode="lines+markers",
            line={"width": 3, "color": colour},
            name="mean",
            hovertemplate=f"layer %{{x}}<br>mean {SYMBOLS[value]} = %{{y:.6g}} ± %{{customdata:.3g}}<extra></extra>",
        )
    )
    if value == "nu" and (band["lo"] > 0).all():
        fig.update_yaxes(type="log")
    fig.update_layout(xaxis_title="layer", yaxis_title=SYMBOLS[value], height=380)
    fig.update_xaxes(dtick=1)
    return fig


def teaching_scatter(x: np.ndarray, y: np.ndarray) -> go.Figure:
    """Synthetic classes (x: (N, 2) or (N, 3)), one colour per class, means marked with crosses."""
    fig = go.Figure()
    three_d = x.shape[1] == 3
    for code in np.unique(y):
        pts = x[y == code]
        colour = class_colour(int(code))
        centre = pts.mean(axis=0)
        if three_d:
            fig.add_trace(
                go.Scatter3d(
                    x=pts[:, 0], y=pts[:, 1], z=pts[:, 2], mode="markers", name=f"class {code}",
                    marker={"size": 3, "color": colour, "opacity": 0.7},
                )
            )  # fmt: skip
            fig.add_trace(
                go.Scatter3d(
                    x=[centre[0]], y=[centre[1]], z=[centre[2]], mode="markers", showlegend=False,
                    marker={"size": 8, "color": colour, "symbol": "x"}, name=f"mean {code}",
                )
            )  # fmt: skip
        else:
            fig.add_trace(
                go.Scatter(
                    x=pts[:, 0], y=pts[:, 1], mode="markers", name=f"class {code}",
                    marker={"size": 6, "color": colour, "opacity": 0.7},
                )
            )  # fmt: skip
            fig.add_trace(
                go.Scatter(
                    x=[centre[0]], y=[centre[1]], mode="markers", showlegend=False,
                    name=f"mean {code}",
                    marker={"size": 16, "color": colour, "symbol": "x", "line": {"width": 2, "color": "black"}},
                )
            )  # fmt: skip
    fig.update_layout(height=460, margin={"t": 20})
    if not three_d:
        fig.update_yaxes(scaleanchor="x", scaleratio=1)
    return fig


def mark_picked(fig: go.Figure, picked: Sequence[int]) -> go.Figure:
    """Show the examples ``picked`` (their numbers, customdata[0]) as the figure's selection —
    a box or lasso selection restored from a link; every other point dimmed."""
    chosen = {int(k) for k in picked}
    for trace in fig.data:
        custom = trace.customdata
        if custom is None or not len(custom):
            continue
        trace.selectedpoints = [i for i, row in enumerate(custom) if int(row[0]) in chosen]
    return fig


def l_star_shares(counts: dict[int, int], n_layers: int, repeats: int) -> go.Figure:
    """How many of the R bootstrap repeats pick each layer as ℓ*, layers 1..L (bars: the share,
    labels: "k/R"); the dashed line at ⌈0.8 R⌉ / R marks "stable"."""
    from analysis.layers.repeats import at_least_share

    layers = list(range(1, n_layers + 1))
    ks = [int(counts.get(layer, 0)) for layer in layers]
    values = [k / max(repeats, 1) for k in ks]
    fig = go.Figure(
        go.Bar(
            x=layers,
            y=values,
            marker_color=["#ff7f0e" if at_least_share(k, repeats) else "#1f77b4" for k in ks],
            text=[f"{k}/{repeats}" for k in ks],
            textposition="outside",
            hovertemplate="ℓ* = layer %{x} in %{text} repeats<extra></extra>",
        )
    )
    need = -(-4 * repeats // 5)
    # The label sits right of the plot, at the end of its line: on the line it covered the
    # tallest bar's own label (often the top layer's).
    fig.add_hline(y=need / max(repeats, 1), line_dash="dash", annotation_text=f"stable<br>({need} of {repeats})",
                  annotation_position="right", annotation_xanchor="left")  # fmt: skip
    fig.update_layout(
        xaxis_title="layer", yaxis_title="share of repeats", yaxis_range=[0, 1.15], height=260,
        margin={"t": 20, "b": 40, "r": 110},
    )  # fmt: skip
    fig.update_xaxes(dtick=1)
    return fig
