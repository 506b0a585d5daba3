"""``subspace``: spectrum and outlier dimensions of a recorded fine-tuning trajectory (paper 003)."""

from __future__ import annotations

import argparse

from tunescope.commands.options import TqdmProgress, write_json

NAME = "subspace"
HELP = "spectrum and outlier weights of a run's fine-tuning trajectory; disable-experiment files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run",
        required=True,
        help="run id (or a trajectory folder) recorded with --trajectory-every",
    )
    parser.add_argument(
        "--centre", action="store_true", help="centre the trajectory's rows instead of θ_j − θ_0"
    )
    parser.add_argument("--sigma", type=float, default=3.0, help="outlier threshold in std units")
    parser.add_argument("--top", type=int, default=10, help="outliers listed per layer")
    parser.add_argument("--json", default=None, help="write the report as JSON here ('-': stdout)")
    parser.add_argument(
        "--write-disable",
        default=None,
        metavar="FILE",
        help="write a zero_weights file of every outlier (for finetune --zero-weights)",
    )
    parser.add_argument(
        "--random",
        action="store_true",
        help="with --write-disable: as many random weights per layer instead (the control)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --random")
    parser.add_argument("--cache", default=None, help="cache folder (default: ./cache)")


def run(args: argparse.Namespace) -> int:
    from analysis.runs.db import RunsDB
    from analysis.runs.execute import trajectory_folder
    from analysis.subspace.outliers import outlier_positions_file, random_positions_like
    from analysis.subspace.report import analyse_trajectory
    from analysis.subspace.trajectory import open_trajectory

    if args.sigma <= 0 or args.top < 1:
        raise ValueError("--sigma must be positive and --top at least 1.")
    if args.random and not args.write_disable:
        raise ValueError("--random only applies with --write-disable FILE.")
    traj = open_trajectory(trajectory_folder(RunsDB(), args.run))
    bar = TqdmProgress("subspace")
    try:
        report = analyse_trajectory(
            traj, centre=args.centre, n_sigma=args.sigma, top_k=args.top, progress=bar
        )
    finally:
        bar.close()
    print(
        f"trajectory {traj.folder}: t = {traj.t} snapshots ({traj.dtype}, "
        f"{traj.bytes_per_snapshot / 1e6:.1f} MB each)"
    )
    print(f"{'layer':>5} {'n_params':>10} {'rank':>5} {'90%':>4} {'outliers':>9}  top outlier")
    for sp, lo in zip(report.spectra, report.outliers, strict=True):
        top = lo.top[0] if lo.top else None
        where = (
            f"{top['kind']} {top['param']}[{top['row']}, {top['col']}] = {top['value']:+.3g}"
            if top
            else "-"
        )
        print(
            f"{sp.layer:>5} {sp.n_params:>10,} {sp.rank:>5} {sp.n_directions(0.9):>4} "
            f"{lo.n_outliers:>9,}  {where}"
        )
    recurring = [r for r in report.recurring if r["n_layers"] > 1]
    if recurring:
        text = ", ".join(f"{r['hidden_dim']} ({r['n_layers']} layers)" for r in recurring[:8])
        print(f"recurring hidden dims: {text}")
    payload = report.to_dict()
    payload["run"] = args.run
    if args.write_disable:
        if args.random:
            positions = random_positions_like(traj, report.outliers, args.seed, args.write_disable)
            count = sum(map(len, positions.values()))
        else:
            count = outlier_positions_file(traj, report.outliers, args.write_disable)["n_weights"]
        what = "random" if args.random else "outlier"
        print(f"wrote {count:,} {what} weights to zero to {args.write_disable}")
        payload["disable"] = {"path": args.write_disable, "random": args.random, "n_weights": count}
    write_json(args.json, payload)
    return 0
