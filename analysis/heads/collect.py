"""Capture every head's output from a model and reduce it to head statistics
(docs/explanation/heads.md, "Head outputs").

The head outputs O_h(x) are the input of each layer's attention output projection
(``layer_modules(layer, family)['attn_out']``): (B, S, H·d_head), head h in columns
h·d_head:(h+1)·d_head. A forward pre-hook on that projection hands each batch, reshaped to
(B, S, H, d_head), straight to a ``HeadStatsAccumulator``, so no head output outlives its batch.

The statistics (richness and correlation) are disk-cached, keyed by the model's weights
fingerprint, the data, the sample, ξ and the max length. PageRank and the selection are cheap
functions of them (``analysis.heads.analyse_heads``): changing k, d or the selector never
recomputes head outputs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from analysis.cache import DiskCache
from analysis.config import ExtractConfig, to_dict
from analysis.extract import iter_encoded_batches, model_inputs, texts_of, tokens_of
from analysis.heads.stats import HeadStats, HeadStatsAccumulator, check_xi
from analysis.models import LoadedModel, encoder_layers, layer_modules, load_model
from analysis.progress import Progress, no_progress
from analysis.rates import announce, estimate, forward_work, work_meta

# Part of every cache key: bump when a change alters the cached numbers.
HEADS_CODE_VERSION = "heads-1"


@dataclass(frozen=True)
class HeadStatsConfig:
    """Which head statistics: the sample and model of ``extract`` (its pooling is not used), ξ.

    The forward pass runs in float32: ``extract.precision`` must be float32 (it is not part of
    the recipe, so another precision would be silently ignored).
    """

    extract: ExtractConfig
    xi: float = 0.9

    def __post_init__(self) -> None:
        check_xi(self.xi)
        if self.extract.precision != "float32":
            raise ValueError(
                f"Head statistics are computed in float32 only (got precision "
                f"{self.extract.precision!r})."
            )


def collect_head_stats(
    loaded: LoadedModel,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None = None,
    xi: float = 0.9,
    max_length: int = 128,
    batch_size: int = 32,
    progress: Progress | None = None,
) -> HeadStats:
    """Head statistics of every layer over ``texts`` (one forward pass, streamed by batch).

    Padding is excluded through the attention mask (special tokens such as [CLS] are real
    tokens of the sequence and stay in). Runs under ``inference_mode`` on the model's device.
    """
    if len(texts) == 0:
        raise ValueError("No examples to measure the heads on.")
    progress = progress or no_progress
    accumulator = HeadStatsAccumulator(loaded.n_layers, loaded.n_heads, loaded.d_head, xi)
    current: dict[str, torch.Tensor] = {}

    def capture(layer: int):
        def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            context = args[0]  # (B, S, H·d_head)
            batch, seq_len = context.shape[:2]
            heads = context.view(batch, seq_len, loaded.n_heads, loaded.d_head)  # (B, S, H, dh)
            accumulator.update(layer, heads, current["mask"])

        return hook

    layers = encoder_layers(loaded.model)
    handles = [
        layer_modules(block, loaded.model_family)["attn_out"].register_forward_pre_hook(
            capture(i + 1)
        )
        for i, block in enumerate(layers)
    ]
    n, done = len(texts), 0
    progress(0.0, f"0 / {n} examples")
    try:
        with torch.inference_mode():
            for batch in iter_encoded_batches(
                loaded.tokenizer, texts, text_pairs, max_length, batch_size, loaded.device
            ):
                current["mask"] = batch.inputs["attention_mask"]
                loaded.model(**model_inputs(loaded.model, batch.inputs))
                done += len(batch.indices)
                progress(done / n, f"{done} / {n} examples")
    finally:
        for handle in handles:
            handle.remove()
    return accumulator.result()


def head_stats_recipe(cfg: HeadStatsConfig, loaded: LoadedModel, data_fingerprint: str) -> dict:
    """Everything that decides the statistics (not the batch size: padding is masked out)."""
    return {
        "model": loaded.identity(),
        "data": {**to_dict(cfg.extract.data), "fingerprint": data_fingerprint},
        "sample": to_dict(cfg.extract.sample),
        "max_length": cfg.extract.max_length,
        "xi": cfg.xi,
        "code": HEADS_CODE_VERSION,
    }


def head_stats(
    cfg: HeadStatsConfig,
    progress: Progress | None = None,
    cache: DiskCache | None = None,
    loaded: LoadedModel | None = None,
) -> tuple[HeadStats, dict[str, Any]]:
    """Head statistics for the configured sample, from the disk cache when present.

    Returns (stats, meta) with meta holding ``cache_hit``, ``seconds`` (of the computation),
    ``device`` and the model's ``d_model`` / ``d_head`` / ``n_params``.
    """
    from analysis.data import load_data, sample

    data = load_data(cfg.extract.data)
    rows = sample(data, cfg.extract.sample)
    loaded = loaded or load_model(cfg.extract.model)
    cache = cache or DiskCache()
    recipe = head_stats_recipe(cfg, loaded, data.fingerprint)

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        device = str(loaded.device)
        work = forward_work(tokens_of(loaded, rows, cfg.extract.max_length), loaded.n_params)
        told = announce(progress or no_progress, estimate("heads", work, cache.root, device),
                        f"the head statistics of {len(rows):,} examples")  # fmt: skip
        stats = collect_head_stats(
            loaded,
            *texts_of(rows),
            xi=cfg.xi,
            max_length=cfg.extract.max_length,
            batch_size=cfg.extract.batch_size,
            progress=told,
        )
        seconds = time.perf_counter() - start
        return stats.to_tensors(), {"n": stats.n, **work_meta("heads", work, seconds, device)}

    tensors, meta, hit = cache.get_or_compute("heads", recipe, compute)
    if hit and progress:
        progress(1.0, "served from the cache")
    stats = HeadStats.from_tensors(tensors, n=meta["n"], xi=cfg.xi)
    return stats, {
        **meta,
        "cache_hit": hit,
        "model": loaded.name,
        "family": loaded.model_family,
        "d_model": loaded.d_model,
        "d_head": loaded.d_head,
        "n_params": loaded.n_params,
    }
