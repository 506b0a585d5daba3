"""The extraction engine every page uses: one forward pass gives the pooled state of every layer.

For a sample of N examples, `extract_states` returns ``states`` of shape (L+1, N, d_model):
layer 0 is the embedding output, layers 1..L the outputs of the transformer blocks
(``hidden_states[ℓ]`` in transformers). Pooling (SPEC "Sequence representation"):

- ``mean``: mean of the token states over tokens that are neither padding nor special tokens
  (the tokenizer's special-tokens mask, not hard-coded ids). A text whose every token is special
  (an empty string) falls back to the mean over its non-padding tokens.
- ``first``: the state of the first token (CLS / ``<s>``).

Batches are sorted by length so each is padded only to its own longest text (dynamic padding),
run under ``torch.inference_mode()`` on the model's device (the GPU when there is one). Results are
cached on disk (analysis.cache), keyed by the model's weights fingerprint, the data's fingerprint,
the sample, the pooling and the max length.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from analysis.cache import DiskCache
from analysis.config import ExtractConfig, to_dict
from analysis.models import LoadedModel, load_model
from analysis.progress import Progress, no_progress


@dataclass
class LayerStates:
    """Pooled states of every layer for one sample, and what they are."""

    states: torch.Tensor  # (L+1, N, d_model) float32, CPU
    labels: torch.Tensor  # (N,) int64 for classes, float32 for regression
    rows: torch.Tensor  # (N,) row index of each example in its data part
    label_names: tuple[str, ...]
    task_type: str
    metric: str
    config: ExtractConfig
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return self.states.shape[0] - 1

    @property
    def n(self) -> int:
        return self.states.shape[1]

    @property
    def d_model(self) -> int:
        return self.states.shape[2]


@dataclass
class EncodedBatch:
    indices: torch.Tensor  # (B,) positions of these examples in the input order
    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask[, token_type_ids], each (B, S)
    real_mask: torch.Tensor  # (B, S) bool: not padding and not a special token


def encode_all(
    tokenizer, texts: Sequence[str], text_pairs: Sequence[str] | None, max_length: int
) -> dict[str, list[list[int]]]:
    """Tokenize every example once, truncated, unpadded (fast tokenizers do this in Rust)."""
    args = (list(texts), list(text_pairs)) if text_pairs is not None else (list(texts),)
    return tokenizer(
        *args,
        truncation=True,
        max_length=max_length,
        padding=False,
        return_special_tokens_mask=True,
        return_attention_mask=True,
    )


def iter_encoded_batches(
    tokenizer,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    max_length: int,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> Iterator[EncodedBatch]:
    """Batches of examples sorted by length (longest first), each padded to its own longest."""
    enc = encode_all(tokenizer, texts, text_pairs, max_length)
    lengths = np.array([len(ids) for ids in enc["input_ids"]])
    order = np.argsort(-lengths, kind="stable")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    has_types = "token_type_ids" in enc
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = int(lengths[chunk].max())
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        special = torch.ones((len(chunk), width), dtype=torch.bool)
        types = torch.zeros((len(chunk), width), dtype=torch.long) if has_types else None
        for row, i in enumerate(chunk):
            n = lengths[i]
            ids[row, :n] = torch.tensor(enc["input_ids"][i])
            attention[row, :n] = 1
            special[row, :n] = torch.tensor(enc["special_tokens_mask"][i], dtype=torch.bool)
            if types is not None:
                types[row, :n] = torch.tensor(enc["token_type_ids"][i])
        inputs = {"input_ids": ids, "attention_mask": attention}
        if types is not None:
            inputs["token_type_ids"] = types
        yield EncodedBatch(
            indices=torch.as_tensor(chunk, dtype=torch.long),
            inputs={k: v.to(device) for k, v in inputs.items()},
            real_mask=(attention.bool() & ~special).to(device),
        )


def model_inputs(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Drop inputs the model's forward does not take (DistilBERT has no token_type_ids)."""
    accepted = _forward_params(type(model))
    return {k: v for k, v in inputs.items() if k in accepted}


_FORWARD_PARAMS: dict[type, frozenset[str]] = {}


def _forward_params(cls: type) -> frozenset[str]:
    if cls not in _FORWARD_PARAMS:
        _FORWARD_PARAMS[cls] = frozenset(inspect.signature(cls.forward).parameters)
    return _FORWARD_PARAMS[cls]


