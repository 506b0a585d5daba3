"""LoRA ranks per layer from the layer metrics, as options of method ``lora``
(docs/explanation/recommendation.md, "The LoRA allocation, and EVA's").

The rule (probe gain): with s_ℓ the probe score of layer ℓ (ℓ = 0 the embeddings),

    g_ℓ = max(s_ℓ − s_{ℓ−1}, 0),  ℓ = 1..L

the task information layer ℓ adds that a linear read-out can see. The layers with g_ℓ > 0 get
LoRA (``layers_to_transform``); the total rank R (a uniform LoRA's r · L, so the trainable count
matches it) is shared out in proportion to g_ℓ, each chosen layer getting at least rank 1
(`apportion`: largest remainders, ties to the lower layer). A flat or falling probe curve
(no g_ℓ > 0) gives every layer the same share. alpha_ℓ = alpha · r_ℓ / r keeps every layer's
update scale alpha / r. Deterministic: the same curve gives the same ranks.

The allocation trains as method ``lora`` with ``ranks`` and ``alphas`` (`LoraAllocation.options`),
so its runs, its exact trainable count and its PEFT ``LoraConfig`` (``rank_pattern`` /
``alpha_pattern``) are that method's (`analysis.finetune.methods.lora`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.methods.lora import LoraOptions, lora_config

RULE = "probe gain"


def apportion(weights: Mapping[int, float], total: int) -> dict[int, int]:
    """Whole ranks ≥ 1 summing to ``total`` over the layers of positive weight, in proportion to
    their weights (largest remainders; ties to the lower layer).

    weights: layer → weight ≥ 0 (non-finite counts as 0). With no positive weight every layer
    counts equally. When ``total`` is below the number of positive layers, the ``total`` of
    largest weight get rank 1 each."""
    if not isinstance(total, int) or total < 1:
        raise ValueError(f"The total rank must be a whole number ≥ 1 (got {total!r}).")
    clean = {int(k): (float(w) if math.isfinite(float(w)) else 0.0) for k, w in weights.items()}
    if any(w < 0 for w in clean.values()):
        raise ValueError("Rank weights must be ≥ 0.")
    chosen = {k: w for k, w in clean.items() if w > 0} or dict.fromkeys(clean, 1.0)
    if not chosen:
        raise ValueError("No layers to give ranks to.")
    order = sorted(chosen, key=lambda k: (-chosen[k], k))  # largest weight first, lower layer
    if total < len(chosen):
        return {k: 1 for k in sorted(order[:total])}
    extra = total - len(chosen)
    mass = sum(chosen.values())
    quotas = {k: extra * w / mass for k, w in chosen.items()}
    ranks = {k: 1 + math.floor(q) for k, q in quotas.items()}
    left = total - sum(ranks.values())
    by_remainder = sorted(chosen, key=lambda k: (-(quotas[k] - math.floor(quotas[k])), k))
    for k in by_remainder[:left]:
        ranks[k] += 1
    return dict(sorted(ranks.items()))


def probe_gains(probe: Sequence[float]) -> dict[int, float]:
    """Layer ℓ = 1..L → g_ℓ = max(s_ℓ − s_{ℓ−1}, 0) from the probe curve s_0..s_L (NaN → 0)."""
    values = [float(x) for x in probe]
    if len(values) < 2:
        raise ValueError("The probe curve needs layers 0..L with L ≥ 1.")
    gains = {}
    for layer in range(1, len(values)):
        step = values[layer] - values[layer - 1]
        gains[layer] = step if math.isfinite(step) and step > 0 else 0.0
    return gains


@dataclass(frozen=True)
class LoraAllocation:
    """Ranks per layer (1-based) of LoRA on query and value; ``r`` the uniform rank whose total
    r · L it keeps; ``gains`` the weights the rule used (layer → g_ℓ)."""

    ranks: tuple[tuple[int, int], ...]
    r: int
    alpha: float
    n_layers: int
    gains: tuple[tuple[int, float], ...] = ()
    rule: str = RULE

    @property
    def total_rank(self) -> int:
        return sum(rank for _, rank in self.ranks)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(layer for layer, _ in self.ranks)

    @property
    def alphas(self) -> tuple[tuple[int, float], ...]:
        """Each layer's alpha_ℓ = alpha · r_ℓ / r."""
        return tuple((layer, self.alpha * rank / self.r) for layer, rank in self.ranks)

    @property
    def is_uniform(self) -> bool:
        """Rank r on every layer: uniform LoRA itself."""
        return self.ranks == tuple((layer, self.r) for layer in range(1, self.n_layers + 1))

    def options(self) -> LoraOptions:
        """Method ``lora``'s options that train this allocation."""
        return LoraOptions(r=self.r, alpha=self.alpha, ranks=self.ranks, alphas=self.alphas)

    def words(self) -> str:
        """``ranks 2, 8, 6 on layers 2, 3, 5 (total 16 = 8 × 2 layers' worth)``."""
        ranks = ", ".join(str(rank) for _, rank in self.ranks)
        layers = ", ".join(str(layer) for layer in self.layers)
        return f"LoRA ranks {ranks} on layers {layers} (total {self.total_rank})"

    def to_dict(self, family: str | None = None) -> dict[str, Any]:
        """The rule, its weights and ranks; with ``family``, the PEFT fields method ``lora``
        exports (``layers_to_transform`` 0-based, ``rank_pattern``, ``alpha_pattern``,
        ``target_modules``)."""
        out: dict[str, Any] = {
            "rule": self.rule,
            "r": self.r,
            "lora_alpha": self.alpha,
            "total_rank": self.total_rank,
            "ranks": {str(layer): rank for layer, rank in self.ranks},
            "weights": {str(layer): round(gain, 6) for layer, gain in self.gains},
        }
        if family is not None:
            config = self.peft_config(family)
            out.update(
                layers_to_transform=list(config.layers_to_transform),
                rank_pattern=dict(config.rank_pattern),
                alpha_pattern=dict(config.alpha_pattern),
                target_modules=sorted(config.target_modules),
            )
        return out

    def peft_config(self, family: str):
        """The ``peft.LoraConfig`` method ``lora`` trains this allocation with
        (`analysis.finetune.methods.lora.lora_config`)."""
        cfg = FinetuneConfig(method="lora", options=self.options())
        return lora_config(cfg, family, self.n_layers)


def allocate_lora(probe: Sequence[float], r: int = 8, alpha: float = 16.0) -> LoraAllocation:
    """The probe-gain allocation (module docstring) of total rank r · L for the curve s_0..s_L."""
    gains = probe_gains(probe)
    n_layers = len(gains)
    ranks = apportion(gains, r * n_layers)
    return LoraAllocation(
        ranks=tuple(ranks.items()), r=r, alpha=float(alpha), n_layers=n_layers,
        gains=tuple(gains.items()),
    )  # fmt: skip
