"""The Layers page's interactive parts: the layer picture (with each example's text and probe
prediction), the suggestion box, the teaching view."""

from __future__ import annotations

import html
import textwrap
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import streamlit as st

from analysis.layers.repeats import RepeatSummary, rho_verdict
from analysis.layers.table import strategies
from analysis.layers.teaching import synthetic_classes, teaching_metrics
from analysis.words import counted
from ui.figures import layers as figures
from ui.layers.state import (
    examples,
    has_projection,
    label_names,
    mark_projection,
    predictions,
    projection,
)
from ui.layers.text import STRATEGY_TRIPLE
from ui.links import BIND, check_page_link, publish, take_link, whole

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from analysis.extract import LayerStates


@st.cache_resource(max_entries=16, show_spinner=False)
def metrics_figure(
    df: pd.DataFrame, l_star: int | None, probe_label: str, se: pd.DataFrame | None = None
) -> go.Figure:
    """`ui.figures.layers.metrics_figure`, built once per process for each table and its bands:
    the sessions that show the same table (a class on one lesson step) share one figure, so
    none of them builds it again. Shared, so not to be modified."""
    return figures.metrics_figure(df, l_star, probe_label, se)


def fmt_strategy(s: tuple[int, int, int] | list[int]) -> str:
    return f"({s[0]}, {s[1]}, {s[2]})"


def suggestion(
    summ: dict[str, Any], df: pd.DataFrame, n_layers: int, repeats: RepeatSummary | None = None
) -> None:
    """The "what this suggests" box: ℓ*, the strategies it implies, and how far to trust it —
    from the bootstrap repeats when there are some (ℓ*'s share of repeats; a verdict on whether ν
    tracks the probe only when ρ's interval supports one)."""
    l_star = summ["l_star"]
    if l_star is None:
        st.warning("ν is undefined on every layer (the class means coincide): no ℓ* to suggest.")
        return
    plan = strategies(l_star, n_layers)
    body = df[df["layer"] >= 1]
    best_probe = (
        int(body.loc[body["probe"].idxmax(), "layer"]) if body["probe"].notna().any() else None
    )
    down = ", ".join(fmt_strategy(s) for s in plan["l_star_down"])
    up = ", ".join(fmt_strategy(s) for s in plan["l_star_up"]) or "none (ℓ\\* is the top layer)"
    lines = [
        f"**ℓ\\* = {l_star}**: the lowest ν among layers 1..{n_layers}"
        + (f" (the probe peaks at layer {best_probe})." if best_probe is not None else "."),
    ]
    if repeats is not None:
        lines.append(_stability(repeats, l_star))
    lines.append(STRATEGY_TRIPLE)
    lines += [
        f"- **ℓ\\*-down** — train layers ℓ_bottom..{l_star} "
        + (
            f"and read the classifier at layer {l_star} (layers above are dropped: cheaper) or at "
            f"{n_layers}: {down}"
            if l_star < n_layers
            else f"(ℓ\\* is the top layer, so the classifier stays at {n_layers}): {down}"
        ),
        f"- **ℓ\\*-up** — keep layers 1..{l_star} frozen and tune those above as a deep "
        f"classifier: {up}",
        f"- compare with full fine-tuning {fmt_strategy((1, n_layers, n_layers))} and the top "
        "layers only; launch any of them on the **Fine-tune** page (ℓ\\* is passed on).",
    ]
    lines.append("\n" + _agreement(summ["rho"]["nu"], repeats))
    st.info("\n".join(lines), icon=":material/lightbulb:")


HOVER_CHARS = 90


def shorten(text: str, width: int = HOVER_CHARS) -> str:
    """One line of at most ``width`` characters, cut at a word, safe inside a Plotly hover."""
    short = textwrap.shorten(" ".join(str(text).split()), width=width, placeholder=" …")
    return html.escape(short or str(text)[:width])


