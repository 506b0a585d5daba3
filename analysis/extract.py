"""The extraction engine every page uses: one forward pass gives the pooled state of every layer.

For a sample of N examples, `extract_states` returns ``states`` of shape (L+1, N, d_model):
layer 0 is the embedding output, layers 1..L the outputs of the transformer blocks
(``hidden_states[ℓ]`` in transformers). Pooling (docs/explanation/layer-metrics.md, "Pooling"):

- ``mean``: mean of the token states over tokens that are neither padding nor special tokens
  (the tokenizer's special-tokens mask, not hard-coded ids). A text whose every token is special
  (an empty string) falls back to the mean over its non-padding tokens.
- ``first``: the state of the first token (CLS / ``<s>``).

The examples go through the model in windows of consecutive examples (about 256 MB of pooled
states each: 24,966 examples for MiniLM, 2,621 for BERT-large); within a window, batches are sorted
by length so each is padded only to its own longest text (dynamic padding), run under
``torch.inference_mode()`` on the model's device (the GPU when there is one). Each finished window
is written to the disk cache layer by layer (analysis.cache streams entries), so memory does not
grow with N, and the states come back memory-mapped: ``states[layer]`` reads one layer's pages
only. Entries are keyed by the model's weights fingerprint, the data's fingerprint, the sample, the
pooling, the max length and (when not float32) the precision.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from analysis.cache import DiskCache, EntryWriter, StoredTensor, TensorSpec
from analysis.config import ExtractConfig, to_dict
from analysis.models import LoadedModel, load_model
from analysis.progress import Progress, no_progress
from analysis.rates import announce, estimate, forward_work, work_meta

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class LayerStates:
    """Pooled states of every layer for one sample, and what they are."""

    states: torch.Tensor  # (L+1, N, d_model) float32, CPU; memory-mapped when from the cache
    labels: torch.Tensor  # (N,) int64 for classes, float32 for regression
    rows: torch.Tensor  # (N,) row index of each example in its data part
    label_names: tuple[str, ...]
    task_type: str
    metric: str
    config: ExtractConfig
    meta: dict[str, Any] = field(default_factory=dict)
    # Where the states lie on disk (chunked reads that do not grow the resident set, e.g. the
    # streamed layer metrics); None for states held only in memory.
    stored: StoredTensor | None = None

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
class Tokenized:
    """Examples tokenized once: truncated, unpadded, as a fast tokenizer returns them.

    input_ids / special: one list of token ids / special-token flags per example; token_types:
    the same for segment ids, or None when the tokenizer makes none.
    """

    input_ids: list[list[int]]
    special: list[list[int]]
    token_types: list[list[int]] | None

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> np.ndarray:
        """Tokens per example, (N,) int."""
        return np.array([len(ids) for ids in self.input_ids])

    def pad(self, rows: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
        """Examples ``rows`` padded to their own longest (dynamic padding): ``input_ids``,
        ``attention_mask``, ``special_tokens_mask`` (bool; padding counts as special) and, when
        the tokenizer makes them, ``token_type_ids``; each (B, S), on the CPU."""
        width = max(len(self.input_ids[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        special = torch.ones((len(rows), width), dtype=torch.bool)
        types = torch.zeros((len(rows), width), dtype=torch.long) if self.token_types else None
        for r, i in enumerate(rows):
            n = len(self.input_ids[i])
            ids[r, :n] = torch.tensor(self.input_ids[i])
            attention[r, :n] = 1
            special[r, :n] = torch.tensor(self.special[i], dtype=torch.bool)
            if types is not None:
                types[r, :n] = torch.tensor(self.token_types[i])
        out = {"input_ids": ids, "attention_mask": attention, "special_tokens_mask": special}
        if types is not None:
            out["token_type_ids"] = types
        return out


def tokenize(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    max_length: int,
) -> Tokenized:
    """Tokenize every example once, truncated, unpadded (fast tokenizers do this in Rust)."""
    args = (list(texts), list(text_pairs)) if text_pairs is not None else (list(texts),)
    enc = tokenizer(
        *args,
        truncation=True,
        max_length=max_length,
        padding=False,
        return_special_tokens_mask=True,
        return_attention_mask=True,
    )
    return Tokenized(enc["input_ids"], enc["special_tokens_mask"], enc.get("token_type_ids"))


def texts_of(rows: pd.DataFrame) -> tuple[list[str], list[str] | None]:
    """(texts, second texts or None) of a sample or data part, as strings."""
    pairs = rows["text_pair"].astype(str).tolist() if "text_pair" in rows else None
    return rows["text"].astype(str).tolist(), pairs


def pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


@dataclass
class EncodedBatch:
    indices: torch.Tensor  # (B,) positions of these examples in the input order
    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask[, token_type_ids], each (B, S)
    real_mask: torch.Tensor  # (B, S) bool: not padding and not a special token


def iter_encoded_batches(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    max_length: int,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> Iterator[EncodedBatch]:
    """Batches of examples sorted by length (longest first), each padded to its own longest."""
    tokens = tokenize(tokenizer, texts, text_pairs, max_length)
    order = np.argsort(-tokens.lengths(), kind="stable")
    pad_id = pad_id_of(tokenizer)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        padded = tokens.pad(chunk.tolist(), pad_id)
        special = padded.pop("special_tokens_mask")
        yield EncodedBatch(
            indices=torch.as_tensor(chunk, dtype=torch.long),
            inputs={k: v.to(device) for k, v in padded.items()},
            real_mask=(padded["attention_mask"].bool() & ~special).to(device),
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


# Rows per window: the pooled states of one window, (L+1, M, d) float32, take about this much.
WINDOW_BYTES = 256 << 20


def window_rows(n_states: int, d_model: int, budget: int | None = None) -> int:
    """Examples per window so that a window's pooled states, (n_states, M, d_model) float32, take
    about ``budget`` bytes (default `WINDOW_BYTES`): 24,966 for MiniLM, 2,621 for BERT-large."""
    budget = WINDOW_BYTES if budget is None else budget
    return max(1, budget // (4 * n_states * d_model))


def autocast_context(device: torch.device, precision: str):
    """A context for the forward pass: nothing for float32, else autocast to bf16 / fp16."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, precision))


