"""``heads``: information richness, head correlation, PageRank and the top-k heads of every layer."""

from __future__ import annotations

import argparse

from analysis.config import to_dict
from analysis.heads.selection_file import PAGERANK_VARIANTS, SCOPES, SELECTORS
from tunescope.commands.options import (
    TqdmProgress,
    add_common,
    extract_config_from_args,
    write_json,
)

NAME = "heads"
HELP = "rank every layer's attention heads by PageRank over richness and correlation (HiFi)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser, n_default=300, precision=False)  # head statistics are float32 only
    parser.add_argument("--xi", type=float, default=0.9, help="singular-value mass threshold ξ")
    parser.add_argument("--damping", type=float, default=0.85, help="PageRank damping d")
    parser.add_argument("--tol", type=float, default=1e-6, help="PageRank tolerance ε on ‖ΔP‖₁")
    parser.add_argument("--k", type=int, default=3, help="heads chosen per layer")
    parser.add_argument(
        "--variant",
        default="paper",
        choices=PAGERANK_VARIANTS,
        help="PageRank teleport: paper = uniform, personalised = (1 − d)·P⁽⁰⁾",
    )
    parser.add_argument(
        "--scope", default="layer-wise", choices=SCOPES, help="which layers get heads"
    )
    parser.add_argument(
        "--selector", default="pagerank", choices=SELECTORS, help="how heads are chosen"
    )
    parser.add_argument("--selector-seed", type=int, default=0, help="seed of the random selector")
    parser.add_argument(
        "--json", default=None, help="write every layer's statistics as JSON ('-': stdout)"
    )
    parser.add_argument("--selection-out", default=None, help="write the head-selection file here")


def run(args: argparse.Namespace) -> int:
    from analysis.heads.collect import HeadStatsConfig, head_stats
    from analysis.heads.select import HeadSelectionConfig, analyse_heads, trainable_parameter_count
    from analysis.heads.selection_file import save_selection
    from analysis.models import load_model

    cfg = HeadStatsConfig(extract_config_from_args(args), xi=args.xi)
    selection_cfg = HeadSelectionConfig(
        k=args.k,
        damping=args.damping,
        tol=args.tol,
        variant=args.variant,
        scope=args.scope,
        selector=args.selector,
        seed=args.selector_seed,
    )
    loaded = load_model(cfg.extract.model)
    if selection_cfg.k > loaded.n_heads:  # say so before the long computation, not after it
        raise ValueError(
            f"k = {selection_cfg.k} heads per layer asked for, but the model has only "
            f"{loaded.n_heads}."
        )
    bar = TqdmProgress("head statistics")
    try:
        stats, meta = head_stats(cfg, progress=bar, loaded=loaded)
    finally:
        bar.close()
    result = analyse_heads(stats, selection_cfg)
    count = trainable_parameter_count(
        result.selected, meta["d_model"], meta["d_head"], meta["n_params"]
    )
    settings = {
        "model": cfg.extract.model.name,
        "data": to_dict(cfg.extract.data),
        "sample": to_dict(cfg.extract.sample),
        "max_length": cfg.extract.max_length,
        "xi": cfg.xi,
        **to_dict(selection_cfg),
    }
    payload = {
        "settings": settings,
        "model": {key: meta[key] for key in ("model", "family", "d_model", "d_head", "n_params")}
        | {"n_layers": stats.n_layers, "n_heads": stats.n_heads},
        "n": stats.n,
        "n_trainable": count.n_trainable,
        "share": count.share,
        "cache_hit": meta["cache_hit"],
        "seconds": meta.get("seconds"),
        "layers": result.layers_table(),
    }
    write_json(args.json, payload)
    if args.selection_out:
        selection = result.to_selection(cfg.extract.model.name, {"data": cfg.extract.data.name})
        save_selection(selection, args.selection_out)

    if args.json != "-":
        source = "served from cache" if meta["cache_hit"] else "computed"
        print(
            f"{source}: {stats.n_layers} layers × {stats.n_heads} heads, n = {stats.n}, ξ = {cfg.xi}"
        )
        for row in payload["layers"]:
            chosen = ", ".join(map(str, row["selected"])) or "-"
            print(
                f"layer {row['layer']:>2}: heads {chosen:<16} ({row['iterations']} PageRank iterations)"
            )
        print(
            f"n_trainable {count.n_trainable:,} of {count.n_params:,} ({100 * count.share:.2f} %)"
        )
        if args.selection_out:
            print(f"selection written to {args.selection_out}")
    return 0
