"""What one page computed and another page suggests, kept per (model, data, sample).

The Layers page finds ℓ*, the Heads page a head selection; the Fine-tune page offers them as
defaults. Each is stored in the session under the recipe it was computed for, and looked up by
the recipe the asking page names, so a result for one model, data set or sample never shows up
as a suggestion for another (ℓ* of Amazon reviews is not ℓ* of TREC).

- ℓ* is keyed by the whole extraction: model, data (with its columns and split), sample (N,
  seed), pooling and max length.
- A head selection is keyed by model, data, sample seed and max length (the Heads page has its
  own n and settings, which the selection file records).
"""

from __future__ import annotations

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import ExtractConfig, to_dict
from analysis.heads.selection_file import HeadSelection, selection_from_dict

_L_STAR = "suggested_l_star"
_HEADS = "suggested_heads"


def extraction_key(cfg: ExtractConfig) -> str:
    """The recipe of an extraction (batch size aside: it does not change the numbers)."""
    recipe = to_dict(cfg)
    recipe.pop("batch_size", None)
    return canonical_json(recipe)


def heads_key(cfg: ExtractConfig) -> str:
    return canonical_json(
        {
            "model": to_dict(cfg.model),
            "data": to_dict(cfg.data),
            "seed": cfg.sample.seed,
            "max_length": cfg.max_length,
        }
    )


def remember_l_star(cfg: ExtractConfig, l_star: int) -> None:
    st.session_state.setdefault(_L_STAR, {})[extraction_key(cfg)] = int(l_star)


def l_star_for(cfg: ExtractConfig, n_layers: int | None = None) -> int | None:
    """ℓ* the Layers page found for exactly this extraction in this session (None if none, or
    if it is not a layer of a model with ``n_layers`` layers)."""
    value = st.session_state.get(_L_STAR, {}).get(extraction_key(cfg))
    if value is None or (n_layers is not None and not 1 <= value <= n_layers):
        return None
    return int(value)


def remember_heads(cfg: ExtractConfig, selection: HeadSelection) -> None:
    st.session_state.setdefault(_HEADS, {})[heads_key(cfg)] = selection.to_dict()


def heads_for(cfg: ExtractConfig) -> HeadSelection | None:
    """The Heads page's latest selection for this model, data, seed and max length, or None."""
    value = st.session_state.get(_HEADS, {}).get(heads_key(cfg))
    if value is None:
        return None
    try:
        return selection_from_dict(value)
    except ValueError:
        return None
