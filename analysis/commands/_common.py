"""Options shared by the subcommands, and the glue from argparse to configs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec


def add_model_data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm", help="built-in name, local folder or hub id")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the model's own Python code to run (only for models you trust)",
    )
    parser.add_argument(
        "--data", default="movie-snippets", help="built-in name, glue/<task>, or a file path"
    )
    parser.add_argument("--text-col", default=None, help="text column of a local file")
    parser.add_argument("--text-pair-col", default=None, help="second-text column of a local file")
    parser.add_argument("--label-col", default=None, help="label column of a local file")
    parser.add_argument(
        "--split-seed", type=int, default=0, help="seed of the train/dev/test split"
    )
    parser.add_argument("--cache", default=None, help="cache folder (default: ./cache)")


def add_common(parser: argparse.ArgumentParser, n_default: int = 1000) -> None:
    """Model, data, sample and pooling options: everything an extraction needs."""
    add_model_data(parser)
    parser.add_argument("--n", type=int, default=n_default, help="number of sampled examples")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--part", default="train", choices=["train", "dev", "test"])
    parser.add_argument("--scheme", default="random", choices=["random", "balanced", "share"])
    parser.add_argument("--share", type=float, default=None, help="share p of the first class")
    parser.add_argument("--pooling", default="mean", choices=["mean", "first"])
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)


def apply_cache(args: argparse.Namespace) -> None:
    if getattr(args, "cache", None):
        os.environ["TUNESCOPE_CACHE"] = str(Path(args.cache).expanduser().resolve())


def model_spec_from_args(args: argparse.Namespace) -> ModelSpec:
    if args.trust_remote_code:
        print(
            f"warning: trust_remote_code is on for {args.model}: its own code will run.",
            file=sys.stderr,
        )
    return ModelSpec(args.model, trust_remote_code=args.trust_remote_code)


def data_spec_from_args(args: argparse.Namespace) -> DataSpec:
    return DataSpec(
        args.data,
        text_col=args.text_col,
        text_pair_col=args.text_pair_col,
        label_col=args.label_col,
        split_seed=args.split_seed,
    )


def extract_config_from_args(args: argparse.Namespace) -> ExtractConfig:
    apply_cache(args)
    return ExtractConfig(
        model=model_spec_from_args(args),
        data=data_spec_from_args(args),
        sample=SampleSpec(
            n=args.n, seed=args.seed, part=args.part, scheme=args.scheme, share=args.share
        ),
        pooling=args.pooling,
        max_length=args.max_length,
        batch_size=args.batch_size,
    )


class TqdmProgress:
    """A progress callback that drives one tqdm bar on stderr."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.bar = None  # created on the first report, so an early error prints alone

    def __call__(self, fraction: float, message: str = "") -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=1000, desc=self.description, file=sys.stderr, leave=False)
        self.bar.n = int(1000 * min(max(fraction, 0.0), 1.0))
        if message:
            self.bar.set_postfix_str(message, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write JSON atomically (a temp file renamed into place); '-' means stdout."""
    if not path:
        return
    text = json.dumps(payload, indent=2, default=float)
    if path == "-":
        print(text)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)
