"""``extract``: fill the cache with every layer's pooled states for one sample."""

from __future__ import annotations

import argparse

from analysis.config import to_dict
from tunescope.commands.options import (
    TqdmProgress,
    add_common,
    extract_config_from_args,
    write_json,
)

NAME = "extract"
HELP = "compute (or reuse) the pooled hidden states of every layer and print where they are cached"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--json", default=None, help="also write a summary as JSON to this file")


def run(args: argparse.Namespace) -> int:
    from analysis.extract import extract_states

    cfg = extract_config_from_args(args)
    bar = TqdmProgress("extracting")
    try:
        result = extract_states(cfg, progress=bar)
    finally:
        bar.close()
    summary = {
        "config": to_dict(cfg),
        "shape": list(result.states.shape),
        "n_layers": result.n_layers,
        "d_model": result.d_model,
        "cache_hit": result.meta["cache_hit"],
        "seconds": result.meta.get("seconds"),
        "path": result.meta["cache_path"],
    }
    source = "served from cache" if result.meta["cache_hit"] else "computed"
    print(
        f"{source}: states of {result.n_layers + 1} layers (0 = embeddings) × {result.n} examples "
        f"× d_model {result.d_model}\n{result.meta['cache_path']}"
    )
    write_json(args.json, summary)
    return 0
