"""Step time and peak memory of cut and selective fine-tuning against full fine-tuning, side by side.

    .venv/bin/python bench/bench_finetune.py [--l-star 3] [--steps 20] [--warmup-steps 3]
        [--batch-size 16] [--max-length 64] [--rounds 1] [--device cuda] [--threads N]

On MiniLM (L = 6) and movie snippets (synthetic texts if the data is unavailable), every strategy
trains on the same batches with the engine's own `build_model` / `train_step`:

- full fine-tuning (1, L, L),
- (1, ℓ*, ℓ*): the classifier on ℓ*, the layers above removed,
- (ℓ*−1, ℓ*, L): two layers train, every layer runs forward,
- head fine-tuning: 3 heads per layer (Q/K/V rows, gradient masks),
- frozen encoder (classifier only), as a floor.

Step time: mean of ``--steps`` timed steps after ``--warmup-steps`` untimed ones (forward, backward,
optimizer). Peak memory: what the strategy adds at its peak on top of what the process held
before it (model copy, optimizer state, activations): CUDA allocator peak, or on the CPU the
sampled RSS (glibc's cache is trimmed between strategies). With ``--rounds`` > 1 the strategies are
run in turn several times and the median is reported (CPU timings on a shared machine are noisy).
The ideal ratio of a run cut at ℓ* is ℓ*/L (its layers run forward and backward).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.config import DataSpec, ModelSpec
from analysis.finetune.config import FinetuneConfig, HeadsOptions
from analysis.finetune.engine import (
    PeakMemory,
    _autocast,
    build_model,
    encode_part,
    make_optimizer,
    release_free_memory,
    train_step,
)
from analysis.models import load_model


def strategies(n_layers: int, n_heads: int, l_star: int) -> list[tuple[str, dict]]:
    top3 = tuple(range(min(3, n_heads)))
    return [
        (f"full (1, {n_layers}, {n_layers})", {"method": "full"}),
        (f"(1, {l_star}, {l_star})", {"method": "layers", "layers": (1, l_star, l_star)}),
        (
            f"({l_star - 1}, {l_star}, {n_layers})",
            {"method": "layers", "layers": (l_star - 1, l_star, n_layers)},
        ),
        (
            f"heads ({len(top3)} per layer)",
            {
                "method": "heads",
                "options": HeadsOptions({layer: top3 for layer in range(1, n_layers + 1)}),
            },
        ),
        ("frozen (classifier only)", {"method": "frozen"}),
    ]


def trim_heap() -> None:
    """Give freed memory back (CPU heap, CUDA cache) so the next strategy's peak starts clean."""
    release_free_memory()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_rows(args):
    try:
        from analysis.data import load_data

        data = load_data(DataSpec(args.data))
        rows = data.parts["train"].sample(
            n=(args.warmup_steps + args.steps) * args.batch_size, random_state=0, replace=True
        )
        return rows.reset_index(drop=True), data.n_classes, args.data
    except Exception as exc:  # the bench still runs without the data helper's module
        print(f"(data unavailable: {exc}; using synthetic texts)")
        import pandas as pd

        rng = np.random.default_rng(0)
        words = [
            "the",
            "a",
            "film",
            "movie",
            "plot",
            "actor",
            "good",
            "bad",
            "great",
            "awful",
            "story",
            "scene",
            "music",
            "ending",
        ]
        n = (args.warmup_steps + args.steps) * args.batch_size
        texts = [" ".join(rng.choice(words, rng.integers(20, 60))) for _ in range(n)]
        return pd.DataFrame({"text": texts, "label": rng.integers(0, 2, n)}), 2, "synthetic"


def measure(loaded, cfg: FinetuneConfig, part, n_outputs, device, args) -> dict:
    trim_heap()
    memory = PeakMemory(device)
    built = build_model(cfg, loaded, n_outputs, device)
    optimizer, scheduler = make_optimizer(built.prepared, cfg)
    autocast, amp_dtype = _autocast(device, cfg.mixed_precision)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    loss_fn = torch.nn.CrossEntropyLoss()
    pad_id = loaded.tokenizer.pad_token_id or 0
    times = []
    for i in range(args.warmup_steps + args.steps):
        rows = list(range(i * args.batch_size, (i + 1) * args.batch_size))
        batch = part.batch(rows, pad_id, device)
        labels = part.labels[rows].to(device)
        t0 = time.perf_counter()
        train_step(
            built.model, batch, labels, loss_fn, optimizer, scheduler, built.prepared, scaler,
            autocast or nullcontext,
        )  # fmt: skip
        if i >= args.warmup_steps:
            times.append(time.perf_counter() - t0)
        memory.sample()
    peak = memory.stop()
    out = {
        "step_s": statistics.mean(times),
        "step_sd": statistics.stdev(times) if len(times) > 1 else 0.0,
        "peak_mb": peak,
        "n_trainable": built.n_trainable,
        "forward": built.model.n_layers_kept,
        "backward": built.layers_backward,
    }
    del built, optimizer, scheduler
    trim_heap()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--l-star", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model(ModelSpec(args.model), device=args.device)
    device = loaded.device
    L, H = loaded.n_layers, loaded.n_heads
    if not 2 <= args.l_star <= L:
        parser.error(f"--l-star must be within 2..{L}")
    rows, n_outputs, data_name = load_rows(args)
    part = encode_part(loaded.tokenizer, rows, args.max_length, regression=False)
    tokens = part.tokens.lengths().mean()
    print(
        f"{args.model} (L={L}, H={H}) on {data_name}, device {device}, threads "
        f"{torch.get_num_threads()}, batch {args.batch_size}, max_length {args.max_length} "
        f"(mean {tokens:.0f} tokens), {args.steps} timed steps after {args.warmup_steps}, "
        f"{args.rounds} round(s), ℓ* = {args.l_star}"
    )
    plan = strategies(L, H, args.l_star)
    results: dict[str, list[dict]] = {name: [] for name, _ in plan}
    for _ in range(args.rounds):
        for name, kwargs in plan:
            cfg = FinetuneConfig(
                model=ModelSpec(args.model),
                steps=args.warmup_steps + args.steps,
                batch_size=args.batch_size,
                max_length=args.max_length,
                warmup=0.0,
                **kwargs,
            )
            results[name].append(measure(loaded, cfg, part, n_outputs, device, args))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    full = plan[0][0]
    header = (
        f"{'strategy':<26}{'n_trainable':>12}{'fwd':>5}{'bwd':>5}{'step ms':>10}{'± sd':>8}"
        f"{'vs full':>9}{'peak MiB':>10}{'vs full':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, _ in plan:
        r = results[name][0]
        step, peak = median(name, "step_s"), median(name, "peak_mb")
        print(
            f"{name:<26}{r['n_trainable']:>12,}{r['forward']:>5}{r['backward']:>5}"
            f"{1000 * step:>10.1f}{1000 * median(name, 'step_sd'):>8.1f}"
            f"{step / median(full, 'step_s'):>9.2f}{peak:>10.1f}"
            f"{peak / max(median(full, 'peak_mb'), 1e-9):>9.2f}"
        )
    print(f"ideal ratio of a run cut at ℓ* = {args.l_star}: ℓ*/L = {args.l_star / L:.2f}")


if __name__ == "__main__":
    main()
