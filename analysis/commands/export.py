"""``export``: a recommendation or a stored run as a recipe folder for the user's own training
(`analysis.export.build`): recipe.json, tunescope_recipe.py, README.md and, for LoRA, PEFT's
adapter_config.json."""

from __future__ import annotations

import argparse

from analysis.commands.options import (
    absolute_path,
    add_model_data,
    apply_cache,
    data_spec_from_args,
    model_spec_from_args,
)
from analysis.config import FINETUNE_METHODS, POOLINGS, parse_ints

NAME = "export"
HELP = "export a run or a recommendation (strategy, heads, LoRA…) as a recipe for your own training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", default=None, help="a stored run id (or a unique part of it)")
    what.add_argument(
        "--strategy", default=None, help="ℓ_bottom,ℓ_top,ℓ_head, e.g. 1,4,4 (method layers)"
    )
    what.add_argument("--heads", default=None, help="a head selection file (method heads)")
    what.add_argument("--method", default=None, choices=FINETUNE_METHODS)
    parser.add_argument(
        "--layers",
        default=None,
        help="with --method lora / adapter: the layers that get them, e.g. 4,5,6; with --method "
        "layers: ℓ_bottom,ℓ_top,ℓ_head",
    )
    parser.add_argument("--head-layer", type=int, default=None, help="ℓ_head (default: L)")
    parser.add_argument("--lora-r", type=int, default=None, help="LoRA rank r (default 8)")
    parser.add_argument("--adapter-size", type=int, default=None, help="adapter bottleneck units")
    parser.add_argument("--l-star", type=int, default=None, help="ℓ* the recommendation came from")
    parser.add_argument("--out", required=True, help="the recipe folder to write")
    add_model_data(parser)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=None, help="body learning rate")
    parser.add_argument(
        "--classifier-lr", "--head-lr", dest="head_lr", type=float, default=None,
        help="the classifier's learning rate (default 1e-3)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pooling", default="mean", choices=POOLINGS)


def run(args: argparse.Namespace) -> int:
    from analysis.export.build import make_recipe, run_source, write_recipe

    apply_cache(args)
    if args.run:
        cfg, provenance = run_source(args.run)
    else:
        cfg, provenance = _recommended(args)
    if args.l_star is not None:
        provenance["l_star"] = args.l_star
    recipe = make_recipe(cfg, provenance)
    files = write_recipe(recipe, absolute_path(args.out))
    train = recipe["train"]
    print(
        f"recipe for {recipe['model']['name']}, {recipe['description']}: "
        f"{train['n_trainable']:,} of {train['n_params']:,} parameters train"
    )
    for file in files:
        print(f"  wrote {file}")
    return 0


def _recommended(args: argparse.Namespace):
    from analysis.export.methods import REFUSED
    from analysis.finetune.config import FinetuneConfig, flat_config

    layers = parse_ints(args.layers, "--layers")
    flat: dict = {}
    if args.strategy:
        method, triple = "layers", parse_ints(args.strategy, "--strategy")
    else:
        method = "heads" if args.heads else args.method
        triple = None
    if method in REFUSED:
        raise ValueError(f"Method {method!r} cannot be exported: {REFUSED[method]}.")
    if method == "heads":
        from analysis.heads.selection_file import load_selection

        selection = load_selection(args.heads)
        flat["heads"] = {str(k): list(v) for k, v in selection.layers}
        flat["heads_settings"] = dict(selection.settings) or None
    if method == "layers" and triple is None:
        triple = layers
    elif method in ("lora", "adapter") and layers:
        flat[f"{method}_layers"] = list(layers)
    elif layers:
        raise ValueError(f"--layers goes with --method layers, lora or adapter, not {method}.")
    if args.lora_r is not None:
        if method != "lora":
            raise ValueError("--lora-r is an option of --method lora: drop it.")
        flat["lora_r"] = args.lora_r
    if args.adapter_size is not None:
        if method != "adapter":
            raise ValueError("--adapter-size is an option of --method adapter: drop it.")
        flat["adapter_size"] = args.adapter_size
    if triple is None and args.head_layer is not None:
        used = layers or [1]
        triple = (min(used), max(used), args.head_layer)
    base = FinetuneConfig(
        model=model_spec_from_args(args),
        data=data_spec_from_args(args),
        steps=args.steps,
        batch_size=args.batch_size,
        max_length=args.max_length,
        seed=args.seed,
        pooling=args.pooling,
    ).to_dict()
    for key in (
        "heads",
        "adapter_layers",
        "adapter_size",
        "lora_r",
        "lora_layers",
        "heads_settings",
    ):
        base.pop(key, None)
    base.update(method=method, layers=list(triple) if triple else None, lr=args.lr, **flat)
    if args.head_lr is not None:
        base["head_lr"] = args.head_lr
    cfg = flat_config(**base)
    source = "strategy" if args.strategy else "heads" if args.heads else "method"
    provenance = {
        "source": source,
        "run_id": None,
        "strategy": list(triple) if triple else None,
        "selection": flat.get("heads_settings"),
    }
    if args.heads:
        provenance["selection_file"] = absolute_path(args.heads)
    return cfg, provenance