def iter_pooled_windows(
    loaded: LoadedModel,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    pooling: str,
    max_length: int,
    batch_size: int,
    progress: Progress | None = None,
    rows: int | None = None,
    precision: str = "float32",
) -> Iterator[tuple[int, torch.Tensor]]:
    """Pooled states of every layer, one window of consecutive examples at a time.

    Yields (start, states) with states (L+1, M, d_model) float32 on the CPU for examples
    start..start+M−1 in input order. Within a window, examples are tokenized, sorted by length and
    batched (dynamic padding), and the window's states are gathered on the model's device and
    moved to the CPU once. Memory: one window (``rows`` examples, default `window_rows`), whatever
    N is. With ``precision`` bfloat16 / float16 the forward pass runs under autocast; pooling is
    float32 either way.
    """
    progress = progress or no_progress
    n, n_states, d = len(texts), loaded.n_layers + 1, loaded.d_model
    rows = rows or window_rows(n_states, d)
    done = 0
    progress(0.0, f"0 / {n} examples")
    with torch.inference_mode():
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            pairs = text_pairs[start:stop] if text_pairs is not None else None
            window = torch.empty((n_states, stop - start, d), device=loaded.device)
            for batch in iter_encoded_batches(
                loaded.tokenizer, texts[start:stop], pairs, max_length, batch_size, loaded.device
            ):
                with autocast_context(loaded.device, precision):
                    output = loaded.model(
                        **model_inputs(loaded.model, batch.inputs), output_hidden_states=True
                    )
                mask = batch.inputs["attention_mask"]
                where = batch.indices.to(loaded.device)
                for layer, hidden in enumerate(output.hidden_states):  # (B, S, d) each
                    pooled = pool(hidden.float(), batch.real_mask, mask, pooling)  # (B, d)
                    window[layer].index_copy_(0, where, pooled)
                done += len(batch.indices)
                progress(done / n, f"{done} / {n} examples")
            window = window.cpu()
            yield start, window
            del window  # (with the caller's `del`) one window in memory, not two


