"""What the candidates rest on, computed once (and disk-cached underneath): the layer metrics
with ℓ* and its counts over bootstrap repeats, the probe curve, the head statistics (PageRank)
and the weights' signal-to-noise ratio per layer. `gather` runs the analyses that are missing,
with progress; everything after it is a function of this `Evidence`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.progress import Progress, no_progress, scaled
from analysis.recommend.config import RecommendConfig

if TYPE_CHECKING:
    from analysis.extract import LayerStates
    from analysis.heads.stats import HeadStats
    from analysis.models import LoadedModel


@dataclass
class Evidence:
    """The analyses of one (model, data, sample).

    table: the layer metrics (`analysis.layers.table.layer_metrics` columns, layer 0..L);
    l_star: argmin ν; l_star_counts: layer → repeats choosing it (R = ``repeats``; empty with
    R = 1); heads: the head statistics; snr: layer → mean weight SNR; n_outputs: C (1 for
    regression); metric: the task's score; block_params: parameters of one layer block;
    encoder_params: the encoder's parameters without its pooler.
    """

    n_layers: int
    n_heads: int
    d_model: int
    family: str
    metric: str
    n_outputs: int
    table: pd.DataFrame
    l_star: int | None
    repeats: int
    l_star_counts: dict[int, int] = field(default_factory=dict)
    heads: HeadStats | None = None
    snr: dict[int, float] = field(default_factory=dict)
    block_params: int = 0
    encoder_params: int = 0

    @property
    def probe(self) -> np.ndarray:
        """The probe curve s_0..s_L, (L + 1,)."""
        return self.table.sort_values("layer")["probe"].to_numpy(dtype=float)

    @property
    def classifier_params(self) -> int:
        """dense d × d + bias, out d × C + bias (`analysis.finetune.model.Classifier`)."""
        d = self.d_model
        return d * d + d + d * self.n_outputs + self.n_outputs

    @property
    def n_params(self) -> int:
        """The model's parameters as the runs count them (encoder without pooler + classifier)."""
        return self.encoder_params + self.classifier_params

    def l_star_words(self) -> str:
        """``ℓ* = 4, chosen in 41 of 50 repeats (3 in 9)``: the full-sample ℓ* and how many
        bootstrap repeats choose it and each other layer."""
        if self.l_star is None:
            return "ℓ* is undefined (ν is not finite on any layer)"
        if not self.l_star_counts:
            return f"ℓ* = {self.l_star} (one sample, no repeats)"
        others = [f"{layer} in {c}" for layer, c in sorted(self.l_star_counts.items())
                  if layer != self.l_star]  # fmt: skip
        tail = f" ({', '.join(others)})" if others else ""
        chosen = self.l_star_counts.get(self.l_star, 0)
        return f"ℓ* = {self.l_star}, chosen in {chosen} of {self.repeats} repeats{tail}"

    def plateau(self) -> tuple[int, float, float] | None:
        """(ℓ_p, s_{ℓ_p}, s_best): the lowest layer whose probe score is within one s.e. (the
        best layer's bootstrap s.e.) of the best probe score; None without a probe curve."""
        body = self.table[self.table["layer"] >= 1].sort_values("layer")
        scores = body["probe"].to_numpy(dtype=float)
        if not np.isfinite(scores).any():
            return None
        best = int(np.nanargmax(scores))
        se = float(body["probe_se"].to_numpy(dtype=float)[best])
        se = se if math.isfinite(se) else 0.0
        layers = body["layer"].to_numpy(dtype=int)
        reach = np.flatnonzero(np.isfinite(scores) & (scores >= scores[best] - se))
        first = int(reach[0])
        return int(layers[first]), float(scores[first]), float(scores[best])


