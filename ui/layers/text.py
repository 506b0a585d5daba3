"""The Layers page's words: what each metric means, with its formula
(docs/explanation/layer-metrics.md, "Layer metrics")."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

if TYPE_CHECKING:
    from analysis.layers.repeats import Estimate

# The table's columns as a reader names them (the frame and its CSV keep the short names).
_NAMES = {"layer": "layer", "nu": "ν", "cca": "CCA", "rank": "ϱ", "probe": "probe s",
          "probe_c": "probe C"}  # fmt: skip
_HELP = {
    "nu": "task-specialty ν (lower = more specialised)",
    "cca": "CCA score (higher = more specialised)",
    "rank": "rank metric ϱ",
    "probe": "probe score: the task's metric over 5-fold cross-validated predictions",
    "probe_c": "the probe's L2 strength C: median over the 5 outer folds of the C its inner "
    "3-fold CV chose",
}


def column_labels(frame: pd.DataFrame) -> dict[str, object]:
    """`st.dataframe` column_config naming the metrics table's columns (nu → ν, probe_c →
    probe C, nu_se → ν s.e., nu_lo → ν 90 % lo…); columns it does not know keep their name."""
    config: dict[str, object] = {}
    for column in frame.columns:
        base, _, end = str(column).rpartition("_") if "_" in str(column) else ("", "", "")
        if column in _NAMES:
            label, help_text = _NAMES[column], _HELP.get(column)
        elif base in _NAMES and end in ("se", "lo", "hi"):
            suffix = {"se": "s.e.", "lo": "90 % lo", "hi": "90 % hi"}[end]
            label = f"{_NAMES[base]} {suffix}"
            help_text = {
                "se": f"bootstrap standard error of {_NAMES[base]}",
                "lo": f"lower end of {_NAMES[base]}'s 90 % BCa bootstrap interval",
                "hi": f"upper end of {_NAMES[base]}'s 90 % BCa bootstrap interval",
            }[end]
        else:
            continue
        fmt = "%d" if column == "layer" else "%.4g"
        config[column] = st.column_config.NumberColumn(label, help=help_text, format=fmt)
    return config


X1_AND_THE_LAYERS_PAGE = (
    "Why the Paper check's X1 and the Layers page give different ρ(ν, s) for the same settings: "
    "the Layers page measures ρ on the sidebar's one sample of N examples. X1 measures it on S "
    "samples of N (3 by default: one seeded draw of S·N examples cut into S disjoint blocks, "
    "else S draws with seeds s, s + 1, …), shows its *first* sample's ρ — other examples than "
    "the Layers page's sample — and says **unstable** when its samples' verdicts disagree. Both "
    "are right about their own samples; the spread between them is how much ρ moves with the "
    "sample (docs/explanation/statistics.md, 'Samples')."
)
STRATEGY_TRIPLE = (
    "A strategy is written (ℓ_bottom, ℓ_top, ℓ_cls): layers ℓ_bottom..ℓ_top train, every other "
    "layer stays frozen, the classifier reads layer ℓ_cls, and the layers above ℓ_cls are "
    "removed (they cost no time or memory)."
)


def signed(value: float | None, digits: int = 2) -> str:
    """A correlation for a tile: "+0.72", or "undefined" (NaN / None)."""
    if value is None or not math.isfinite(value):
        return "undefined"
    return f"{value:+.{digits}f}"


def tile(est: Estimate, signed: bool = True, digits: int = 2) -> tuple[str, str | None]:
    """An estimate as a metric tile: (the value, the line under it: its interval or s.e.), so
    the tile's value is never cut off by a long interval."""
    if not math.isfinite(est.value):
        return "undefined", None
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    if est.interval is not None:
        lo, hi = est.interval
        return f.format(est.value), f"90 % {est.method} [{f.format(lo)}, {f.format(hi)}]"
    if math.isfinite(est.se):
        return f.format(est.value), f"± {est.se:.{digits}f} s.e. (no interval)"
    return f.format(est.value), None


INTRO = """
Which layer of the encoder already **separates your classes best**? For every layer ℓ
(0 = the embeddings, 1..L = the transformer layers) we pool each example's token states into
one vector h⁽ˡ⁾ and ask how tightly the examples of a class cluster around their class mean,
compared with how far apart the class means are. The layer where this ratio is lowest is
**ℓ\\***: the paper (Xie et al., *Hidden state variability…*) tunes the layers around it instead
of the whole model.
"""


def nu() -> None:
    st.markdown(
        "**Task-specialty ν** — within-class spread (noise) relative to between-class spread "
        "(signal). Low ν: each class is a tight cluster far from the others, so even a linear "
        "classifier (LDA) finds sharp boundaries. ν is scale-invariant and computed in float64 "
        "from the rank-(C−1) SVD of the centred class means (no d × d matrix is inverted)."
    )
    st.latex(
        r"\Sigma_w=\frac1C\sum_y\frac1{N_y}\sum_{n\in\mathcal G_y}(h_n-\bar h_y)(h_n-\bar h_y)^\top,"
        r"\quad \Sigma_b=\frac1C\sum_y(\bar h_y-\bar h)(\bar h_y-\bar h)^\top,"
        r"\quad \nu^{(\ell)}=\frac1C\operatorname{tr}\!\left(\Sigma_w\Sigma_b^{+}\right)"
    )
    st.latex(r"\ell^*=\arg\min_{\ell\in 1..L}\nu^{(\ell)}")


