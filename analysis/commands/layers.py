"""``layers``: ν, CCA, rank ϱ and probe score of every layer; ℓ*, ζ and ρ (paper 000)."""

from __future__ import annotations

import argparse
from typing import Any

from analysis.commands.options import TqdmProgress, add_common, extract_config_from_args, write_json

NAME = "layers"
HELP = "per-layer task-specialty ν, CCA, rank ϱ and linear probes; the best layer ℓ*"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--bins",
        type=int,
        default=2,
        help="regression tasks: quantile bins of the scores used as classes for ν, CCA and ϱ",
    )
    parser.add_argument("--json", default=None, help="write the results as JSON ('-': stdout)")


def table(result: dict[str, Any]) -> str:
    """A readable table of the layers, ℓ* starred."""
    lines = [f"{'layer':>5} {'nu':>11} {'cca':>7} {'rank':>8} {'probe':>7}"]
    for row in result["layers"]:
        cells = [
            "-" if row[m] is None else fmt.format(row[m])
            for m, fmt in (
                ("nu", "{:.4g}"),
                ("cca", "{:.3f}"),
                ("rank", "{:.2f}"),
                ("probe", "{:.3f}"),
            )
        ]
        star = "  ← ℓ*" if row["layer"] == result["l_star"] else ""
        lines.append(
            f"{row['layer']:>5} {cells[0]:>11} {cells[1]:>7} {cells[2]:>8} {cells[3]:>7}{star}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from analysis.extract import extract_states
    from analysis.layers.table import cached_layer_metrics, report

    cfg = extract_config_from_args(args)
    bar = TqdmProgress("hidden states")
    try:
        states = extract_states(cfg, progress=bar)
    finally:
        bar.close()
    bar = TqdmProgress("layer metrics")
    try:
        df, hit = cached_layer_metrics(states, seed=cfg.sample.seed, n_bins=args.bins, progress=bar)
    finally:
        bar.close()
    result = report(cfg, df, hit)
    write_json(args.json, result)
    if args.json != "-":
        source = "served from the cache" if hit else f"computed in {result['seconds']:.1f} s"
        print(
            f"{cfg.model.name} on {cfg.data.name}: n = {cfg.sample.n}, pooling {cfg.pooling}, "
            f"probe metric {result['metric']}; metrics {source}"
        )
        if result["label_note"]:
            print(result["label_note"])
        print(table(result))
        rho = ", ".join(
            f"{k} {'-' if v is None else f'{v:+.3f}'}" for k, v in result["rho"].items()
        )
        zeta = "-" if result["zeta"] is None else f"{result['zeta']:.3g}"
        print(f"ℓ* = {result['l_star']} (lowest ν over layers 1..{result['n_layers']}); ζ = {zeta}")
        print(f"ρ(metric, probe) across layers: {rho}")
        if args.json:
            print(f"JSON written to {args.json}")
    return 0
