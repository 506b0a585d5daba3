"""What one page computed and another page suggests, kept per (model, data, sample).

The Layers page finds ℓ*, the Heads page a head selection; the Fine-tune page offers them as
defaults. ℓ* is read from the Layers analysis cached on disk for exactly the asking page's
extraction (`l_star_for`), so a new session sees it without visiting the Layers page; a head
selection is stored in the session under the recipe it was computed for. Either is looked up by
the recipe the asking page names, so a result for one model, data set or sample never shows up
as a suggestion for another (ℓ* of Amazon reviews is not ℓ* of TREC).

- ℓ* is keyed by the whole extraction: model, data (with its columns and split), sample (N,
  seed), pooling and max length.
- A head selection is keyed by model, data, sample seed and max length (the Heads page has its
  own n and settings, which the selection file records).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
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
    """What the Layers page found, in the session (kept for that page; the Fine-tune page reads
    the disk cache instead: `l_star_for`)."""
    st.session_state.setdefault(_L_STAR, {})[extraction_key(cfg)] = int(l_star)


def l_star_for(cfg: ExtractConfig, n_layers: int | None = None) -> int | None:
    """ℓ* of the Layers analysis for exactly this extraction, as cached on disk
    (`cached_l_star`): what any session sees, whether or not it visited the Layers page. None
    if it has not been computed, or if it is not a layer of a model with ``n_layers`` layers."""
    value = cached_l_star(cfg)
    if value is None or (n_layers is not None and not 1 <= value <= n_layers):
        return None
    return int(value)


def cached_l_star(cfg: ExtractConfig) -> int | None:
    """ℓ* = argmin ν of the layer metrics `analysis.layers.table.cached_layer_metrics` stored on
    disk for this extraction (its states' key inputs, the sample's seed, the default bins), without
    computing anything: None when the states or their metrics are not in the disk cache."""
    from analysis.cache import DiskCache
    from analysis.extract import extraction_inputs
    from analysis.layers.metrics import DEFAULT_BINS
    from analysis.layers.table import COLUMNS, metrics_recipe, summary
    from ui.loaders import get_data, get_model, get_states

    cache = DiskCache()
    try:
        inputs = extraction_inputs(cfg, get_model(cfg.model), get_data(cfg.data).fingerprint)
        if not cache.entry_dir("states", inputs).is_dir():
            return None
        states = get_states(cfg, "Reading the cached hidden states")  # a hit: no extraction
        entry = cache.load("layer_metrics", metrics_recipe(states, cfg.sample.seed, DEFAULT_BINS))
    except (ValueError, OSError):  # bad settings are the page's to report; no ℓ* then
        return None
    if entry is None:
        return None
    values = entry[0]["values"].numpy()
    frame = pd.DataFrame(values, columns=list(COLUMNS))
    frame.insert(0, "layer", np.arange(len(frame)))
    return summary(frame)["l_star"]


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
