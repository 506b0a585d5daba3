"""``claims``: the papers' claims (X1–X4, H1–H2, S1–S2) re-measured on this model and data, each
with our number, its interval and a verdict (`analysis.claims`)."""

from __future__ import annotations

import argparse
import sys
import time

from analysis.words import counted
from tunescope.commands.options import (
    TqdmProgress,
    add_executor_options,
    add_model_data,
    add_seeds_flag,
    add_setting_flag,
    data_spec_from_args,
    executor_from_args,
    model_spec_from_args,
    seeds_of,
    write_json,
)

NAME = "claims"
HELP = "re-measure the papers' claims on this model and data: ours ± interval and a verdict"
LAZY = True  # its options come from ClaimsConfig, whose package imports torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from analysis.claims import ClaimsConfig
    from analysis.config import help_of

    add_model_data(parser)
    parser.add_argument("--only", default=None, help=help_of(ClaimsConfig, "only"))
    add_seeds_flag(parser, ClaimsConfig)
    for name in ("steps", "batch_size", "max_length", "n_train", "n_eval", "eval_every", "n"):
        add_setting_flag(parser, name, ClaimsConfig, type=int)
    add_setting_flag(parser, "sample_seed", ClaimsConfig, "--seed", type=int)
    for name in ("repeats", "samples", "k", "heads_n"):
        add_setting_flag(parser, name, ClaimsConfig, type=int)
    parser.add_argument("--json", default=None, help="write the claims as JSON here ('-': stdout)")
    parser.add_argument(
        "--report", default=None, help="write a Markdown report here, figures (HTML) beside it"
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="queue the missing runs and report what is there now instead of waiting for them",
    )
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between checks")
    add_executor_options(parser)


def config_from_args(args: argparse.Namespace):
    from analysis.claims import ClaimsConfig, parse_only

    return ClaimsConfig(
        model=model_spec_from_args(args), data=data_spec_from_args(args),
        only=parse_only(args.only), n=args.n, sample_seed=args.seed, repeats=args.repeats,
        samples=args.samples,
        max_length=args.max_length, seeds=seeds_of(args.seeds), steps=args.steps,
        batch_size=args.batch_size, n_train=args.n_train, n_eval=args.n_eval,
        eval_every=args.eval_every, k=args.k, heads_n=args.heads_n,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from analysis import claims
    from analysis.models import load_model
    from analysis.runs.db import RunsDB
    from analysis.runs.worker import check_executor

    cfg = config_from_args(args)
    # The executor flags, and whether their executor can work now, before the long preparation.
    executor = executor_from_args(args)
    check_executor(executor)
    loaded = load_model(cfg.model)
    if cfg.layer_claims:
        seconds = claims.layer_claims_estimate(cfg, loaded.d_model, loaded.n_layers)
        print(
            f"layer claims {', '.join(cfg.layer_claims)}: {cfg.samples} samples × N = {cfg.n:,}, "
            f"R = {cfg.repeats} repeats each: about {seconds:.0f} s before anything is cached",
            file=sys.stderr,
        )
    bar = TqdmProgress("layer repeats and head statistics")
    try:
        inputs = claims.prepare(cfg, loaded, progress=bar)
    finally:
        bar.close()
    db = RunsDB()
    sweep_id = "claims-" + time.strftime("%Y%m%d-%H%M%S")
    planned = _drive(db, cfg, inputs, sweep_id, executor, wait=not args.no_wait, poll=args.poll)
    runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
    results = claims.evaluate(cfg, inputs, planned, runs)
    write_json(args.json, claims.claims_json(cfg, results))
    if args.report:
        # The report draws with the Paper check page's figure builders (plotly), imported here
        # only, so that the library and `--help` stay free of plotly.
        from ui.claims.report import write_report

        metric = str(runs["metric"].dropna().iloc[0]) if runs["metric"].notna().any() else "score"
        written = write_report(cfg, results, args.report, metric)
        print(
            f"report written to {written[0]} ({counted(len(written) - 1, 'file')} beside it)",
            file=sys.stderr if args.json == "-" else sys.stdout,  # stdout: the JSON alone
        )
    if args.json != "-":
        table = claims.claims_table(results).drop(columns=["claim", "paper", "detail"])
        print(table.to_string(index=False))
        if args.json:
            print(f"JSON written to {args.json}")
    return 0


def _drive(db, cfg, inputs, sweep_id: str, executor, wait: bool, poll: float) -> list:
    """Plan, queue what is missing (each planned run at most once here: a run that fails is not
    retried in a loop), write the disable files once the trajectory run is done, and — with
    ``wait`` — poll until no planned run is queued or running. Returns the final plan.

    What it says goes to stderr, so that stdout holds the JSON alone with ``--json -``."""
    from analysis import claims

    queued: set[tuple[str, int]] = set()
    announced = False
    while True:
        db.reap_dead()
        runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
        source = claims.source_run(cfg, runs) if {"S1", "S2"} & set(cfg.only) else None
        source_id = source["id"] if source and source["status"] == "done" else None
        if source_id and "S2" in cfg.only and not _has_disable_files(db.workspace, source_id):
            path, n_zero = claims.write_disable_files(db, source_id, cfg.seeds)
            print(
                f"disable experiment: {n_zero:,} outlier weights of run {source_id} → {path}",
                file=sys.stderr,
            )
        planned = claims.plan_runs(cfg, inputs, source=source_id, root=db.workspace.root)
        missing = [p for p in claims.missing_runs(planned, runs) if p.key not in queued]
        if missing:
            seconds, how = claims.estimate_seconds(missing, runs)
            estimate = "?" if seconds is None else f"{seconds / 60:.0f} min"
            print(
                f"queueing {counted(len(missing), 'run')}, about {estimate} of training ({how})",
                file=sys.stderr,
            )
            claims.queue_runs(db, missing, sweep_id, executor)
            queued.update(p.key for p in missing)
            continue
        status = claims.run_status(planned, runs)
        counts = {
            s: sum(v["status"] == s for v in status.values()) for s in ("done", "running", "queued")
        }
        active = counts["running"] + counts["queued"]
        if not wait or not active:
            return planned
        if not announced:
            print(
                f"waiting for {counted(active, 'run')}; Ctrl-C stops waiting (the runs go on)",
                file=sys.stderr,
            )
            announced = True
        print(
            f"  {counts['done']} done, {counts['running']} running, {counts['queued']} queued "
            f"of {len(planned)} planned",
            file=sys.stderr,
        )
        claims.queue_runs(db, [], sweep_id, executor)  # keeps a worker serving the queued runs
        time.sleep(poll)


def _has_disable_files(workspace, source_id: str) -> bool:
    """Whether the disable experiment's files of trajectory run ``source_id`` are written."""
    return workspace.outlier_file(source_id).is_file()
