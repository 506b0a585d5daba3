"""Step time and peak memory of cut and selective fine-tuning against full fine-tuning, side by
side; and of our training loop against the Hugging Face ``Trainer`` on the same work.

    .venv/bin/python bench/bench_finetune.py [--l-star 3] [--steps 20] [--warmup-steps 3]
        [--batch-size 16] [--max-length 64] [--rounds 1] [--device cuda] [--threads N]
        [--no-trainer] [--trainer-only]

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

**Against the Trainer** (what a user would otherwise pick), for full fine-tuning and for
(1, ℓ*, ℓ*) on a truncated copy, the same work on both sides:
- the same model object (`build_model`: the copy cut at the classifier's layer, the same
  trainable parameters, the same fresh classifier, the same seed), wrapped for the Trainer in a
  module that returns the cross-entropy loss;
- the same batches in the same order (the Trainer's sampler is sequential over the examples laid
  out batch by batch), each padded to its own longest (``DataCollatorWithPadding``);
- the same optimiser — torch's fused AdamW, which the engine uses and which is the Trainer's default
  (``optim="adamw_torch_fused"``) in transformers ≥ 5 with torch ≥ 2.8 — learning rate, weight
  decay, linear warm-up and decay, gradient clipping at 1.0, precision (float32 on the CPU; bf16
  autocast on CUDA for both);
- nothing else in the Trainer: no evaluation, logging, saving, progress bar or reporting; no
  dataloader workers (ours has none either), no pinned memory on the CPU.
Step time: the mean over the timed steps of forward + backward + clipping + optimiser + schedule
(a callback stamps the Trainer's ``on_step_begin`` / ``on_step_end``; ours times `train_step`),
batch building excluded on both sides; "loop" is the wall time of all steps with the batches and
the Trainer's own set-up. Peak memory as above. Rounds alternate ours / Trainer. One more row
runs the Trainer with the unfused ``optim="adamw_torch"`` (the loop over tensors the engine used
before it switched to the fused kernel).
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
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.engine import (
    PeakMemory,
    _autocast,
    build_model,
    encode_part,
    make_optimizer,
    release_free_memory,
    train_step,
)
from analysis.finetune.methods.heads import HeadsOptions
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
    start = time.perf_counter()  # the loop's wall time: set-up and steps, as the Trainer's
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
    loop_s = time.perf_counter() - start
    peak = memory.stop()
    out = {
        "loop_s": loop_s,
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


class LossModule(torch.nn.Module):
    """Our classifier, returning {"loss", "logits"} as the Trainer expects of a model."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, labels: torch.Tensor, num_items_in_batch: object = None, **batch: torch.Tensor
    ) -> dict[str, torch.Tensor]:  # (the Trainer passes num_items_in_batch to a **kwargs model)
        logits = self.model(**batch).float()  # (B, C)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def ours(loaded, cfg: FinetuneConfig, part, n_outputs, device, args) -> dict:
    """Our loop on the bench's batches: `measure`, whose ``loop_s`` times what the Trainer's
    does (model copy, optimiser, batches and steps; not the heap trims around it)."""
    return measure(loaded, cfg, part, n_outputs, device, args)