def pool(
    hidden: torch.Tensor, real_mask: torch.Tensor, attention_mask: torch.Tensor, pooling: str
) -> torch.Tensor:
    """(B, S, d) token states → (B, d) sequence representations (see module docstring)."""
    if pooling == "first":
        return hidden[:, 0]
    weights = real_mask.to(hidden.dtype)
    empty = weights.sum(dim=1) == 0  # only special tokens: fall back to all non-padding tokens
    if empty.any():
        weights = torch.where(empty[:, None], attention_mask.to(hidden.dtype), weights)
    weights = weights / weights.sum(dim=1, keepdim=True)
    return torch.einsum("bsd,bs->bd", hidden, weights)


def forward_all_layers(
    loaded: LoadedModel,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    pooling: str,
    max_length: int,
    batch_size: int,
    progress: Progress | None = None,
) -> torch.Tensor:
    """Pooled states of every layer, (L+1, N, d_model) float32 on the CPU, in input order."""
    progress = progress or no_progress
    n = len(texts)
    out = torch.empty((loaded.n_layers + 1, n, loaded.d_model), dtype=torch.float32)
    done = 0
    progress(0.0, f"0 / {n} examples")
    with torch.inference_mode():
        for batch in iter_encoded_batches(
            loaded.tokenizer, texts, text_pairs, max_length, batch_size, loaded.device
        ):
            output = loaded.model(
                **model_inputs(loaded.model, batch.inputs), output_hidden_states=True
            )
            mask = batch.inputs["attention_mask"]
            pooled = torch.stack(
                [pool(h, batch.real_mask, mask, pooling) for h in output.hidden_states]
            )  # (L+1, B, d)
            out[:, batch.indices] = pooled.float().cpu()
            done += len(batch.indices)
            progress(done / n, f"{done} / {n} examples")
    return out


def extraction_recipe(cfg: ExtractConfig, loaded: LoadedModel, data_fingerprint: str) -> dict:
    """Everything that decides the numbers (batch size does not: padding is masked out)."""
    return {
        "model": loaded.identity(),
        "data": {**to_dict(cfg.data), "fingerprint": data_fingerprint},
        "sample": to_dict(cfg.sample),
        "pooling": cfg.pooling,
        "max_length": cfg.max_length,
    }


def extract_states(
    cfg: ExtractConfig,
    progress: Progress | None = None,
    cache: DiskCache | None = None,
    loaded: LoadedModel | None = None,
) -> LayerStates:
    """Pooled states of every layer for the configured sample, from the disk cache when present."""
    from analysis.data import load_data, sample

    data = load_data(cfg.data)
    rows = sample(data, cfg.sample)
    loaded = loaded or load_model(cfg.model)
    cache = cache or DiskCache()
    recipe = extraction_recipe(cfg, loaded, data.fingerprint)
    labels = _labels_tensor(rows, data.task_type)

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        pairs = rows["text_pair"].tolist() if "text_pair" in rows else None
        states = forward_all_layers(
            loaded,
            rows["text"].tolist(),
            pairs,
            cfg.pooling,
            cfg.max_length,
            cfg.batch_size,
            progress,
        )
        tensors = {
            "states": states,
            "labels": labels,
            "rows": torch.tensor(rows["row"].to_numpy(), dtype=torch.long),
        }
        return tensors, {"seconds": time.perf_counter() - start, "device": str(loaded.device)}

    tensors, meta, hit = cache.get_or_compute("states", recipe, compute)
    if hit and progress:
        progress(1.0, "served from the cache")
    return LayerStates(
        states=tensors["states"],
        labels=tensors["labels"],
        rows=tensors["rows"],
        label_names=tuple(data.label_names),
        task_type=data.task_type,
        metric=data.metric,
        config=cfg,
        meta={
            **meta,
            "cache_hit": hit,
            "cache_path": str(cache.entry_dir("states", recipe)),
            "model_family": loaded.family,
            "n_heads": loaded.n_heads,
        },
    )


def _labels_tensor(rows: pd.DataFrame, task_type: str) -> torch.Tensor:
    if task_type == "regression":
        return torch.tensor(rows["label"].to_numpy(dtype=np.float32))
    return torch.tensor(rows["label"].to_numpy(dtype=np.int64))


def token_lengths(tokenizer, rows: pd.DataFrame) -> np.ndarray:
    """Untruncated token count of each example (text, or text pair), specials included. (N,) int."""
    texts = rows["text"].tolist()
    pairs = rows["text_pair"].tolist() if "text_pair" in rows else None
    args = (texts, pairs) if pairs is not None else (texts,)
    enc = tokenizer(*args, truncation=False, padding=False, verbose=False)
    return np.array([len(ids) for ids in enc["input_ids"]])