def forward_all_layers(
    loaded: LoadedModel,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    pooling: str,
    max_length: int,
    batch_size: int,
    progress: Progress | None = None,
    precision: str = "float32",
) -> torch.Tensor:
    """Pooled states of every layer, (L+1, N, d_model) float32 on the CPU, in input order, in
    memory (`extract_states` streams them to the cache instead)."""
    out = torch.empty((loaded.n_layers + 1, len(texts), loaded.d_model), dtype=torch.float32)
    for start, window in iter_pooled_windows(
        loaded, texts, text_pairs, pooling, max_length, batch_size, progress, precision=precision
    ):
        out[:, start : start + window.shape[1]] = window
    return out


def extraction_inputs(cfg: ExtractConfig, loaded: LoadedModel, data_fingerprint: str) -> dict:
    """The cache key's inputs: everything that decides the numbers (batch size does not: padding is masked out). The
    precision appears only when it is not float32, so float32 keys are those of earlier versions."""
    inputs = {
        "model": loaded.identity(),
        "data": {**to_dict(cfg.data), "fingerprint": data_fingerprint},
        "sample": to_dict(cfg.sample),
        "pooling": cfg.pooling,
        "max_length": cfg.max_length,
    }
    if cfg.precision != "float32":
        inputs["precision"] = cfg.precision
    return inputs


def states_specs(n_layers: int, n: int, d_model: int, regression: bool) -> dict[str, TensorSpec]:
    """The tensors of a states entry: states (L+1, N, d) float32, one segment per layer; labels
    (N,) int64 (float32 for regression); rows (N,) int64."""
    return {
        "states": TensorSpec("F32", (n_layers + 1, n, d_model), row_dim=1),
        "labels": TensorSpec("F32" if regression else "I64", (n,)),
        "rows": TensorSpec("I64", (n,)),
    }


def write_states(
    writer: EntryWriter,
    windows: Iterable[tuple[int, torch.Tensor]],
    labels: torch.Tensor,
    rows: torch.Tensor,
) -> None:
    """Stream windows of pooled states, (start, (L+1, M, d) float32), into a states entry, layer
    by layer; then the labels and row indices. Any source of windows will do (the extractor, or a
    synthetic source in the scale benchmark)."""
    for start, window in windows:
        for layer in range(window.shape[0]):
            writer.write("states", window[layer], start, index=layer)
        del window  # before the source builds the next one
    writer.write("labels", labels)
    writer.write("rows", rows)


def states_cached(cfg: ExtractConfig, loaded: LoadedModel, cache: DiskCache | None = None) -> bool:
    """Whether the disk cache already holds the states of ``cfg`` (nothing is computed or
    checked: entries are published whole, and `extract_states` checks the content on its load)."""
    from analysis.data import load_data

    inputs = extraction_inputs(cfg, loaded, load_data(cfg.data).fingerprint)
    return (cache or DiskCache()).entry_dir("states", inputs).is_dir()


