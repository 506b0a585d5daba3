"""What each head attends to on one example: its attention pattern, token × token.

Head h of layer ℓ turns queries and keys into a row-stochastic matrix over the example's tokens,

    A_h = softmax(Q_h K_hᵀ / √d_head + mask)  ∈ ℝ^{S × S},   row i: how token i spreads its
                                                              attention over the S tokens.

One forward pass with ``output_attentions=True`` returns A for every layer and head at once. That
needs eager attention (SDPA and flash attention return no weights): `analysis.models.load_model`
loads every supported family that way. DeBERTa-v2's disentangled attention adds the relative
position terms inside the softmax; its A is still the matrix that mixes the values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from analysis.extract import model_inputs, tokenize
from analysis.models import LoadedModel

if TYPE_CHECKING:
    from analysis.cache import DiskCache


@dataclass(frozen=True)
class AttentionPattern:
    """Every head's attention on one example.

    tokens: the S tokens as the tokenizer writes them (special tokens included, truncated to the
    max length); weights: (L, H, S, S) float32, ``weights[ℓ - 1, h, i, j]`` = how much token i
    attends to token j in head h of layer ℓ (each row sums to 1).
    """

    tokens: tuple[str, ...]
    weights: np.ndarray

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    def head(self, layer: int, head: int) -> np.ndarray:
        """A_h of head ``head`` (0-based) in layer ``layer`` (1-based): (S, S)."""
        if not 1 <= layer <= self.n_layers:
            raise ValueError(f"layer must be within 1..{self.n_layers} (got {layer}).")
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head must be within 0..{self.n_heads - 1} (got {head}).")
        return self.weights[layer - 1, head]


def attention_pattern(
    loaded: LoadedModel, text: str, text_pair: str | None = None, max_length: int = 128
) -> AttentionPattern:
    """The attention pattern of every layer and head on one example (one forward pass)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("Give a non-empty text to look at its attention pattern.")
    tokens = tokenize(loaded.tokenizer, [text], [text_pair] if text_pair else None, max_length)
    inputs = tokens.pad([0], 0)
    inputs.pop("special_tokens_mask")
    inputs = {k: v.to(loaded.device) for k, v in inputs.items()}
    with torch.inference_mode():
        output = loaded.model(**model_inputs(loaded.model, inputs), output_attentions=True)
    attentions = output.attentions
    if not attentions or any(a is None for a in attentions):
        raise ValueError(
            f"{loaded.name} returned no attention weights: it must be loaded with eager attention."
        )
    weights = torch.stack([a[0] for a in attentions]).float().cpu().numpy()  # (L, H, S, S)
    names = tuple(loaded.tokenizer.convert_ids_to_tokens(tokens.input_ids[0]))
    return AttentionPattern(tokens=names, weights=weights)


def cached_attention_pattern(
    loaded: LoadedModel, text: str, text_pair: str | None = None, max_length: int = 128,
    cache: DiskCache | None = None,
) -> tuple[AttentionPattern, bool]:  # fmt: skip
    """`attention_pattern` from the disk cache when already computed (a prepared lesson runs no
    model during class). Returns (pattern, hit); the tokens are kept in the entry's JSON."""
    from analysis.cache import DiskCache

    recipe = {"model": loaded.identity(), "text": text, "text_pair": text_pair,
              "max_length": int(max_length), "version": 1}  # fmt: skip

    def compute():
        pattern = attention_pattern(loaded, text, text_pair, max_length)
        return {"weights": torch.from_numpy(pattern.weights)}, {"tokens": list(pattern.tokens)}

    tensors, meta, hit = (cache or DiskCache()).get_or_compute("attention", recipe, compute)
    return AttentionPattern(tuple(meta["tokens"]), tensors["weights"].numpy()), hit