def selected_examples(points: list[dict], fig) -> list[int]:
    """Example numbers of the points of a box / lasso selection (from each point's customdata,
    else from its trace and index)."""
    chosen = []
    for point in points:
        custom = point.get("customdata")
        if custom:
            chosen.append(int(custom[0]))
            continue
        trace, index = point.get("curve_number"), point.get("point_index")
        if trace is not None and index is not None and fig.data[trace].customdata is not None:
            chosen.append(int(fig.data[trace].customdata[index][0]))
    return sorted(set(chosen))


def example_table(
    layer_states: LayerStates, layer: int, seed: int, df: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Every sampled example with its text, label and a held-out prediction of this layer's
    probe (example, row, text[, text_pair], label, predicted[, correct]).

    With the metrics table ``df`` (`analysis.layers.table.layer_metrics`) whose out-of-fold
    predictions cover every example, they are the table's own probe (5-fold CV, attrs ``c`` =
    the table's probe C, ``source`` "table"); otherwise (e.g. a subsampled streamed probe) a
    3-fold cross-fitted probe of this layer alone (``source`` "own", its own C)."""
    table = examples(layer_states)
    stored = None if df is None else df.attrs.get("probe_predictions")
    row = None
    if stored is not None and layer < len(stored):
        row = np.asarray(stored[layer], dtype=np.float64)
        if len(row) != len(table) or not np.isfinite(row).all():
            row = None
    if row is not None:
        classes = layer_states.task_type != "regression"
        predicted = row.astype(np.int64) if classes else row
        table["predicted"] = label_names(layer_states, predicted)
        if classes:
            table["correct"] = predicted == layer_states.labels.numpy()
        c = float(df.loc[df["layer"] == layer, "probe_c"].iloc[0])
        accuracy = float(table["correct"].mean()) if classes else None
        table.attrs.update(c=c, held_out=True, accuracy=accuracy, source="table")
        return table
    preds = predictions(layer_states, layer, seed)
    table["predicted"] = label_names(layer_states, preds.predicted)
    if preds.correct is not None:
        table["correct"] = preds.correct
    table.attrs.update(c=preds.c, held_out=preds.held_out, accuracy=preds.accuracy, source="own")
    return table


def _stability(repeats: RepeatSummary, l_star: int) -> str:
    sentence = repeats.l_star_sentence().replace("ℓ*", "ℓ\\*")
    if repeats.stable and repeats.modal_l_star == l_star:
        return f"Stable: {sentence} (bootstrap resamples of the N examples)."
    return (
        f"⚠ Not stable: {sentence}; no layer wins ⌈0.8 R⌉ of the bootstrap resamples, so treat "
        "ℓ\\* as a hint (more examples N usually settle it)."
    )


def _agreement(rho: float | None, repeats: RepeatSummary | None) -> str:
    """Whether ν tracks the probe (claim X1), said only as far as the repeats support it."""
    if repeats is None or repeats.repeats < 2:
        if rho is None or not np.isfinite(rho):
            return "ρ(ν, s) is undefined here."
        return (
            f"ρ(ν, s) = {rho:+.2f} on this one sample (the paper saw ≤ −0.85); with one sample "
            "there is no interval: set repeats R ≥ 50 to see whether it holds."
        )
    est = repeats.rho["nu"]
    quoted = f"ρ(ν, s) = {est.text(2)}"
    verdict = rho_verdict(est)
    if verdict == "holds":
        return f"ν tracks the probe here: {quoted} (the paper: ≤ −0.85)."
    if verdict == "holds weakly":
        return f"ν tracks the probe, more weakly than in the paper (≤ −0.85): {quoted}."
    if verdict == "does not hold":
        return (
            f"⚠ ν and the probe disagree here: {quoted}. Lower ν did not mean a better probe on "
            "this data: treat ℓ\\* as a hint, try more examples (N) or the what-ifs."
        )
    if est.interval is None:
        return (
            f"{quoted}: no interval around it, so the repeats cannot tell whether ν tracks the "
            "probe here (intervals need R ≥ 50 and an estimate inside its bootstrap spread)."
        )
    return (
        f"{quoted}: the interval covers both agreement and disagreement, so the repeats cannot "
        "tell whether ν tracks the probe here (more examples N narrow it)."
    )


@st.fragment
def layer_picture(
    layer_states: LayerStates, df: pd.DataFrame, l_star: int | None, seed: int
) -> None:
    """A 2-D picture of one layer's states coloured by label (PCA at once, UMAP on request); the
    hover shows each example's text, label and the probe's prediction, a box or lasso selection
    lists the examples with their texts. The layer lives in the link (``layer``)."""
    n_layers = layer_states.n_layers
    default = l_star if l_star is not None else n_layers
    check_page_link(
        "layer",
        lambda text: whole(text, 0, n_layers) is not None,
        f"is not a layer of this model (0..{n_layers})",
        f"layer {default}",
    )
    if not 0 <= st.session_state.get("layer", default) <= n_layers:
        del st.session_state["layer"]  # a layer of another model: start on this one's default
    left, middle, right = st.columns([3, 1, 1])
    layer = left.slider("layer", 0, n_layers, default, key="layer", bind=BIND)
    method = middle.radio("picture", ["pca", "umap"], key="layers_pic_method", horizontal=True,
                          format_func=str.upper, bind=BIND)  # fmt: skip
    mark = right.toggle("mark the probe's mistakes", key="layers_pic_mistakes",
                        disabled=layer_states.task_type == "regression", bind=BIND)  # fmt: skip
    offer = st.empty()  # the UMAP button, gone once its picture is computed
    if method == "umap" and not has_projection(layer_states, layer, method, seed):
        with offer.container():
            st.caption(
                f"UMAP (umap-learn, seed {seed}) takes seconds per layer; the first call compiles."
            )
            if not st.button(f"Compute UMAP for layer {layer}", key="layers_pic_umap"):
                method = "pca"
    with st.spinner(f"{method.upper()} of layer {layer}…"):
        xy = projection(layer_states, layer, method, seed)
    if method == "umap":
        offer.empty()
    mark_projection(layer_states, layer, method, seed)
    with st.spinner(f"Fitting the probe of layer {layer} (held-out predictions)…"):
        table = example_table(layer_states, layer, seed, df)
    text = table["text"] if "text_pair" not in table else table["text"] + " ‖ " + table["text_pair"]
    hover = table.assign(text=[shorten(t) for t in text])
    regression = layer_states.task_type == "regression"
    fig = figures.layer_scatter(
        xy, layer_states.labels.numpy(), layer_states.label_names, layer, method, regression,
        examples=hover, mark_mistakes=mark,
    )  # fmt: skip
    take_link("layers_picked", lambda t: _example_list(t, len(table)),
              f"names no example of 0..{len(table) - 1}", "no selection", param="picked")  # fmt: skip
    picked = st.session_state.get("layers_picked") or []
    if picked:
        figures.mark_picked(fig, picked)
    event = st.plotly_chart(
        fig, width="stretch", key="layers_pic_chart", on_select="rerun",
        selection_mode=("box", "lasso"),
    )  # fmt: skip
    row = df.loc[df["layer"] == layer].iloc[0]
    metric = layer_states.metric
    cols = st.columns(4)
    for col, name in zip(cols, ("nu", "cca", "rank", "probe"), strict=True):
        label = f"probe s ({metric})" if name == "probe" else figures.SYMBOLS[name]
        col.metric(label, "undefined" if not np.isfinite(row[name]) else f"{row[name]:.4g}")
    st.caption(picture_caption(table.attrs, layer, len(table), metric))
    _selection(event, fig, table, layer)


def picture_caption(attrs: dict[str, Any], layer: int, n: int, metric: str) -> str:
    """What the layer picture's predictions are: which probe, its C (the table's when they are
    the table's predictions), and which accuracy is which."""
    c = attrs["c"]
    if attrs.get("source") == "table":
        how = (
            f"the table's probe: 5-fold cross-validated, each example predicted by a probe that "
            f"did not see it; C = {c:.4g}, the table's *probe C* (median over the folds)"
        )
    elif attrs["held_out"]:
        how = (
            f"a 3-fold cross-fitted probe of this layer alone, C = {c:g} chosen by "
            "cross-validation (not the table's 5-fold probe: the table's probe C may differ)"
        )
    else:
        how = f"in-sample, C = {c:g}: too few examples per class to hold any out"
    said = ""
    if attrs["accuracy"] is not None:
        said = f". Accuracy: it gets {100 * attrs['accuracy']:.1f} % of these {n:,} examples right"
        if attrs.get("source") == "table":
            said += (
                " — the tile *probe s* above"
                if metric == "accuracy"
                else f"; the tile *probe s* is the task's metric ({metric}) over the same "
                "predictions, so the two numbers differ"
            )
    return (
        f"Hover a dot for its text, label and the prediction of layer {layer}'s probe ({how})"
        f"{said}. Drag a box or lasso around dots to list those examples below."
    )


def _example_list(text: str, n: int) -> list[int] | None:
    """``"3,17,42"`` → [3, 17, 42] when every number is an example of 0..n−1, else None."""
    numbers = [whole(part, 0, n - 1) for part in text.split(",") if part.strip()]
    return None if not numbers or None in numbers else sorted(set(numbers))


def _selection(event, fig, table: pd.DataFrame, layer: int) -> None:
    """The selected examples' table; the selection lives in the link (``picked``), so a copied
    link shows the same examples selected."""
    state = st.session_state
    points = (event or {}).get("selection", {}).get("points", []) if event else []
    if points:
        chosen = selected_examples(points, fig)
        state["layers_pic_selected"] = True
    elif state.get("layers_pic_selected"):
        chosen = []  # the user cleared the selection
    else:
        chosen = state.get("layers_picked") or []  # the link's, until the user selects
    state["layers_picked"] = chosen
    publish("picked", ",".join(map(str, chosen)) or None)
    if not chosen:
        return
    picked = table.set_index("example").loc[chosen].reset_index()
    st.markdown(f"**{counted(len(picked), 'selected example')}** at layer {layer}")
    st.dataframe(picked, hide_index=True, width="stretch")
    st.download_button(
        "Download the selection (CSV)", picked.to_csv(index=False),
        f"layer{layer}-selection.csv", "text/csv", key="layers_pic_download",
    )  # fmt: skip


@st.fragment
def teaching_view() -> None:
    """Synthetic classes with sliders; ν, CCA and ϱ update beside the scatter."""
    c1, c2, c3 = st.columns(3)
    n_classes = c1.slider("classes", 2, 6, 3, key="teach_classes", bind=BIND)
    dim = c1.radio("dimensions", [2, 3], horizontal=True, key="teach_dim", bind=BIND)
    separation = c2.slider(
        "separation (distance of the means from the centre)",
        0.0,
        6.0,
        3.0,
        0.1,
        key="teach_sep",
        bind=BIND,
    )
    spread = c2.slider(
        "spread (std within a class)", 0.1, 3.0, 1.0, 0.1, key="teach_spread", bind=BIND
    )
    n_per_class = c3.slider("points per class", 20, 300, 100, 10, key="teach_n", bind=BIND)
    seed = c3.number_input("seed", 0, 10_000, 0, key="teach_seed", bind=BIND)
    x, y = synthetic_classes(n_classes, dim, separation, spread, n_per_class, int(seed))
    values = teaching_metrics(x, y, seed=int(seed))
    plot, numbers = st.columns([3, 1])
    plot.plotly_chart(figures.teaching_scatter(x, y), width="stretch")
    numbers.metric("ν (lower = tighter, further apart)", f"{values['nu']:.4g}")
    numbers.metric("CCA score", f"{values['cca']:.3f}")
    numbers.metric("rank ϱ", f"{values['rank']:.3f}")
    if n_classes == 2 and separation > 0:
        numbers.caption(
            f"Two classes at ±separation: ν ≈ ½ · spread² / separation² = "
            f"{0.5 * spread**2 / separation**2:.4g} (the sample's value differs by noise)."
        )