def cca() -> None:
    st.markdown(
        "**CCA score** — how well a linear projection of the states lines up with the labels: "
        "the J = C − 1 canonical correlations between the states and the one-hot labels, fit on "
        "80 % of the examples with a ridge term λ chosen on 10 % (from a small grid, relative to "
        "the mean variance), averaged on the last 10 %. Higher = more specialised. (The paper "
        "fits CCA iteratively; we use the exact closed form below.)"
    )
    st.latex(
        r"\rho_1..\rho_J=\operatorname{svd}\!\left((\Sigma_{xx}+\lambda I)^{-1/2}\,\Sigma_{xy}\,"
        r"\Sigma_{yy}^{-1/2}\right),\qquad \text{CCA}^{(\ell)}=\frac1J\sum_{j=1}^{J}"
        r"\operatorname{corr}_{\text{held-out}}\!\left(Xa_j,\;Yb_j\right)"
    )


def rank() -> None:
    st.markdown(
        "**Rank metric ϱ** (Zhou et al.) — an effective rank of each class's matrix of states: "
        "low when a class's vectors are nearly parallel. It looks only *within* classes, so it "
        "can be low even when classes overlap; the paper found it the weakest guide."
    )
    st.latex(
        r"\varrho^{(\ell)}=\frac1C\sum_y\frac{\|H_y^{(\ell)}\|_*^2}{\|H_y^{(\ell)}\|_F^2}"
        r"\qquad(\|\cdot\|_* = \text{sum of singular values};\ 1\le\varrho_y\le\operatorname{rank}H_y)"
    )


def probe() -> None:
    st.markdown(
        "**Probe score s** — the ground truth the metrics try to predict without training: a "
        "logistic regression on the standardised states of one layer (ridge regression for "
        "scores), scored by *5-fold cross-validated predictions over all N examples*: each "
        "example is predicted once, by the probe fit on the other four folds (the folds fixed by "
        "the seed and shared by every layer, so layer differences are not fold noise), and the "
        "task's metric is taken over the N predictions (column *probe_se*: its bootstrap s.e.). "
        "Inside each outer fold the L2 strength is chosen by an inner 3-fold CV "
        "(C ∈ 10⁻⁴ … 10², column *probe_c*: the median over folds): a fixed C = 1 overfits a few hundred examples in "
        "hundreds of dimensions and can understate a layer by several points. ρ is the Pearson "
        "correlation across layers 1..L between a metric's curve and the probe curve: ν should "
        "correlate *negatively*, CCA positively."
    )
    st.latex(
        r"s^{(\ell)}=\text{score}_{\text{held-out}}\big(\text{LogReg}_{C^*}(h^{(\ell)})\big),\quad "
        r"C^*=\arg\max_{C}\ \text{CV}_3(C);\qquad "
        r"\rho(\nu,s)=\operatorname{corr}_{\ell=1..L}\left(\nu^{(\ell)},\,s^{(\ell)}\right)"
    )


def zeta() -> None:
    st.markdown(
        "**Smoothness ζ** — a ν curve you can trust changes gradually from layer to layer. We "
        "z-score the curve over layers 1..L and average its squared second differences (our "
        'reading of the paper\'s "small local second-order derivative"; its exact formula is '
        "not in our copy). Lower = smoother."
    )
    st.latex(
        r"\tilde\nu=\frac{\nu-\operatorname{mean}(\nu)}{\operatorname{std}(\nu)},\qquad"
        r"\zeta=\operatorname*{mean}_{1<\ell<L}\left(\tilde\nu_{\ell+1}-2\tilde\nu_\ell+\tilde\nu_{\ell-1}\right)^2"
    )


def whatifs() -> None:
    st.markdown(
        "**What-ifs** repeat the analysis on other samples of the same data, as the paper's "
        "robustness studies do: the *first* token instead of the mean (the paper found those "
        "curves far less smooth), an imbalanced sample with share p of the first class at fixed "
        "N, label-balanced samples of growing N (ν needs thousands of examples to settle), and "
        "several sampling seeds. Each needs its own forward pass (cached afterwards)."
    )


def teaching() -> None:
    st.markdown(
        "Drag the sliders: **separation** moves the class means apart ($\\Sigma_b$ grows), "
        "**spread** widens each class ($\\Sigma_w$ grows). ν falls as classes become tight and far apart — the "
        "picture behind *neural collapse*, where a trained network's top-layer classes shrink to "
        "points. CCA rises towards 1 as the classes become linearly separable; ϱ only sees how "
        "elongated each class is."
    )


def repeats() -> None:
    st.markdown(
        "**Repeats** — how much would these numbers move with another sample? The states are "
        "extracted once; each repeat draws a *stratified bootstrap resample* of the N examples "
        "(N_y draws with replacement within each class). ν and ϱ are recomputed on it; CCA is "
        "refit on a split drawn over the resample's *distinct* examples (every copy goes with its "
        "example); the probe is **not refit**: its out-of-fold predictions are resampled (refitting "
        "the nested CV per resample would cost the table R times over; the refit's own variation "
        "is left out, so the probe's and ρ(ν, s)'s intervals are slightly narrow). The value "
        "shown is always the full-sample estimate; brackets / columns *_lo, *_hi are **90 % BCa "
        "bootstrap intervals around it** (R ≥ 50; bias correction from the share of repeats below "
        "the estimate, acceleration from a 20-group jackknife). When every repeat lies on one side "
        "of the estimate no interval is shown (ϱ: a resample's duplicate rows always lower it). "
        "Bands: ± one bootstrap s.e. ℓ\\* as counts of repeats (stable at ≥ ⌈0.8 R⌉)."
    )
    st.latex(
        r"se(\nu^{(\ell)})=\operatorname{sd}_{r=1..R}\,\nu^{(\ell)}_r,\qquad "
        r"\hat\rho(\nu,s)\ \ [\,\rho^*_{(\alpha_1)},\ \rho^*_{(\alpha_2)}\,]\ \text{(BCa)},\qquad "
        r"\text{count}(\ell)=\#\{r:\ \ell^*_r=\ell\}"
    )
