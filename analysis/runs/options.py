"""Command-line options of a fine-tuning run, shared by ``finetune`` and ``sweep``."""

from __future__ import annotations

import argparse
from typing import Any


def parse_ints(text: str | None, what: str) -> tuple[int, ...] | None:
    """``"1,3,3"`` → (1, 3, 3); None or "" → None; anything else is a clear ValueError."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(int(part) for part in str(text).replace(" ", "").split(",") if part)
    except ValueError:
        raise ValueError(
            f"{what} must be whole numbers separated by commas (got {text!r})."
        ) from None


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """What every run needs besides its method: budget, optimiser, data sizes, device."""
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default per method)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--n-train", type=int, default=None, help="train examples (default all)")
    parser.add_argument("--n-eval", type=int, default=1000, help="dev/test examples scored")
    parser.add_argument("--eval-every", type=int, default=50, help="dev score every k steps")
    parser.add_argument("--pooling", default="mean", choices=["mean", "first"])
    parser.add_argument("--device", default=None, help="cpu, cuda:0… (default: GPU if any)")
    parser.add_argument(
        "--no-mixed-precision", action="store_true", help="keep float32 on the GPU too"
    )
    parser.add_argument("--heads", default=None, help="head selection file (method heads)")
    parser.add_argument("--adapter-layers", default=None, help="e.g. 3,4 (method adapter)")
    parser.add_argument("--lora-layers", default=None, help="e.g. 3,4 (method lora)")
    parser.add_argument("--lora-r", type=int, default=8, help="LoRA rank")
    parser.add_argument(
        "--trajectory-every", type=int, default=None, help="snapshot weights every k steps"
    )
    parser.add_argument("--subspace-from", default=None, help="run id (methods subspace*)")
    parser.add_argument("--zero-weights", default=None, help="JSON file of weights set to zero")


def finetune_config(
    args: argparse.Namespace,
    *,
    method: str,
    layers: tuple[int, ...] | None,
    seed: int,
) -> Any:
    """A FinetuneConfig from parsed options plus one method / layers / seed."""
    from analysis.commands._common import data_spec_from_args, model_spec_from_args
    from analysis.finetune import FinetuneConfig, heads_from_file

    heads = heads_from_file(args.heads) if method == "heads" and args.heads else None
    return FinetuneConfig(
        model=model_spec_from_args(args),
        data=data_spec_from_args(args),
        method=method,
        layers=layers,
        heads=heads,
        adapter_layers=parse_ints(args.adapter_layers, "--adapter-layers")
        if method == "adapter"
        else None,
        lora_layers=parse_ints(args.lora_layers, "--lora-layers") if method == "lora" else None,
        lora_r=args.lora_r,
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        max_length=args.max_length,
        seed=seed,
        n_train=args.n_train,
        n_eval=args.n_eval,
        eval_every=args.eval_every,
        pooling=args.pooling,
        trajectory_every=args.trajectory_every,
        subspace_from=args.subspace_from if method.startswith("subspace") else None,
        zero_weights=args.zero_weights,
        device=args.device,
        mixed_precision=not args.no_mixed_precision,
    )


class StepBar:
    """A tqdm bar over a run's steps, showing the loss; also shows progress messages."""

    def __init__(self, total: int, description: str) -> None:
        import sys

        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=description, file=sys.stderr, unit="step")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.n = step
        loss = metrics.get("loss")
        if loss is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
        self.bar.refresh()

    def message(self, fraction: float, message: str = "") -> None:
        if message and self.bar.n == 0:
            self.bar.set_postfix_str(message, refresh=True)

    def close(self) -> None:
        self.bar.close()
