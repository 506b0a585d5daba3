"""PageRank over the heads of one layer (paper 002, eq. 8–10;
docs/explanation/heads.md, "PageRank")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.heads.selection_file import PAGERANK_VARIANTS
from analysis.heads.stats import HeadStats


@dataclass(frozen=True)
class PageRankResult:
    """scores: (H,) the fixed point P*, sums to 1; iterations: updates until ‖ΔP‖₁ < ε."""

    scores: np.ndarray
    iterations: int


def initial_distribution(richness: np.ndarray) -> np.ndarray:
    """p⁽⁰⁾_h = I_h / Σ I (paper eq. 8); uniform when every I_h is 0. (H,) → (H,)."""
    richness = np.asarray(richness, dtype=np.float64)
    if (richness < 0).any():
        raise ValueError("Information richness cannot be negative.")
    total = richness.sum()
    if total <= 0:
        return np.full(richness.shape, 1.0 / richness.size)
    return richness / total


def transition_matrix(correlation: np.ndarray) -> np.ndarray:
    """m_{h,h'} = r_{h,h'} / Σ_{h''≠h} r_{h,h''} with m_{h,h} = 0 (paper eq. 9). (H, H) → (H, H).

    A head whose correlation with every other head is 0 (a dangling node: in practice only an
    all-zero head output) links uniformly to the H − 1 other heads, so M stays row-stochastic
    with a zero diagonal. With H = 1 the only possible move is the self-loop.
    """
    r = np.array(correlation, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] != r.shape[1]:
        raise ValueError(f"The correlation matrix must be square, got shape {r.shape}.")
    if (r < 0).any():
        raise ValueError("Correlations |cov| cannot be negative.")
    n_heads = r.shape[0]
    if n_heads == 1:
        return np.ones((1, 1))
    np.fill_diagonal(r, 0.0)
    row_sums = r.sum(axis=1, keepdims=True)
    m = np.divide(r, row_sums, out=np.zeros_like(r), where=row_sums > 0)
    dangling = row_sums[:, 0] <= 0
    m[dangling] = (1.0 - np.eye(n_heads)[dangling]) / (n_heads - 1)
    return m


def pagerank(
    richness: np.ndarray,
    correlation: np.ndarray,
    damping: float = 0.85,
    tol: float = 1e-6,
    variant: str = "paper",
    max_iter: int = 10_000,
) -> PageRankResult:
    """PageRank of the heads of one layer (paper eq. 10; docs/explanation/heads.md, "PageRank").

    richness: (H,) I_h; correlation: (H, H) r. From P⁽⁰⁾ = p⁽⁰⁾ iterate
        P ← d Mᵀ P + (1 − d)/H · 𝟙       (variant "paper": uniform teleport)
        P ← d Mᵀ P + (1 − d) P⁽⁰⁾         (variant "personalised")
    until ‖ΔP‖₁ < ε. With the uniform teleport the fixed point does not depend on P⁽⁰⁾, so I_h
    only changes the iteration count; the personalised teleport lets I_h shape the result.
    """
    check_damping(damping)
    if not tol > 0:
        raise ValueError(f"The tolerance ε must be positive (got {tol!r}).")
    if variant not in PAGERANK_VARIANTS:
        raise ValueError(
            f"Unknown PageRank variant {variant!r}: choose {' or '.join(PAGERANK_VARIANTS)}."
        )
    p0 = initial_distribution(richness)
    m = transition_matrix(correlation)
    if m.shape[0] != p0.shape[0]:
        raise ValueError(
            f"{p0.shape[0]} richness values but a {m.shape[0]}-head correlation matrix."
        )
    teleport = (1.0 - damping) * (
        p0 if variant == "personalised" else np.full_like(p0, 1 / p0.size)
    )
    scores = p0
    for iteration in range(1, max_iter + 1):
        updated = damping * (m.T @ scores) + teleport
        change = np.abs(updated - scores).sum()
        scores = updated
        if change < tol:
            return PageRankResult(scores=scores, iterations=iteration)
    raise ValueError(f"PageRank did not converge to ε = {tol} in {max_iter} iterations.")


def layer_pageranks(
    stats: HeadStats, damping: float = 0.85, tol: float = 1e-6, variant: str = "paper"
) -> tuple[np.ndarray, np.ndarray]:
    """PageRank of every layer: scores (L, H) and iteration counts (L,)."""
    results = [
        pagerank(stats.richness[i], stats.correlation[i], damping, tol, variant)
        for i in range(stats.n_layers)
    ]
    scores = np.stack([r.scores for r in results])
    iterations = np.array([r.iterations for r in results], dtype=np.int64)
    return scores, iterations


def check_damping(damping: float) -> None:
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"The damping factor d must lie in [0, 1) (got {damping!r}).")
