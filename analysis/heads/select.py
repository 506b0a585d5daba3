"""Choosing heads: top-k per layer by PageRank or an ablation selector, robustness of the
ranking (Kendall τ) and what a selection costs in head fine-tuning
(docs/explanation/heads.md, "Selecting heads" and "Fine-tuning heads")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from analysis.heads.pagerank import check_damping, layer_pageranks
from analysis.heads.selection_file import (
    PAGERANK_VARIANTS,
    SCOPES,
    SELECTORS,
    HeadSelection,
)
from analysis.heads.stats import HeadStats
from analysis.seeding import Stream


@dataclass(frozen=True)
class HeadSelectionConfig:
    """How heads are ranked and chosen from the (cached) statistics; none of it needs a model.

    k: heads per layer; damping: d; tol: ε; variant: PageRank teleport (paper | personalised);
    scope: layer-wise (every layer) | mid-top (layers L//2+1..L); selector: pagerank or an
    ablation (see SELECTORS); seed: for the random selector.
    """

    k: int = 3
    damping: float = 0.85
    tol: float = 1e-6
    variant: str = "paper"
    scope: str = "layer-wise"
    selector: str = "pagerank"
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"k must be a whole number of heads ≥ 1 (got {self.k!r}).")
        check_damping(self.damping)
        if not self.tol > 0:
            raise ValueError(f"The tolerance ε must be positive (got {self.tol!r}).")
        if self.variant not in PAGERANK_VARIANTS:
            raise ValueError(
                f"Unknown PageRank variant {self.variant!r}: choose {' or '.join(PAGERANK_VARIANTS)}."
            )
        if self.scope not in SCOPES:
            raise ValueError(f"Unknown scope {self.scope!r}: choose {' or '.join(SCOPES)}.")
        if self.selector not in SELECTORS:
            raise ValueError(
                f"Unknown selector {self.selector!r}: choose one of {', '.join(SELECTORS)}."
            )


def scope_layers(n_layers: int, scope: str) -> list[int]:
    """The 1-based layers a scope tunes: layer-wise → 1..L, mid-top → L//2+1..L."""
    if scope not in SCOPES:
        raise ValueError(f"Unknown scope {scope!r}: choose {' or '.join(SCOPES)}.")
    first = 1 if scope == "layer-wise" else n_layers // 2 + 1
    return list(range(first, n_layers + 1))


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """The k heads with the highest scores, ties to the lower head index; sorted by head."""
    scores = np.asarray(scores, dtype=np.float64)
    if k > scores.size:
        raise ValueError(f"k = {k} heads asked for, but a layer has only {scores.size} heads.")
    order = np.argsort(-scores, kind="stable")
    return sorted(int(h) for h in order[:k])


def selector_scores(
    selector: str, richness: np.ndarray, correlation: np.ndarray, pagerank_scores: np.ndarray
) -> np.ndarray:
    """Per-head scores (L, H) whose top-k is the selector's choice (not for ``random``)."""
    if selector == "pagerank":
        return np.asarray(pagerank_scores, dtype=np.float64)
    if selector == "pagerank-lowest":
        return -np.asarray(pagerank_scores, dtype=np.float64)
    if selector == "richness":
        return np.asarray(richness, dtype=np.float64)
    if selector == "richness-lowest":
        return -np.asarray(richness, dtype=np.float64)
    if selector == "correlation":
        return total_correlation(correlation)
    raise ValueError(
        f"Selector {selector!r} has no scores: choose one of {', '.join(SELECTORS[:-1])}."
    )


def total_correlation(correlation: np.ndarray) -> np.ndarray:
    """Σ_{h'≠h} r_{h,h'} per head: (L, H, H) → (L, H)."""
    r = np.array(correlation, dtype=np.float64)
    idx = np.arange(r.shape[-1])
    r[..., idx, idx] = 0.0
    return r.sum(axis=-1)


def select_heads(
    richness: np.ndarray,
    correlation: np.ndarray,
    pagerank_scores: np.ndarray,
    k: int = 3,
    selector: str = "pagerank",
    scope: str = "layer-wise",
    seed: int = 0,
) -> dict[int, list[int]]:
    """Layer (1-based) → the k chosen heads (0-based, ascending) for every layer of the scope.

    richness, pagerank_scores: (L, H); correlation: (L, H, H). ``random`` draws each layer's
    heads from the method stream of training seed ``seed`` (`analysis.seeding`), a sub-stream
    per layer, so a layer's draw does not depend on scope.
    """
    n_layers, n_heads = np.shape(richness)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a whole number of heads ≥ 1 (got {k!r}).")
    if k > n_heads:
        raise ValueError(f"k = {k} heads per layer asked for, but the model has only {n_heads}.")
    if selector not in SELECTORS:
        raise ValueError(f"Unknown selector {selector!r}: choose one of {', '.join(SELECTORS)}.")
    layers = scope_layers(n_layers, scope)
    if selector == "random":
        return {
            layer: sorted(
                int(h)
                for h in Stream(seed, "method")
                .child(layer)
                .numpy()
                .choice(n_heads, k, replace=False)
            )
            for layer in layers
        }
    scores = selector_scores(selector, richness, correlation, pagerank_scores)
    return {layer: top_k(scores[layer - 1], k) for layer in layers}


@dataclass(frozen=True)
class HeadAnalysis:
    """PageRank and the selection of every layer. pagerank: (L, H); iterations: (L,)."""

    stats: HeadStats
    config: HeadSelectionConfig
    pagerank: np.ndarray
    iterations: np.ndarray
    selected: dict[int, list[int]]

    def layers_table(self) -> list[dict[str, Any]]:
        """One JSON-ready record per layer: layer, richness, correlation, pagerank, iterations, selected."""
        return [
            {
                "layer": layer,
                "richness": self.stats.richness[layer - 1].tolist(),
                "richness_std": self.stats.richness_std[layer - 1].tolist(),
                "correlation": self.stats.correlation[layer - 1].tolist(),
                "pagerank": self.pagerank[layer - 1].tolist(),
                "iterations": int(self.iterations[layer - 1]),
                "selected": self.selected.get(layer, []),
            }
            for layer in range(1, self.stats.n_layers + 1)
        ]

    def heads_frame(self) -> pd.DataFrame:
        """One row per (layer, head): richness, richness_std, total_correlation, pagerank, selected."""
        n_layers, n_heads = self.pagerank.shape
        layer, head = np.meshgrid(np.arange(1, n_layers + 1), np.arange(n_heads), indexing="ij")
        chosen = np.zeros((n_layers, n_heads), dtype=bool)
        for ell, heads in self.selected.items():
            chosen[ell - 1, heads] = True
        return pd.DataFrame(
            {
                "layer": layer.ravel(),
                "head": head.ravel(),
                "richness": self.stats.richness.ravel(),
                "richness_std": self.stats.richness_std.ravel(),
                "total_correlation": total_correlation(self.stats.correlation).ravel(),
                "pagerank": self.pagerank.ravel(),
                "selected": chosen.ravel(),
            }
        )

    def to_selection(self, model: str, settings: Mapping[str, Any] | None = None) -> HeadSelection:
        """The selection file's content: chosen heads plus every setting that produced them."""
        recipe = {"xi": self.stats.xi, "n": self.stats.n, **dataclasses.asdict(self.config)}
        return HeadSelection(
            model=model,
            layers={layer: list(heads) for layer, heads in self.selected.items()},
            settings={**recipe, **(settings or {})},
            n_layers=self.stats.n_layers,
            n_heads=self.stats.n_heads,
        )


def analyse_heads(stats: HeadStats, config: HeadSelectionConfig) -> HeadAnalysis:
    """PageRank per layer, then the config's selection. Cheap: run it on every widget change."""
    scores, iterations = layer_pageranks(stats, config.damping, config.tol, config.variant)
    selected = select_heads(
        stats.richness,
        stats.correlation,
        scores,
        k=config.k,
        selector=config.selector,
        scope=config.scope,
        seed=config.seed,
    )
    return HeadAnalysis(
        stats=stats, config=config, pagerank=scores, iterations=iterations, selected=selected
    )


# --------------------------------------------------------------------------------------------
# Robustness and cost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankAgreement:
    """Kendall τ between two head rankings: per_layer (L,) and overall (mean over layers)."""

    per_layer: np.ndarray
    overall: float


def rank_agreement(scores_a: np.ndarray, scores_b: np.ndarray) -> RankAgreement:
    """Kendall τ (τ-b, ties allowed) of the heads' order in each layer under two settings.

    scores_a, scores_b: (L, H). A layer whose scores are all equal in one setting has no
    ranking; its τ is NaN and the overall mean skips it (NaN if every layer is like that).
    """
    a, b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(
            f"Both score tables must be (L, H) of the same shape, got {a.shape} and {b.shape}."
        )
    per_layer = np.array([_kendall(a[i], b[i]) for i in range(a.shape[0])])
    finite = per_layer[np.isfinite(per_layer)]
    return RankAgreement(
        per_layer=per_layer, overall=float(finite.mean()) if finite.size else float("nan")
    )


def selection_overlap(
    a: Mapping[int, Sequence[int]], b: Mapping[int, Sequence[int]]
) -> dict[int, float]:
    """Per layer present in both: |A ∩ B| / max(|A|, |B|), the share of chosen heads in common."""
    return {
        layer: len(set(a[layer]) & set(b[layer])) / max(len(a[layer]), len(b[layer]), 1)
        for layer in sorted(set(a) & set(b))
    }


@dataclass(frozen=True)
class ParameterCount:
    """n_trainable: parameters a head selection trains; n_params: the total; share = ratio."""

    n_trainable: int
    n_params: int | None
    share: float | None


def trainable_parameter_count(
    selection: Mapping[int, Sequence[int]], d_model: int, d_head: int, n_params: int | None = None
) -> ParameterCount:
    """Parameters head fine-tuning changes (docs/explanation/heads.md, "Fine-tuning heads"): per
    selected head, the d_head rows of W_Q, W_K, W_V (d_head × d_model each) and their d_head bias
    entries:
        n_trainable = Σ_layers |selected| · 3 · (d_head · d_model + d_head).
    The classifier is not counted. BERT-large, k = 3 in all 24 layers: 14.2M of 335M = 4.2 %.
    """
    if d_model < 1 or d_head < 1:
        raise ValueError("d_model and d_head must be positive.")
    n_heads = sum(len(set(heads)) for heads in selection.values())
    n_trainable = n_heads * 3 * (d_head * d_model + d_head)
    share = None
    if n_params is not None:
        if n_params < 1:
            raise ValueError(f"The total parameter count must be positive (got {n_params}).")
        share = n_trainable / n_params
    return ParameterCount(n_trainable=n_trainable, n_params=n_params, share=share)


def _kendall(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(kendalltau(a, b).statistic)
