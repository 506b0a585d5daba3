"""What `TunescopeCallback` costs a user's Trainer per step: the same Trainer, model, batches and
optimizer with and without the callback, side by side.

    .venv/bin/python bench/bench_callback.py [--steps 30] [--rounds 3] [--batch-size 16]
        [--max-length 64] [--trajectory-every 10] [--model minilm] [--json out.json]

On MiniLM and movie snippets (synthetic texts if the data is unavailable), an exported (1, 3, 3)
recipe applied to `TunescopeClassifier` (the recipe folder's module), trained by a plain
``Trainer`` with ``logging_steps=1`` (every step's loss is logged, so the callback writes every
step). Rows, run in turn ``--rounds`` times (medians):

- bare: the Trainer alone;
- callback: + `TunescopeCallback` (a running run, one committed row of loss / lr / grad norm per
  step, progress, the peak-memory sampler);
- callback + trajectory: the same, snapshotting every layer every ``--trajectory-every`` steps.

Per-step time: the time between consecutive ``on_step_begin`` events (a timing callback placed
first), so everything the Trainer does for a step — forward, backward, optimizer, logging,
callbacks — is in it; the first ``--warmup-steps`` are dropped. The ratio is callback / bare
(medians of the rounds). On a loaded machine that A/B ratio drowns in the noise between rounds,
so each callback run also times the callback's own per-step methods (``on_step_begin``,
``on_step_end``, ``on_log``: the database writes, progress, snapshots) and reports them against
the rest of the same steps: step / (step − in-callback), load-independent to first order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import transformers as tf

from analysis.config import DataSpec, ModelSpec
from analysis.export.build import make_recipe, write_recipe
from analysis.finetune.config import FinetuneConfig
from analysis.runs.callback import TunescopeCallback


class StepClock(tf.TrainerCallback):
    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())

    def step_times(self, skip: int) -> list[float]:
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        return gaps[skip:]


def texts_and_labels(n: int) -> tuple[list[str], list[int]]:
    try:
        from analysis.data import load_data

        train = load_data(DataSpec("movie-snippets")).parts["train"].iloc[:n]
        return list(train["text"]), [int(x) for x in train["label"]]
    except Exception:  # the data package is missing: synthetic snippets
        words = ["good", "great", "fun", "bad", "awful", "dull", "movie", "plot", "acting"]
        return [" ".join(words[(i * 7 + j) % 9] for j in range(12)) for i in range(n)], [
            i % 2 for i in range(n)
        ]


def one_run(recipe_dir: Path, rows, tokenizer, args, kind: str, cache: Path) -> list[float]:
    sys.path.insert(0, str(recipe_dir))
    from tunescope_recipe import TunescopeClassifier, load_recipe, make_optimizer

    recipe = load_recipe(recipe_dir)
    model = TunescopeClassifier.from_pretrained(recipe)
    clock = StepClock()
    callbacks: list = [clock]
    inside = [0.0]
    if kind != "bare":
        every = args.trajectory_every if kind == "callback + trajectory" else None
        callback = TunescopeCallback(
            "minilm", "bench", recipe=recipe, cache=cache, trajectory_every=every
        )
        for name in ("on_step_begin", "on_step_end", "on_log"):  # what runs every step
            setattr(callback, name, _timed(getattr(callback, name), inside))
        callbacks.append(callback)
    with tempfile.TemporaryDirectory() as out:
        trainer = tf.Trainer(
            model=model,
            args=tf.TrainingArguments(
                output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
                use_cpu=args.device == "cpu", seed=0,
            ),
            train_dataset=rows,
            data_collator=tf.DataCollatorWithPadding(tokenizer),
            optimizers=make_optimizer(model, recipe, steps=args.steps),
            callbacks=callbacks,
        )  # fmt: skip
        trainer.train()
    times = clock.step_times(args.warmup_steps)
    return times, inside[0] / max(len(clock.stamps) - 1, 1)


def _timed(method, total: list[float]):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t0

    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--trajectory-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="bench-callback-"))
    cfg = FinetuneConfig(
        model=ModelSpec(args.model), method="layers", layers=(1, 3, 3), steps=args.steps,
        batch_size=args.batch_size, max_length=args.max_length,
    )  # fmt: skip
    recipe = make_recipe(cfg, {"source": "bench"}, n_outputs=2)
    write_recipe(recipe, work / "recipe")
    tokenizer = tf.AutoTokenizer.from_pretrained(recipe["model"]["path"] or args.model)
    texts, labels = texts_and_labels(args.steps * args.batch_size)
    encoded = tokenizer(texts, truncation=True, max_length=args.max_length)
    rows = [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": y}
            for ids, y in zip(encoded["input_ids"], labels, strict=True)]  # fmt: skip

    kinds = ["bare", "callback", "callback + trajectory"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    inside: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else reversed(kinds):
            steps, in_callback = one_run(work / "recipe", rows, tokenizer, args, kind, work)
            times[kind].append(statistics.median(steps))
            inside[kind].append(in_callback)
    bare = statistics.median(times["bare"])
    report = {"steps": args.steps, "rounds": args.rounds, "batch_size": args.batch_size,
              "max_length": args.max_length, "device": args.device, "rows": {}}  # fmt: skip
    print(f"MiniLM (1, 3, 3) recipe, batch {args.batch_size}, length {args.max_length}, "
          f"{args.steps} steps × {args.rounds} rounds (medians), {args.device}")  # fmt: skip
    for kind in kinds:
        ms = 1000 * statistics.median(times[kind])
        ratio = statistics.median(times[kind]) / bare
        own = statistics.median(inside[kind])
        step = statistics.median(times[kind])
        # The same run's own split: the step without the callback's work vs with it.
        own_ratio = step / (step - own) if step > own else float("nan")
        report["rows"][kind] = {"ms_per_step": ms, "ratio": ratio, "rounds_s": times[kind],
                                "callback_ms_per_step": 1000 * own, "own_ratio": own_ratio}  # fmt: skip
        print(f"  {kind:<24} {ms:8.1f} ms/step   {ratio:5.3f}× bare   in the callback "
              f"{1000 * own:6.2f} ms/step ({own_ratio:5.3f}× the rest of the step)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
