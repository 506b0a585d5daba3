"""``sweep``: the paper's strategies × seeds, queued for the worker (or run here, one by one)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from analysis.finetune.registry import method_names, method_spec
from analysis.finetune.spec import LR_GRID
from analysis.io import json_ready
from analysis.strategies import strategy_names
from analysis.words import counted
from tunescope.commands.options import (
    StepBar,
    add_model_data,
    add_training_options,
    executor_from_args,
    finetune_config,
    launch,
    parse_ints,
    refuse_foreign_flags,
    write_json,
)

NAME = "sweep"
HELP = (
    "queue a grid of strategies (ℓ*-down, ℓ*-up, baselines, LoRA…) × seeds into the runs database"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_data(parser)
    parser.add_argument(
        "--strategies",
        default="down,up,baselines",
        help=f"comma-separated, from: {', '.join(strategy_names())}",
    )
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, e.g. 0,1,2")
    parser.add_argument(
        "--l-star",
        type=int,
        default=None,
        help="ℓ* (default: computed as argmin ν on --n examples)",
    )
    parser.add_argument("--n", type=int, default=1000, help="examples used to compute ℓ*")
    parser.add_argument(
        "--all-tops", action="store_true", help="ℓ*-up also as (ℓ*+1, t, t) for every t < L"
    )
    add_training_options(parser)
    parser.add_argument(
        "--lr-grid",
        nargs="?",
        const=",".join(f"{m:g}" for m in LR_GRID),
        default=None,
        metavar="FACTORS",
        help="also try these multiples of each method's body learning rate (alone: "
        f"{','.join(f'{m:g}' for m in LR_GRID)}); the rate with the best mean dev score "
        "is chosen per strategy, never on test (frozen has no body: one rate)",
    )
    parser.add_argument(
        "--foreground", action="store_true", help="run the sweep here instead of queueing it"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, queue nothing")
    parser.add_argument("--json", default=None, help="write the plan (and results) as JSON here")


def compute_l_star(args: argparse.Namespace, loaded) -> int:
    """argmin ν over ℓ = 1..L on a sample of the train part (docs/explanation/layer-metrics.md)."""
    from analysis.config import ExtractConfig, SampleSpec
    from analysis.extract import extract_states
    from analysis.layers.table import layer_metrics, summary
    from tunescope.commands.options import TqdmProgress, data_spec_from_args

    cfg = ExtractConfig(
        model=loaded.spec,
        data=data_spec_from_args(args),
        sample=SampleSpec(n=args.n, seed=0),
        pooling=args.pooling,
        max_length=args.max_length,
    )
    bar = TqdmProgress("ν per layer")
    try:
        states = extract_states(cfg, progress=bar, loaded=loaded)
    finally:
        bar.close()
    table = layer_metrics(
        states.states.numpy(), states.labels.numpy(), metric=states.metric, which=("nu",)
    )
    l_star = summary(table)["l_star"]
    if l_star is None:
        raise ValueError("ν could not be computed on any layer; give --l-star.")
    return int(l_star)


def lr_factors(text: str | None) -> tuple[float, ...]:
    """The learning-rate multipliers of ``--lr-grid`` ("0.5,1,2"); (1.0,) without a grid."""
    if text is None:
        return (1.0,)
    try:
        factors = tuple(float(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"--lr-grid takes factors like 0.5,1,2 (got {text!r}).") from None
    if not factors or any(not f > 0 for f in factors) or len(set(factors)) != len(factors):
        raise ValueError(f"--lr-grid needs distinct positive factors (got {text!r}).")
    return factors


def sweep_methods(names: list[str]) -> set[str]:
    """The methods the runs of these strategies use (known before ℓ* and L are): a layer family
    gives runs of layer triples (``layers``) and full fine-tuning (``full``, the reference), any
    other strategy is its own method."""
    from analysis.finetune.registry import sweep_methods as whole_model

    methods = {name for name in names if name in whole_model()}
    if set(names) - set(whole_model()):
        methods |= set(method_names(lambda spec: spec.needs_layers or spec.reference))
    return methods


def loaded_spec(args: argparse.Namespace):
    from tunescope.commands.options import model_spec_from_args

    return model_spec_from_args(args)


def run(args: argparse.Namespace) -> int:
    from analysis.finetune.config import grid_factors, lr_scaled
    from analysis.models import load_model
    from analysis.runs.db import RunsDB
    from analysis.strategies import sweep_strategies

    executor = executor_from_args(args)
    if args.foreground and executor.executor != "local":
        raise ValueError("--foreground trains here, one run after another: drop --executor ray.")
    if not (args.dry_run or args.foreground):
        from analysis.runs.worker import check_executor

        check_executor(executor)  # before the model loads: an unreachable cluster fails fast
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    refuse_foreign_flags(args, sweep_methods(names), f"the strategies {', '.join(names)}")
    seeds = parse_ints(args.seeds, "--seeds") or (0,)
    loaded = load_model(loaded_spec(args), device=args.device)
    n_layers = loaded.n_layers
    l_star = args.l_star
    if l_star is None and ({"down", "up"} & set(names)):
        l_star = compute_l_star(args, loaded)
        print(f"ℓ* = {l_star} (argmin ν over layers 1..{n_layers})")
    for name in sweep_methods(names):  # a method that needs a choice (heads: --heads FILE)
        spec = method_spec(name)
        needed = [f.flag for f in spec.fields if f.required and getattr(args, f.flat, None) is None]
        if needed:
            raise ValueError(f"The {name} strategy needs {needed[0]}: {spec.missing}.")
    plan = sweep_strategies(names, n_layers, l_star=l_star, all_tops=args.all_tops)
    factors = lr_factors(args.lr_grid)
    configs = [
        (s, lr_scaled(finetune_config(args, method=s.method, layers=s.layers, seed=seed), f))
        for s in plan
        for f in grid_factors(s.method, factors)
        for seed in seeds
    ]
    grid = f" × learning rates ×{{{', '.join(f'{f:g}' for f in factors)}}}" if args.lr_grid else ""
    print(
        f"{len(plan)} strategies{grid} × {len(seeds)} seeds = {len(configs)} runs (L = {n_layers})"
    )
    for strategy in plan:
        print(f"  {strategy.family:<9} {strategy.method:<7} {strategy.label}")
    if args.lr_grid:
        print("  the learning rate of each strategy is chosen on the dev part, never on test")
    payload: dict = {"l_star": l_star, "n_layers": n_layers, "runs": []}
    if args.dry_run:
        payload["runs"] = [
            {
                "family": s.family,
                "method": s.method,
                "label": s.label,
                "seed": c.seed,
                "lr": c.lr,
            }
            for s, c in configs
        ]
        write_json(args.json, payload)
        return 0
    db = RunsDB()
    sweep_id = "sweep-" + time.strftime("%Y%m%d-%H%M%S")
    if not args.foreground:
        ids, workers = launch(args, db, [(cfg, s.family) for s, cfg in configs], sweep_id)
        print(f"queued {counted(len(ids), 'run')} as {sweep_id} ({workers})")
        if args.lr_grid:
            print(
                "once they finish, `runs groups` and the Fine-tune page show the learning rate "
                "each strategy's dev score chose"
            )
        payload["sweep_id"] = sweep_id
        payload["runs"] = [{"run_id": i, "status": "queued"} for i in ids]
        write_json(args.json, payload)
        return 0
    return _run_here(db, configs, sweep_id, loaded, payload, args)


def _run_here(db, configs, sweep_id, loaded, payload, args) -> int:
    from analysis.runs.execute import execute_run
    from tunescope.commands.finetune import summary_line

    failures = 0
    for strategy, cfg in configs:
        run_id = db.enqueue(cfg, sweep_id=sweep_id, family=strategy.family, running_pid=os.getpid())
        bar = StepBar(cfg.steps, f"{strategy.label} seed {cfg.seed}")
        try:
            status = execute_run(db, run_id, cfg, loaded=loaded, on_step=bar.step)
        finally:
            bar.close()
        run = db.get_run(run_id)
        if status == "done":
            print(f"{run_id} {strategy.label} seed {cfg.seed}: {summary_line(run['result'])}")
        else:
            failures += 1
            print(f"{run_id} {strategy.label}: {status} {run['error'] or ''}", file=sys.stderr)
        payload["runs"].append(
            {
                "run_id": run_id,
                "status": status,
                "family": strategy.family,
                "result": run["result"],
            }
        )
    payload["sweep_id"] = sweep_id
    if args.lr_grid:
        payload["lr_choices"] = _lr_choices(db, sweep_id)
    write_json(args.json, payload)
    return 1 if failures else 0


def _lr_choices(db, sweep_id: str) -> list[dict]:
    """Print and return, per strategy, the learning rate its mean dev score chose."""
    from analysis.runs.results import lr_choices, results_table, summarise

    choices = lr_choices(summarise(results_table(db.list_runs(sweep_id=sweep_id))))
    chosen = choices[choices["chosen"]]
    print("learning rate chosen on the dev part (test shown, not used):")
    for row in chosen.itertuples():
        print(
            f"  {row.label}: lr {row.lr:g}, dev {row.dev_score:.4f}, test {row.score:.4f} "
            f"(n_seeds {row.n_seeds})"
        )
    return json_ready(choices.drop(columns=["lr_sibling"]))