def trainer(loaded, cfg: FinetuneConfig, part, n_outputs, device, args, optim: str) -> dict:
    """The same steps through transformers' Trainer (module docstring for what is the same)."""
    import tempfile

    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments

    trim_heap()
    memory = PeakMemory(device)
    start = time.perf_counter()
    built = build_model(cfg, loaded, n_outputs, device)
    n_steps = args.warmup_steps + args.steps
    tokens = part.tokens
    examples = []
    for i in range(n_steps * args.batch_size):  # batch k holds examples k·B .. k·B + B − 1
        example = {
            "input_ids": tokens.input_ids[i],
            "special_tokens_mask": tokens.special[i],
            "attention_mask": [1] * len(tokens.input_ids[i]),
            "labels": int(part.labels[i]),
        }
        if tokens.token_types is not None:
            example["token_type_ids"] = tokens.token_types[i]
        examples.append(example)
    cuda = device.type == "cuda"
    amp_bf16 = cuda and cfg.mixed_precision and torch.cuda.is_bf16_supported()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def _sync(self) -> None:
            if cuda:
                torch.cuda.synchronize(device)

        def on_step_begin(self, *a, **k) -> None:
            self._sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k) -> None:
            self._sync()
            self.times.append(time.perf_counter() - self.t0)
            memory.sample()

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as tmp:
        training = TrainingArguments(
            output_dir=tmp, max_steps=n_steps, per_device_train_batch_size=args.batch_size,
            learning_rate=cfg.lr, weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup,
            lr_scheduler_type="linear", optim=optim, max_grad_norm=1.0, seed=cfg.seed,
            logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none",
            disable_tqdm=True, dataloader_num_workers=0, dataloader_pin_memory=cuda,
            remove_unused_columns=False, train_sampling_strategy="sequential",
            use_cpu=not cuda, bf16=amp_bf16, fp16=cuda and cfg.mixed_precision and not amp_bf16,
        )  # fmt: skip
        runner = Trainer(
            model=LossModule(built.model), args=training, train_dataset=examples,
            data_collator=DataCollatorWithPadding(loaded.tokenizer), callbacks=[timer],
        )  # fmt: skip
        runner.train()
    loop_s = time.perf_counter() - start
    peak = memory.stop()
    timed = timer.times[args.warmup_steps :]
    assert len(timer.times) == n_steps, f"{len(timer.times)} steps timed, expected {n_steps}"
    out = {
        "step_s": statistics.mean(timed),
        "step_sd": statistics.stdev(timed) if len(timed) > 1 else 0.0,
        "peak_mb": peak,
        "loop_s": loop_s,
        "n_trainable": built.n_trainable,
    }
    del built, runner
    trim_heap()
    return out


def versus_trainer(loaded, part, n_outputs, device, args) -> None:
    L = loaded.n_layers
    plan = [
        (f"full (1, {L}, {L})", {"method": "full"}),
        (f"(1, {args.l_star}, {args.l_star})", {"method": "layers",
                                                "layers": (1, args.l_star, args.l_star)}),
    ]  # fmt: skip
    sides = {
        "ours (fused AdamW)": lambda cfg: ours(loaded, cfg, part, n_outputs, device, args),
        "Trainer (fused AdamW)": lambda cfg: trainer(
            loaded, cfg, part, n_outputs, device, args, "adamw_torch_fused"
        ),
        "Trainer (adamw_torch)": lambda cfg: trainer(
            loaded, cfg, part, n_outputs, device, args, "adamw_torch"
        ),
    }
    results = {(name, side): [] for name, _ in plan for side in sides}
    for _ in range(args.rounds):
        for name, kwargs in plan:
            cfg = FinetuneConfig(
                model=ModelSpec(args.model), steps=args.warmup_steps + args.steps,
                batch_size=args.batch_size, max_length=args.max_length, warmup=0.1, **kwargs,
            )  # fmt: skip
            for side, run in sides.items():
                results[(name, side)].append(run(cfg))
    header = (
        f"{'strategy':<16}{'loop':<26}{'n_trainable':>12}{'step ms':>10}{'± sd':>8}"
        f"{'vs ours':>9}{'loop s':>8}{'peak MiB':>10}"
    )
    print()
    print(f"ours vs the Hugging Face Trainer, same model, batches, optimiser and schedule "
          f"({args.rounds} round(s), medians)")  # fmt: skip
    print(header)
    print("-" * len(header))
    for name, _ in plan:
        base = statistics.median(r["step_s"] for r in results[(name, "ours (fused AdamW)")])
        for side in sides:
            rs = results[(name, side)]
            step = statistics.median(r["step_s"] for r in rs)
            print(
                f"{name:<16}{side:<26}{rs[0]['n_trainable']:>12,}{1000 * step:>10.1f}"
                f"{1000 * statistics.median(r['step_sd'] for r in rs):>8.1f}"
                f"{step / base:>9.2f}{statistics.median(r['loop_s'] for r in rs):>8.2f}"
                f"{statistics.median(r['peak_mb'] for r in rs):>10.1f}"
            )


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
    parser.add_argument("--no-trainer", action="store_true", help="skip the Trainer comparison")
    parser.add_argument("--trainer-only", action="store_true", help="only the Trainer comparison")
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
    if not args.trainer_only:
        strategy_table(loaded, part, n_outputs, device, args)
    if not args.no_trainer:
        versus_trainer(loaded, part, n_outputs, device, args)


def strategy_table(loaded, part, n_outputs, device, args) -> None:
    L, H = loaded.n_layers, loaded.n_heads
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
