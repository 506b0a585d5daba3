"""``export``: a recommendation or a stored run as a recipe folder for the user's own training
(`analysis.export.build`): recipe.json, tunescope_recipe.py, README.md and, for a method whose
export is a PEFT config (LoRA, IA³…), PEFT's adapter_config.json.

What to export: ``--run ID``, ``--strategy ℓ_bottom,ℓ_top,ℓ_cls`` (method layers), ``--heads
FILE`` (method heads) or ``--method NAME`` (any method of the registry). The method options
(``--lora-r``, ``--lora-alpha``, ``--adapter-size``, ``--adapter-layers``…) are the flags
``finetune`` and ``sweep`` have, made by the same code (`add_method_options`).
"""

from __future__ import annotations

import argparse

from analysis.config import POOLINGS, parse_ints
from analysis.finetune.registry import method_names, method_spec
from tunescope.commands.options import (
    absolute_path,
    add_learning_rates,
    add_method_options,
    add_model_data,
    add_setting_flag,
    finetune_config,
    refuse_foreign_flags,
)

NAME = "export"
HELP = "export a run or a recommendation (strategy, heads, LoRA…) as a recipe for your own training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--run", default=None, help="a stored run id (or a unique part of it)")
    what.add_argument(
        "--strategy", default=None, help="ℓ_bottom,ℓ_top,ℓ_cls, e.g. 1,4,4 (method layers)"
    )
    what.add_argument(
        "--method", default=None, choices=method_names(),
        help="a method with its own options below (--heads FILE alone means --method heads)",
    )  # fmt: skip
    parser.add_argument(
        "--layers",
        default=None,
        help="with a method that places its modules (lora, adapter…): the layers that get them, "
        "e.g. 4,5,6 (as --lora-layers / --adapter-layers); with --method layers: "
        "ℓ_bottom,ℓ_top,ℓ_cls",
    )
    parser.add_argument(
        "--classifier-layer", "--head-layer", dest="classifier_layer", type=int, default=None,
        help="ℓ_cls: the layer the classifier reads, the layers above removed (default: L)",
    )  # fmt: skip
    parser.add_argument("--l-star", type=int, default=None, help="ℓ* the recommendation came from")
    parser.add_argument("--out", required=True, help="the recipe folder to write")
    add_model_data(parser)
    for name in ("steps", "batch_size", "max_length", "n_train"):
        add_setting_flag(parser, name, type=int)
    add_setting_flag(parser, "seed", type=int)
    add_learning_rates(parser)
    add_setting_flag(parser, "pooling", choices=POOLINGS)
    add_method_options(parser)


def run(args: argparse.Namespace) -> int:
    from analysis.export.build import make_recipe, run_source, write_recipe

    if args.run:
        refuse_foreign_flags(args, (), runs="--run (its run says what trains)")
        if args.layers or args.classifier_layer is not None:
            raise ValueError("--layers and --classifier-layer go with a recommendation, not --run.")
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


def _method_of(args: argparse.Namespace) -> str:
    if args.strategy:
        return "layers"
    if args.method:
        return args.method
    if args.heads:
        return "heads"
    raise ValueError(
        "Say what to export: --run ID, --strategy 1,4,4, --heads FILE or --method NAME."
    )


def _recommended(args: argparse.Namespace):
    from analysis.export.build import selection_settings

    method = _method_of(args)
    spec = method_spec(method)
    refuse_foreign_flags(args, {method})
    layers = parse_ints(args.layers, "--layers")
    triple = parse_ints(args.strategy, "--strategy") if args.strategy else None
    if layers and spec.needs_layers and triple is None:
        triple, layers = layers, None
    if layers:
        _place(args, method, args.layers)
    if triple is None and args.classifier_layer is not None:
        used = layers or (1,)
        triple = (min(used), max(used), args.classifier_layer)
    cfg = finetune_config(args, method=method, layers=triple, seed=args.seed)
    selects_heads = spec.option_field("heads") is not None
    source = "strategy" if args.strategy else "heads" if selects_heads else "method"
    provenance = {
        "source": source,
        "run_id": None,
        "layers": list(triple) if triple else None,
        "selection": selection_settings(cfg),
    }
    if args.heads:
        provenance["selection_file"] = absolute_path(args.heads)
    return cfg, provenance


def _place(args: argparse.Namespace, method: str, text: str) -> None:
    """``--layers`` as the placement option of ``method`` (its options' field of kind layers)."""
    field = method_spec(method).option_field("layers")
    if field is None:
        raise ValueError(
            f"--layers goes with --method layers or a method that places its modules (lora, "
            f"adapter…), not {method}."
        )
    if getattr(args, field.flat, None) is not None:
        raise ValueError(f"Give --layers or {field.flag}, not both.")
    setattr(args, field.flat, text)
