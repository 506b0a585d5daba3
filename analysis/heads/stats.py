"""Per-head statistics, streamed: information richness I_h and head-to-head |cov|
(docs/explanation/heads.md, "Information richness" and "Head-to-head correlation").

Vocabulary (docs/explanation/layer-metrics.md, "Notation"): ``layer`` is 1-based (1..L); an
array of shape (L, ...) holds layer ℓ in row ℓ − 1. ``head`` is 0-based (0..H−1). ``d_head`` =
d_model / H.

``HeadStatsAccumulator`` streams batches of head outputs O_h(x) (B, S, H, d_head) and keeps only
sums: per-example information richness I_h(x) and the per-example |cov| matrix of the token-mean
head vectors. Memory does not grow with the number of examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch


def information_richness(singular_values: torch.Tensor, xi: float) -> torch.Tensor:
    """I(x) = the smallest t with Σ_{i≤t} σ_i / Σ_j σ_j ≥ ξ (paper eq. 2;
    docs/explanation/heads.md, "Information richness").

    singular_values: (..., T), sorted in descending order (as ``torch.linalg.svdvals`` returns).
    Returns (...) int64 in 1..T. Trailing zero singular values (from zero padding rows) change
    neither the partial sums nor the total, so they never change t. An all-zero matrix has no
    singular-value mass at all; its richness is 0.
    """
    check_xi(xi)
    cumulative = torch.cumsum(singular_values.double(), dim=-1)
    total = cumulative[..., -1:]
    below = (cumulative < xi * total).sum(dim=-1)
    return torch.where(total[..., 0] > 0, below + 1, torch.zeros_like(below))


def head_covariance(head_means: torch.Tensor) -> torch.Tensor:
    """cov(O'_h, O'_h') over the d_head coordinates, unbiased (paper eq. 6).

    head_means: (..., H, d_head), one token-mean vector O'_h per head. Returns (..., H, H).
    """
    d_head = head_means.shape[-1]
    if d_head < 2:
        raise ValueError("The covariance over head coordinates needs d_head ≥ 2.")
    centred = head_means - head_means.mean(dim=-1, keepdim=True)
    return centred @ centred.transpose(-1, -2) / (d_head - 1)


def as_token_mask(lengths_or_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """A (B, S) bool mask of real tokens from either (B,) lengths or a (B, S) 0/1 mask."""
    if lengths_or_mask.dim() == 1:
        positions = torch.arange(seq_len, device=lengths_or_mask.device)
        return positions[None, :] < lengths_or_mask[:, None]
    if lengths_or_mask.dim() == 2 and lengths_or_mask.shape[1] == seq_len:
        return lengths_or_mask.bool()
    raise ValueError(
        f"Expected (B,) lengths or a (B, {seq_len}) mask, got shape {tuple(lengths_or_mask.shape)}."
    )


@dataclass(frozen=True)
class HeadStats:
    """Head statistics of one sample, per layer (row ℓ − 1 is layer ℓ).

    richness: (L, H) mean I_h over the examples; richness_std: (L, H) their standard deviation;
    correlation: (L, H, H) mean |cov| with a zero diagonal; n: examples seen; xi: ξ used.
    """

    richness: np.ndarray
    richness_std: np.ndarray
    correlation: np.ndarray
    n: int
    xi: float

    @property
    def n_layers(self) -> int:
        return self.richness.shape[0]

    @property
    def n_heads(self) -> int:
        return self.richness.shape[1]

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The arrays as tensors, for the disk cache (``n`` and ``xi`` go in its meta)."""
        return {
            "richness": torch.from_numpy(self.richness),
            "richness_std": torch.from_numpy(self.richness_std),
            "correlation": torch.from_numpy(self.correlation),
        }

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], n: int, xi: float) -> HeadStats:
        return cls(
            richness=tensors["richness"].double().numpy(),
            richness_std=tensors["richness_std"].double().numpy(),
            correlation=tensors["correlation"].double().numpy(),
            n=int(n),
            xi=float(xi),
        )