def extract_states(
    cfg: ExtractConfig,
    progress: Progress | None = None,
    cache: DiskCache | None = None,
    loaded: LoadedModel | None = None,
) -> LayerStates:
    """Pooled states of every layer for the configured sample, from the disk cache when present.

    A miss streams the states into a new cache entry window by window (`iter_pooled_windows`,
    `write_states`), so memory does not grow with N; either way the states come back
    memory-mapped (`LayerStates.states`) and locatable on disk (`LayerStates.stored`).
    """
    from analysis.data import load_data, sample

    data = load_data(cfg.data)
    rows = sample(data, cfg.sample)
    loaded = loaded or load_model(cfg.model)
    cache = cache or DiskCache()
    inputs = extraction_inputs(cfg, loaded, data.fingerprint)
    labels = _labels_tensor(rows, data.task_type)
    specs = states_specs(loaded.n_layers, len(rows), loaded.d_model, data.task_type == "regression")

    def write(writer: EntryWriter) -> dict[str, Any]:
        start = time.perf_counter()
        texts, pairs = texts_of(rows)
        work = forward_work(tokens_of(loaded, rows, cfg.max_length), loaded.n_params)
        told = announce(
            progress or no_progress,
            estimate("states", work, cache.root, str(loaded.device),
                     lambda: _timed_piece(cfg, loaded, rows)),
            f"extracting {len(rows):,} examples",
        )  # fmt: skip
        windows = iter_pooled_windows(
            loaded, texts, pairs, cfg.pooling, cfg.max_length, cfg.batch_size, told,
            precision=cfg.precision,
        )  # fmt: skip
        row_ids = torch.tensor(rows["row"].to_numpy(), dtype=torch.long)
        write_states(writer, windows, labels, row_ids)
        return work_meta("states", work, time.perf_counter() - start, str(loaded.device))

    tensors, meta, hit = cache.get_or_write("states", inputs, specs, write)
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
            "cache_path": str(cache.entry_dir("states", inputs)),
            "model_family": loaded.model_family,
            "n_heads": loaded.n_heads,
        },
        stored=cache.stored("states", inputs)["states"],
    )


def tokens_of(loaded: LoadedModel, rows: pd.DataFrame, max_length: int) -> int:
    """Tokens the model reads for ``rows``: each example's count, cut at ``max_length``."""
    return int(np.minimum(token_lengths(loaded.tokenizer, rows), max_length).sum())


def _timed_piece(
    cfg: ExtractConfig, loaded: LoadedModel, rows: pd.DataFrame
) -> tuple[float, float]:
    """(seconds, work) of one small batch of ``rows`` through the model: what an extraction's
    estimate is timed on when this machine has extracted nothing yet (`analysis.rates`). The
    batch runs twice and the second pass is timed: the first carries one-time costs (thread
    pools, allocations) that the extraction pays once, not per batch. Its examples are those of
    about the median length, so that it is padded as little as the extraction's batches (sorted
    by length) are."""
    k = min(len(rows), cfg.batch_size, 16)
    by_length = np.argsort(token_lengths(loaded.tokenizer, rows), kind="stable")
    middle = max(0, len(rows) // 2 - k // 2)
    piece = rows.iloc[by_length[middle : middle + k]]
    texts, pairs = texts_of(piece)
    for _timed_pass in range(2):
        start = time.perf_counter()
        for _ in iter_pooled_windows(loaded, texts, pairs, cfg.pooling, cfg.max_length,
                                     cfg.batch_size, None, precision=cfg.precision):  # fmt: skip
            pass
        seconds = time.perf_counter() - start
    return seconds, forward_work(tokens_of(loaded, piece, cfg.max_length), loaded.n_params)


def _labels_tensor(rows: pd.DataFrame, task_type: str) -> torch.Tensor:
    if task_type == "regression":
        return torch.tensor(rows["label"].to_numpy(dtype=np.float32))
    return torch.tensor(rows["label"].to_numpy(dtype=np.int64))


def token_lengths(tokenizer: PreTrainedTokenizerBase, rows: pd.DataFrame) -> np.ndarray:
    """Untruncated token count of each example (text, or text pair), specials included. (N,) int."""
    texts, pairs = texts_of(rows)
    args = (texts, pairs) if pairs is not None else (texts,)
    enc = tokenizer(*args, truncation=False, padding=False, verbose=False)
    return np.array([len(ids) for ids in enc["input_ids"]])
