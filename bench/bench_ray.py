"""The Ray executor against the local worker: the same queue of runs, side by side.

    .venv/bin/python bench/bench_ray.py [--runs 8] [--steps 20] [--ray-cpus 2] [--model minilm]
        [--method layers --layers 1,3,3] [--batch-size 8] [--max-length 32] [--n-train 256] [--n-eval 64]

Queues ``--runs`` runs (seeds 0…) of one config into a fresh runs database and trains them twice:
with the local worker's loop (`analysis.runs.worker.serve`, one run at a time, torch on every
core) and with the Ray executor on a local Ray cluster of ``--ray-cpus`` CPUs (one CPU per run,
so ``--ray-cpus`` runs at once). Both go through the same loop the worker process runs, in this
process, so the process start of a worker is not counted (a few seconds, once).

Printed per executor: the total wall-clock (first claim → last result), the median of the runs'
step time and own training time (``wall_s``: data, steps, scoring, measured inside the engine) and the per-run
overhead = (finished − started in the runs database) − ``wall_s``: for the local worker the model
load of its first run; for Ray the task's scheduling, a Ray worker process starting and importing
torch (once per process), the model load there, and the events' trip back. The Ray cluster's own
start is printed apart (it happens once per worker, or never when a cluster is running).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# As ./tasks.sh sets it for the app and its workers: idle OpenMP threads sleep instead of spinning.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from analysis.config import DataSpec, ModelSpec, parse_ints
from analysis.finetune.config import FinetuneConfig
from analysis.runs.db import RunsDB
from analysis.runs.executor import RAY
from analysis.runs.worker import serve
from analysis.workspace import Workspace


def queue(db: RunsDB, args: argparse.Namespace, tag: str) -> list[str]:
    layers = parse_ints(args.layers, "--layers") if args.method == "layers" else None
    ids = []
    for seed in range(args.runs):
        cfg = FinetuneConfig(
            model=ModelSpec(args.model),
            data=DataSpec(args.data),
            method=args.method,
            layers=layers,
            steps=args.steps,
            batch_size=args.batch_size,
            max_length=args.max_length,
            n_train=args.n_train,
            n_eval=args.n_eval,
            eval_every=args.steps,
            seed=seed,
            device="cpu",
        )
        ids.append(db.enqueue(cfg, sweep_id=f"bench-{tag}"))
    return ids


def measure(db: RunsDB, ids: list[str]) -> dict[str, float]:
    runs = [db.get_run(run_id) for run_id in ids]
    bad = [r for r in runs if r["status"] != "done"]
    if bad:
        raise SystemExit(f"run {bad[0]['id']} {bad[0]['status']}: {bad[0]['error']}")
    frame = db.list_runs(sweep_id=runs[0]["sweep_id"])
    started = frame["started"].map(lambda t: t.timestamp())
    finished = frame["finished"].map(lambda t: t.timestamp())
    overhead = (finished - started) - frame["wall_s"]
    return {
        "total": float(finished.max() - started.min()),
        "wall": float(statistics.median(frame["wall_s"])),
        "step": float(statistics.median(frame["step_time_s"])),
        "overhead_median": float(overhead.median()),
        "overhead_max": float(overhead.max()),
        "overhead_mean": float(overhead.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--method", default="layers")
    parser.add_argument("--layers", default="1,3,3")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--n-train", type=int, default=256)
    parser.add_argument("--n-eval", type=int, default=64)
    args = parser.parse_args()

    import ray

    from analysis.runs.ray_executor import LOCAL_CLUSTER, connect

    with tempfile.TemporaryDirectory(prefix="tsbench-") as tmp:
        root = Path(tmp) / "cache"
        root.mkdir()
        db = RunsDB(Workspace(root))

        local_ids = queue(db, args, "local")
        assert serve(root, device="cpu", idle_timeout=0.0, poll_s=0.05) == args.runs
        local = measure(db, local_ids)

        t0 = time.perf_counter()
        connect(LOCAL_CLUSTER, num_cpus=args.ray_cpus, temp_dir=str(Path(tmp) / "ray"))
        cluster_start = time.perf_counter() - t0
        try:
            ray_ids = queue(db, args, "ray")
            assert serve(root, idle_timeout=0.0, poll_s=0.05, executor=RAY) == args.runs
            remote = measure(db, ray_ids)
        finally:
            ray.shutdown()

    print(
        f"{args.runs} runs × {args.steps} steps: {args.model} {args.method} {args.layers}, "
        f"batch {args.batch_size}, max length {args.max_length}, CPU"
    )
    print(f"{'':34}{'local worker':>16}{f'Ray, {args.ray_cpus} CPUs':>16}")
    rows = [
        ("runs at once", "1", str(args.ray_cpus)),
        ("total wall-clock (s)", f"{local['total']:.1f}", f"{remote['total']:.1f}"),
        ("run's own time wall_s, median (s)", f"{local['wall']:.2f}", f"{remote['wall']:.2f}"),
        ("step time, median (s)", f"{local['step']:.3f}", f"{remote['step']:.3f}"),
        (
            "overhead per run, median (s)",
            f"{local['overhead_median']:.2f}",
            f"{remote['overhead_median']:.2f}",
        ),
        (
            "overhead per run, mean / max (s)",
            f"{local['overhead_mean']:.2f} / {local['overhead_max']:.1f}",
            f"{remote['overhead_mean']:.2f} / {remote['overhead_max']:.1f}",
        ),
    ]
    for name, a, b in rows:
        print(f"{name:34}{a:>16}{b:>16}")
    print(
        f"total wall-clock ratio Ray / local: {remote['total'] / local['total']:.2f}× "
        f"(Ray cluster start, once: {cluster_start:.1f} s, not included)"
    )


if __name__ == "__main__":
    main()
