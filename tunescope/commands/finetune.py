"""``finetune``: one fine-tuning run in the foreground, recorded in the runs database."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from analysis.finetune.registry import method_names, method_spec
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

NAME = "finetune"
HELP = "fine-tune one strategy (layers, heads, adapters, LoRA, BitFit…) and record the run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_data(parser)
    parser.add_argument("--method", default="full", choices=method_names())
    parser.add_argument(
        "--layers", default=None, help="ℓ_bottom,ℓ_top,ℓ_cls, e.g. 1,3,3 (method layers)"
    )
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    add_training_options(parser)
    parser.add_argument("--json", default=None, help="write the result as JSON here ('-': stdout)")
    parser.add_argument(
        "--queue",
        action="store_true",
        help="queue the run for the background worker instead of running it here "
        "(with --executor ray the run trains on the cluster either way; without --queue this "
        "command follows it to its end)",
    )


def run(args: argparse.Namespace) -> int:
    from analysis.runs.db import RunsDB
    from analysis.runs.execute import execute_run

    refuse_foreign_flags(args, {args.method})
    layers = parse_ints(args.layers, "--layers")
    cfg = finetune_config(args, method=args.method, layers=layers, seed=args.seed)
    if method_spec(cfg.method).canonical is not None:  # (1, L, L) is full: one name, one group
        from analysis.finetune.config import canonical
        from analysis.models import n_layers_of

        n_layers = n_layers_of(cfg.model)
        cfg = canonical(cfg, n_layers) if n_layers else cfg
    executor = executor_from_args(args)  # validates the executor flags before anything runs
    db = RunsDB()
    if args.queue or executor.executor == "ray":
        (run_id,), workers = launch(args, db, [(cfg, None)])
        if args.queue:
            print(f"queued run {run_id} ({workers}); follow it with `runs show {run_id}`")
            write_json(args.json, {"run_id": run_id, "status": "queued"})
            return 0
        print(f"run {run_id} queued for the Ray cluster ({workers})", file=sys.stderr)
        bar = StepBar(cfg.steps, f"{run_id} {db.get_run(run_id)['label']}")
        try:
            with sigterm_as_ctrl_c():
                status = follow(db, run_id, bar)
        finally:
            bar.close()
    else:
        from analysis.runs.worker import default_device

        # The device column names where it trains, as a worker's runs do.
        run_id = db.enqueue(cfg, running_pid=os.getpid(), device=cfg.device or default_device())
        bar = StepBar(cfg.steps, f"{run_id} {db.get_run(run_id)['label']}")
        try:
            with sigterm_as_ctrl_c():
                status = execute_run(db, run_id, cfg, on_step=bar.step, on_progress=bar.message)
        finally:
            bar.close()
    run = db.get_run(run_id)
    if status != "done":
        print(f"run {run_id} {status}: {run['error'] or ''}".rstrip(": "), file=sys.stderr)
        return 130 if status == "cancelled" else 1
    result = dict(run["result"])
    result.setdefault("config", run["config"])
    result["run_id"] = run_id
    result["curves"] = db.curves(run_id)
    print(f"run {run_id}: {summary_line(result)}")
    write_json(args.json, result)
    return 0


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (``kill``, a job scheduler) stops the foreground run as Ctrl-C does: the run is
    cancelled (here, or on the Ray cluster) instead of being left behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def follow(db, run_id: str, bar: StepBar, poll_s: float = 0.5, cancel_wait_s: float = 60.0) -> str:
    """Show a run that a worker trains (on a Ray cluster) until it ends; returns its status.

    Ctrl-C asks the worker to cancel it, waits for the cancel to be recorded and re-raises.
    A queue that no Ray worker serves any more (it could not connect) is a ValueError: the run
    stays queued.
    """
    from analysis.runs.queue import FINAL_STATUSES
    from analysis.runs.worker import RAY, worker_pid

    root = db.workspace.root
    try:
        while True:
            run = db.get_run(run_id)
            if run["status"] in FINAL_STATUSES:
                return run["status"]
            if run["status"] == "queued" and worker_pid(root, RAY) is None:
                raise ValueError(
                    f"The Ray worker ended without taking run {run_id} (see "
                    f"{root / 'worker.log'}); the run stays queued for the next worker."
                )
            last = db.latest_steps([run_id])
            if not last.empty:
                bar.step(int(last["step"].iloc[0]), {"loss": float(last["loss"].iloc[0])})
            elif run["message"]:
                bar.message(float(run["progress"] or 0.0), run["message"])
            time.sleep(poll_s)
    except KeyboardInterrupt:
        db.request_cancel(run_id)
        deadline = time.monotonic() + cancel_wait_s
        while time.monotonic() < deadline:
            if db.get_run(run_id)["status"] in FINAL_STATUSES:
                break
            time.sleep(poll_s)
        raise


def summary_line(result: dict) -> str:
    """``accuracy 0.8125 on test; 1,234 of 22,000 parameters trained; 12.3 s; peak 512 MB``."""

    def num(key: str, spec: str) -> str:
        value = result.get(key)
        return format(value, spec) if isinstance(value, (int, float)) else "?"

    return (
        f"{result.get('metric', 'score')} {num('score', '.4f')} on test; "
        f"{num('n_trainable', ',')} of {num('n_params', ',')} parameters trained; "
        f"{num('wall_s', '.1f')} s; peak memory {num('peak_mem_mb', '.0f')} MB"
    )
