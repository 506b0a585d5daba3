"""Extraction speed: tunescope's one-pass extractor vs a naive per-layer loop vs a bare forward.

    .venv/bin/python bench/bench_extract.py [--n 2000] [--naive-n 2000]

Measured side by side in one run on 2,000 movie snippets with MiniLM:
- naive: the first paper's reference style — every batch padded to 128 tokens, batch size 8, the
  model re-run once per layer (L+1 forwards) to take that layer's pooled state;
- ours: `forward_all_layers` — length-sorted dynamic padding, batch 32, one forward, every layer
  pooled from `hidden_states`;
- bare: the same batches through the bare model forward (no hidden states kept, no pooling).
Bare and ours run interleaved for a few rounds (medians reported), so both see the same load.
Goals (issue #2): ours ≥ 10× faster than naive; ours within 10% of bare. Also: a second identical
request served from the disk cache (content hash checked) in well under a second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.cache import DiskCache
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
from analysis.data import load_data, sample
from analysis.extract import (
    extract_states,
    forward_all_layers,
    iter_encoded_batches,
    model_inputs,
    pool,
)
from analysis.models import load_model


def naive(loaded, texts, batch_size=8, width=128):
    """Pad to `width`, and run the model once per layer (what the reference code does)."""
    tok = loaded.tokenizer
    out = torch.empty((loaded.n_layers + 1, len(texts), loaded.d_model))
    with torch.inference_mode():
        for layer in range(loaded.n_layers + 1):
            for start in range(0, len(texts), batch_size):
                enc = tok(
                    texts[start : start + batch_size], padding="max_length", truncation=True,
                    max_length=width, return_tensors="pt", return_special_tokens_mask=True,
                )  # fmt: skip
                special = enc.pop("special_tokens_mask").bool()
                hidden = loaded.model(**enc, output_hidden_states=True).hidden_states[layer]
                real = enc["attention_mask"].bool() & ~special
                out[layer, start : start + batch_size] = pool(
                    hidden, real, enc["attention_mask"], "mean"
                )
    return out


def bare(loaded, texts, max_length=128, batch_size=32):
    with torch.inference_mode():
        for batch in iter_encoded_batches(loaded.tokenizer, texts, None, max_length, batch_size):
            loaded.model(**model_inputs(loaded.model, batch.inputs))


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument(
        "--naive-n",
        type=int,
        default=500,
        help="examples for the naive loop (its time is scaled to --n)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of bare vs ours")
    args = parser.parse_args()
    torch.manual_seed(0)
    loaded = load_model(ModelSpec("minilm"), device="cpu")
    data = load_data(DataSpec("movie-snippets"))
    texts = sample(data, SampleSpec(n=args.n, seed=0))["text"].tolist()
    print(f"MiniLM ({loaded.n_layers} layers, d_model {loaded.d_model}), {args.n} movie snippets, "
          f"{torch.get_num_threads()} threads")  # fmt: skip

    bare(loaded, texts[:64])  # warm-up
    bare_times, our_times = [], []
    for _ in range(args.rounds):  # interleaved, so both see the same machine load
        bare_times.append(timed(bare, loaded, texts)[0])
        t, ours = timed(forward_all_layers, loaded, texts, None, "mean", 128, 32)
        our_times.append(t)
    t_bare, t_ours = statistics.median(bare_times), statistics.median(our_times)
    t_naive, slow = timed(naive, loaded, texts[: args.naive_n])
    t_naive_full = t_naive * args.n / args.naive_n
    agree = torch.allclose(slow, ours[:, : args.naive_n], atol=1e-4, rtol=1e-3)

    with tempfile.TemporaryDirectory() as tmp:
        cache = DiskCache(tmp)
        cfg = ExtractConfig(ModelSpec("minilm"), DataSpec("movie-snippets"), SampleSpec(n=args.n))
        t_fill, _ = timed(extract_states, cfg, cache=cache, loaded=loaded)
        t_hit, hit = timed(extract_states, cfg, cache=cache, loaded=loaded)
        assert hit.meta["cache_hit"]

    scaled = "" if args.naive_n == args.n else f" (measured on {args.naive_n}, scaled)"
    print(f"naive per-layer loop, pad 128, batch 8 : {t_naive_full:8.2f} s{scaled}")
    print(
        f"bare forward, same batches as ours      : {t_bare:8.2f} s  (median of {[round(t, 2) for t in bare_times]})"
    )
    print(
        f"ours, one pass, every layer pooled      : {t_ours:8.2f} s  (median of {[round(t, 2) for t in our_times]})"
    )
    print(
        f"speed-up vs naive                       : {t_naive_full / t_ours:8.1f} x  (goal >= 10x)"
    )
    print(
        f"overhead vs bare forward                : {100 * (t_ours / t_bare - 1):+8.1f} %  (goal <= 10%)"
    )
    print(f"same states as the naive loop           : {agree}")
    print(f"extract_states, cache miss (incl. data) : {t_fill:8.2f} s")
    print(f"extract_states, served from cache       : {t_hit:8.3f} s  (goal well under 1 s)")


if __name__ == "__main__":
    main()