class HeadStatsAccumulator:
    """Streams head outputs batch by batch and keeps only sums (memory independent of n).

    For every example x and head h of a layer it computes I_h(x) (batched ``svdvals`` over the
    B·H zero-padded S × d_head matrices: padding rows are zero, which adds only zero singular
    values) and r(h, h' | x) = |cov(O'_h, O'_h')| with O'_h the mean over the real tokens.
    """

    def __init__(self, n_layers: int, n_heads: int, d_head: int, xi: float = 0.9) -> None:
        for name, value in (("n_layers", n_layers), ("n_heads", n_heads), ("d_head", d_head)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive whole number (got {value!r}).")
        if d_head < 2:
            raise ValueError("d_head must be at least 2 for a covariance over head coordinates.")
        check_xi(xi)
        self.n_layers, self.n_heads, self.d_head, self.xi = n_layers, n_heads, d_head, float(xi)
        self._richness_sum = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        self._richness_sq_sum = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        self._correlation_sum = torch.zeros(n_layers, n_heads, n_heads, dtype=torch.float64)
        self._count = torch.zeros(n_layers, dtype=torch.int64)

    @torch.no_grad()
    def update(self, layer: int, head_outputs: torch.Tensor, lengths_or_mask: torch.Tensor) -> None:
        """Add one batch of one layer.

        layer: 1..L. head_outputs: (B, S, H, d_head), any device. lengths_or_mask: (B,) number
        of real tokens (padding at the end) or a (B, S) mask of real tokens (padding anywhere).
        """
        if not 1 <= layer <= self.n_layers:
            raise ValueError(f"Layer {layer} is outside 1..{self.n_layers}.")
        if head_outputs.dim() != 4 or tuple(head_outputs.shape[2:]) != (self.n_heads, self.d_head):
            raise ValueError(
                f"Head outputs must have shape (B, S, {self.n_heads}, {self.d_head}), "
                f"got {tuple(head_outputs.shape)}."
            )
        batch, seq_len = head_outputs.shape[:2]
        mask = as_token_mask(lengths_or_mask.to(head_outputs.device), seq_len)  # (B, S)
        n_tokens = mask.sum(dim=1)  # (B,)
        if bool((n_tokens == 0).any()):
            raise ValueError("An example has no real tokens: nothing to measure.")

        outputs = head_outputs.float() * mask[:, :, None, None]  # (B, S, H, dh), padding → 0
        per_head = outputs.permute(0, 2, 1, 3)  # (B, H, S, dh)
        sigma = torch.linalg.svdvals(per_head)  # (B, H, min(S, dh))
        richness = information_richness(sigma, self.xi).double().cpu()  # (B, H)

        means = outputs.sum(dim=1) / n_tokens[:, None, None]  # (B, H, dh)
        correlation = head_covariance(means.double()).abs().sum(dim=0).cpu()  # (H, H)

        row = layer - 1
        self._richness_sum[row] += richness.sum(dim=0)
        self._richness_sq_sum[row] += (richness**2).sum(dim=0)
        self._correlation_sum[row] += correlation
        self._count[row] += batch

    def result(self) -> HeadStats:
        """Means over the examples seen; every layer must have seen the same examples."""
        counts = self._count.unique()
        if len(counts) != 1 or int(counts[0]) == 0:
            raise ValueError(
                "Every layer needs the same, non-zero number of examples "
                f"(got {self._count.tolist()})."
            )
        n = int(counts[0])
        richness = self._richness_sum / n
        variance = (self._richness_sq_sum / n - richness**2).clamp_min(0.0)
        correlation = self._correlation_sum / n
        correlation.diagonal(dim1=-2, dim2=-1).zero_()
        return HeadStats(
            richness=richness.numpy(),
            richness_std=variance.sqrt().numpy(),
            correlation=correlation.numpy(),
            n=n,
            xi=self.xi,
        )


def check_xi(xi: float) -> None:
    if not 0.0 < xi <= 1.0:
        raise ValueError(f"The singular-value mass threshold ξ must lie in (0, 1] (got {xi!r}).")