def layer_evidence(
    cfg: RecommendConfig, loaded: LoadedModel, progress: Progress | None = None
) -> tuple[LayerStates, pd.DataFrame, dict[int, int]]:
    """(states, layer metrics, ℓ*'s counts over the R = ``cfg.repeats`` bootstrap repeats; empty
    with R = 1): the extraction and the analyses that fan out per layer over
    `analysis.compute.current()`, each disk-cached."""
    from analysis.extract import extract_states
    from analysis.layers.repeats import cached_layer_repeats, summarise_repeats
    from analysis.layers.table import cached_layer_metrics

    progress = progress or no_progress
    states = extract_states(cfg.extract_config(), progress=scaled(progress, 0.0, 0.43),
                            loaded=loaded)  # fmt: skip
    table, _ = cached_layer_metrics(
        states, seed=cfg.sample_seed, progress=scaled(progress, 0.43, 0.79)
    )
    counts: dict[int, int] = {}
    if cfg.repeats > 1:
        rep, _ = cached_layer_repeats(
            states, seed=cfg.sample_seed, repeats=cfg.repeats,
            progress=scaled(progress, 0.79, 1.0),
        )  # fmt: skip
        counts = summarise_repeats(rep).l_star_counts
    return states, table, counts


def gather(cfg: RecommendConfig, loaded: LoadedModel, progress: Progress | None = None) -> Evidence:
    """The layer analyses (`layer_evidence`), the head statistics and the weight SNR per layer
    (`cached_layer_snr`), each disk-cached."""
    from analysis.data import load_data
    from analysis.heads.collect import HeadStatsConfig, head_stats
    from analysis.layers.table import summary
    from analysis.models import encoder_layers

    progress = progress or no_progress
    data = load_data(cfg.data)
    states, table, counts = layer_evidence(cfg, loaded, scaled(progress, 0.0, 0.7))
    heads_cfg = HeadStatsConfig(cfg.extract_config(n=cfg.heads_n), xi=cfg.xi)
    stats, _ = head_stats(heads_cfg, progress=scaled(progress, 0.7, 0.95),
                          loaded=loaded)  # fmt: skip
    progress(0.95, "weight signal-to-noise ratio per layer")
    blocks = encoder_layers(loaded.model)
    snr = cached_layer_snr(loaded)
    encoder_params = sum(
        p.numel() for name, p in loaded.model.named_parameters() if not name.startswith("pooler.")
    )
    progress(1.0, "analyses ready")
    return Evidence(
        n_layers=loaded.n_layers, n_heads=loaded.n_heads, d_model=loaded.d_model,
        family=loaded.model_family, metric=states.metric,
        n_outputs=1 if data.task_type == "regression" else data.n_classes,
        table=table, l_star=summary(table)["l_star"], repeats=cfg.repeats, l_star_counts=counts,
        heads=stats, snr=snr, block_params=sum(p.numel() for p in blocks[0].parameters()),
        encoder_params=encoder_params,
    )  # fmt: skip


SNR_KIND = "weight_snr"  # the disk cache's entries of the weights' SNR per layer (JSON)


def snr_recipe(loaded: LoadedModel) -> dict[str, Any]:
    """What the weights' SNR per layer depends on: the model's weights, and the formula's
    version (bump it when `weight_snr` changes)."""
    return {"model": loaded.identity(), "version": 1}


def cached_layer_snr(loaded: LoadedModel) -> dict[int, float]:
    """Layer → the mean SNR of its weight matrices (`analysis.finetune.methods.layer_set.
    layer_snr`: an SVD of each), computed once per model into the disk cache."""
    from analysis.cache import DiskCache
    from analysis.finetune.methods.layer_set import layer_snr
    from analysis.models import encoder_layers

    def compute():
        snr = layer_snr(encoder_layers(loaded.model), loaded.model_family)
        return {}, {"snr": {str(layer): value for layer, value in snr.items()}}

    _, meta, _ = DiskCache().get_or_compute(SNR_KIND, snr_recipe(loaded), compute)
    return {int(layer): float(value) for layer, value in meta["snr"].items()}
