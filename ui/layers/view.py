"""The Layers page's interactive parts: the layer picture, the suggestion box, the teaching view."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import streamlit as st

from analysis.layers.repeats import RepeatSummary, rho_verdict
from analysis.layers.table import strategies
from analysis.layers.teaching import synthetic_classes, teaching_metrics
from ui.figures import layers as figures
from ui.layers.state import has_projection, mark_projection, projection

if TYPE_CHECKING:
    from analysis.extract import LayerStates


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
    lines += [
        f"- **ℓ\\*-down** — train layers ℓ_bottom..{l_star} "
        + (
            f"and read the classifier at layer {l_star} (layers above are dropped: cheaper) or at "
            f"{n_layers}: {down}"
            if l_star < n_layers
            else f"(ℓ\\* is the top layer, so the classifier stays at {n_layers}): {down}"
        ),
        f"- **ℓ\\*-up** — keep layers 1..{l_star} frozen and tune those above as a deep head: {up}",
        f"- compare with full fine-tuning {fmt_strategy((1, n_layers, n_layers))} and the top "
        "layers only; launch any of them on the **Fine-tune** page (ℓ\\* is passed on).",
    ]
    lines.append("\n" + _agreement(summ["rho"]["nu"], repeats))
    st.info("\n".join(lines), icon=":material/lightbulb:")


def _stability(repeats: RepeatSummary, l_star: int) -> str:
    sentence = repeats.l_star_sentence().replace("ℓ*", "ℓ\\*")
    if repeats.stable and repeats.modal_l_star == l_star:
        return f"Stable: {sentence} (bootstrap resamples of the N examples)."
    return (
        f"⚠ Not stable: {sentence}; no layer wins ≥ 80 % of the bootstrap resamples, so treat "
        "ℓ\\* as a hint (more examples N usually settle it)."
    )


def _agreement(rho: float | None, repeats: RepeatSummary | None) -> str:
    """Whether ν tracks the probe (claim X1), said only as far as the repeats support it."""
    if repeats is None or repeats.repeats < 2:
        if rho is None or not np.isfinite(rho):
            return "ρ(ν, s) is undefined here."
        return (
            f"ρ(ν, s) = {rho:+.2f} on this one sample (the paper saw ≤ −0.85); with one sample "
            "there is no interval: set repeats ≥ 2 to see whether it holds."
        )
    mean = repeats.rho_mean["nu"]
    lo, hi = repeats.rho_interval["nu"]
    quoted = f"ρ(ν, s) = {mean:+.2f} [{lo:+.2f}, {hi:+.2f}] over {repeats.repeats} repeats"
    verdict = rho_verdict(mean, (lo, hi))
    if verdict == "holds":
        return f"ν tracks the probe here: {quoted} (the paper: ≤ −0.85)."
    if verdict == "holds weakly":
        return f"ν tracks the probe, more weakly than in the paper (≤ −0.85): {quoted}."
    if verdict == "does not hold":
        return (
            f"⚠ ν and the probe disagree here: {quoted}. Lower ν did not mean a better probe on "
            "this data: treat ℓ\\* as a hint, try more examples (N) or the what-ifs."
        )
    return (
        f"{quoted}: the interval covers both agreement and disagreement, so the repeats cannot "
        "tell whether ν tracks the probe here (more examples N narrow it)."
    )


@st.fragment
def layer_picture(
    layer_states: LayerStates, df: pd.DataFrame, l_star: int | None, seed: int
) -> None:
    """A 2-D picture of one layer's states coloured by label: PCA at once, UMAP on request."""
    n_layers = layer_states.n_layers
    left, right = st.columns([3, 1])
    layer = left.slider(
        "layer",
        0,
        n_layers,
        l_star if l_star is not None else n_layers,
        key=f"layers_pic_layer_{n_layers}",
    )
    method = right.radio("picture", ["pca", "umap"], key="layers_pic_method", horizontal=True,
                         format_func=str.upper)  # fmt: skip
    if method == "umap" and not has_projection(layer_states, layer, method, seed):
        st.caption(
            f"UMAP (umap-learn, seed {seed}) takes seconds per layer; the first call compiles."
        )
        if not st.button(f"Compute UMAP for layer {layer}", key="layers_pic_umap"):
            method = "pca"
    with st.spinner(f"{method.upper()} of layer {layer}…"):
        xy = projection(layer_states, layer, method, seed)
    mark_projection(layer_states, layer, method, seed)
    labels = layer_states.labels.numpy()
    regression = layer_states.task_type == "regression"
    st.plotly_chart(
        figures.layer_scatter(xy, labels, layer_states.label_names, layer, method, regression),
        width="stretch",
    )
    row = df.loc[df["layer"] == layer].iloc[0]
    cols = st.columns(4)
    for col, metric in zip(cols, ("nu", "cca", "rank", "probe"), strict=True):
        col.metric(figures.SYMBOLS[metric], f"{row[metric]:.4g}")


@st.fragment
def teaching_view() -> None:
    """Synthetic classes with sliders; ν, CCA and ϱ update beside the scatter."""
    c1, c2, c3 = st.columns(3)
    n_classes = c1.slider("classes", 2, 6, 3, key="teach_classes")
    dim = c1.radio("dimensions", [2, 3], horizontal=True, key="teach_dim")
    separation = c2.slider(
        "separation (distance of the means from the centre)", 0.0, 6.0, 3.0, 0.1, key="teach_sep"
    )
    spread = c2.slider("spread (std within a class)", 0.1, 3.0, 1.0, 0.1, key="teach_spread")
    n_per_class = c3.slider("points per class", 20, 300, 100, 10, key="teach_n")
    seed = c3.number_input("seed", 0, 10_000, 0, key="teach_seed")
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
