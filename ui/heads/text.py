"""Plain-language explanations, with formulas, for the Heads page (paper 002;
docs/explanation/heads.md, "Heads")."""

from __future__ import annotations

import streamlit as st

INTRO = (
    "Which attention heads should head fine-tuning (HiFi) train? For a sample of n examples, every "
    "head's output O_h(x), its slice of the attention context over the real tokens of x "
    "(S × d_head, padding excluded), is summarised twice: how **rich** it is (how many singular "
    "directions carry most of it) and how strongly it **co-varies** with the other heads of its "
    "layer. A graph of the heads of each layer then ranks them with **PageRank**; the top-k heads "
    "of each layer are the selection. Only sums over examples are kept, so n can be large."
)


def attention() -> None:
    st.markdown(
        "**What a head attends to.** On one example, head h of layer ℓ turns each token into a "
        "query and a key; the softmax of their scaled products says how much each token (row) "
        "takes from every token (column) when the head mixes the values. Its output O_h, whose "
        "richness and correlations the other tabs summarise over the sample, is A_h V_h."
    )
    st.latex(
        r"A_h = \operatorname{softmax}\!\Big(\frac{Q_h K_h^\top}{\sqrt{d_{head}}} + "
        r"\text{mask}\Big) \in \mathbb{R}^{S\times S},\qquad O_h = A_h V_h"
    )


SAMPLE_SIZES = (
    "Why a second sample size: this page's **n** (300 by default, as in the HiFi paper) is its "
    "own, not the sidebar's N. Head statistics cost a forward pass with one singular-value "
    "decomposition per head and example, and a few hundred examples already hold tens of "
    "thousands of tokens; the layer analyses (Data, Layers) use the sidebar's N because CCA and "
    "the probes need more examples. The model, data, seed and max length are the sidebar's."
)


def richness() -> None:
    st.markdown(
        "**Information richness I_h.** Take the singular values σ₁ ≥ σ₂ ≥ … of one head's output "
        "on one example; I_h(x) is how many of them it takes to reach a share ξ of their total. "
        "A head whose output spreads over many directions scores high. I_h is the mean over the "
        "n examples (the hover shows the spread)."
    )
    st.latex(
        r"I_h(x) = \min\Big\{t : \frac{\sum_{i\le t}\sigma_i}{\sum_j \sigma_j} \ge \xi\Big\},"
        r"\qquad I_h = \frac1n \sum_{i=1}^n I_h(x_i)"
    )


def correlation() -> None:
    st.markdown(
        "**Head-to-head correlation r.** Average each head's output over the tokens (a d_head "
        "vector O'_h), take the unbiased covariance of two heads' vectors over their d_head "
        "coordinates, keep its size, and average over the examples. The diagonal is 0. All "
        "layers share one colour scale, so layers can be compared."
    )
    st.latex(
        r"r_{h,h'} = \frac1n\sum_{i=1}^n \Big|\frac{\sum_{c=1}^{d_{head}}"
        r"(o_{h,c}-\bar o_h)(o_{h',c}-\bar o_{h'})}{d_{head}-1}\Big|, \qquad r_{h,h} = 0"
    )


def pagerank() -> None:
    st.markdown(
        "**PageRank.** Each layer is a graph whose nodes are its heads. A walker starts at head h "
        "with probability proportional to I_h and moves to head h' in proportion to their correlation r(h, h'); "
        "with probability 1 − d it jumps instead (the teleport). The scores p* are where the "
        "walk settles; the ringed heads are the k chosen per layer. Iteration stops when the "
        "scores change by less than ε = 10⁻⁶ (L1)."
    )
    st.latex(
        r"p^{(0)}_h = \frac{I_h}{\sum_{h'} I_{h'}},\quad "
        r"m_{h,h'} = \frac{r_{h,h'}}{\sum_{h''\ne h} r_{h,h''}},\quad "
        r"P \leftarrow d\,M^\top P + \frac{1-d}{H}\,\mathbb{1}"
    )


def teleport_note() -> None:
    st.info(
        "**Why, in the paper's form, I_h cannot change the result.** With a uniform teleport "
        "(1 − d)/H · 𝟙 the iteration is a contraction with a single fixed point, and that point "
        "depends only on M (the correlations) and d, not on where the walk starts. I_h enters "
        "only through the starting point P⁽⁰⁾, so it changes how many iterations are needed, "
        "never the ranking. The **personalised** variant teleports to P⁽⁰⁾ instead, "
        "P ← d Mᵀ P + (1 − d) P⁽⁰⁾, so richer heads gain. The chart below shows both for one "
        "layer; the paper's form is the default. (A head with no correlation to any other head "
        "would link to all other heads equally.)",
        icon=":material/info:",
    )


def robustness() -> None:
    st.markdown(
        "**Robustness.** The paper checks that its metrics hardly move when the sample size or "
        "the sequence length changes (300 vs 1000 examples; max length 128 vs 64). Here the "
        "statistics are computed a second time with one setting changed; Kendall τ compares the "
        "order of the heads within each layer (1: same order, 0: unrelated, −1: reversed), and "
        "the overlap is the share of the k chosen heads that both settings choose."
    )
    st.latex(
        r"\tau = \frac{(\text{concordant pairs}) - (\text{discordant pairs})}"
        r"{\sqrt{(n_0-n_1)(n_0-n_2)}}\quad(\tau_b,\ \text{ties allowed})"
    )
    st.caption(
        "Per layer, over its H heads: n₀ = H(H − 1)/2 pairs of heads; n₁ = the pairs tied in the "
        "first setting's ranking, n₂ = those tied in the second's (τ_b's correction for ties; "
        "with no ties it is the plain Kendall τ). A pair is concordant when both settings order "
        "its two heads the same way."
    )
