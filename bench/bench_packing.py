"""Sweeps that fill the cores: one CPU worker × every thread vs several workers × fewer threads.

    .venv/bin/python bench/bench_packing.py [--runs 12] [--steps 60] [--workers 1 2]
        [--model minilm] [--batch-size 8] [--max-length 32] [--n-train 128] [--n-eval 64]

The same sweep (``--runs`` runs of MiniLM (1, 3, 3), seeds 0…, short runs) is queued into a fresh
runs database once per packing and trained by the real worker processes that
`analysis.runs.worker.start_workers` starts (``ExecutorChoice(cpu_workers=K)``: K detached
workers, torch on cores // K threads each), so each packing pays its own process starts and model
loads. Timed: from the launch to the last run's finish; runs per hour = runs / that time.

Printed per packing: the total, runs per hour, the median run time (``wall_s``, inside the
engine) and the median step time; then, seed by seed, whether the packings gave the same numbers
(the final train loss and the test score): torch's CPU kernels may sum in a different order with
another thread count. The last line is ``sweep packing: runs_per_hour_ratio=…`` (the most workers
vs one worker).
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
# As ./tasks.sh sets it for the app and its workers: idle OpenMP threads sleep instead of spinning.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from analysis.config import DataSpec, ModelSpec, parse_ints
from analysis.finetune.config import FinetuneConfig
from analysis.runs.db import RunsDB
from analysis.runs.executor import ExecutorChoice
from analysis.runs.launch import launch
from analysis.runs.worker import cpu_packing, worker_pids
from analysis.workspace import Workspace


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} cores"


def sweep(args: argparse.Namespace) -> list[tuple[FinetuneConfig, None]]:
    return [
        (
            FinetuneConfig(
                model=ModelSpec(args.model),
                data=DataSpec(args.data),
                method="layers",
                layers=parse_ints(args.layers, "--layers"),
                steps=args.steps,
                batch_size=args.batch_size,
                max_length=args.max_length,
                n_train=args.n_train,
                n_eval=args.n_eval,
                eval_every=args.steps,
                seed=seed,
            ),
            None,
        )
        for seed in range(args.runs)
    ]


def train(args: argparse.Namespace, root: Path, workers: int) -> dict:
    """Queue the sweep at ``root`` and let ``workers`` CPU workers train it; wait for the end."""
    root.mkdir(parents=True)
    db = RunsDB(Workspace(root))
    os.environ["TUNESCOPE_WORKER_IDLE_S"] = "2"
    start = time.perf_counter()
    launched = launch(db, sweep(args), ExecutorChoice(cpu_workers=workers), sweep_id="bench")
    while True:
        frame = db.list_runs(sweep_id="bench")
        if frame["status"].isin(["done", "failed", "cancelled"]).all():
            break
        time.sleep(0.5)
    total = time.perf_counter() - start
    bad = frame[frame["status"] != "done"]
    if len(bad):
        raise SystemExit(f"run {bad.iloc[0]['id']} {bad.iloc[0]['status']}")
    while worker_pids(root):  # the workers leave after their idle timeout: not timed
        time.sleep(0.5)
    numbers = {}
    for _, run in frame.iterrows():
        losses = db.steps(run["id"], kind="train")
        last = losses[losses["key"] == "loss"].sort_values("step")["value"].iloc[-1]
        numbers[int(run["seed"])] = (float(last), float(run["score"]))
    return {
        "total": total,
        "per_hour": args.runs / total * 3600,
        "wall": statistics.median(frame["wall_s"]),
        "step": statistics.median(frame["step_time_s"]),
        "devices": sorted(frame["device"].unique()),
        "numbers": numbers,
        "workers": launched.workers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    # 60 steps (≈ 5 s a run here): at 15 (1.7 s a run) each packing's worker start and model
    # loads are a third of the sweep, and the ratio measured them more than the packing (1.41×).
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--layers", default="1,3,3")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--n-train", type=int, default=128)
    parser.add_argument("--n-eval", type=int, default=64)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    from analysis.runs.worker import estimate_params

    auto = cpu_packing(estimate_params(ModelSpec(args.model)))
    print(
        f"{args.runs} runs x {args.steps} steps, {args.model} layers {args.layers}, batch "
        f"{args.batch_size}, length {args.max_length}, n_train {args.n_train}; {cores} cores; "
        f"the automatic packing for this model: {auto[0]} worker(s) x {auto[1]} thread(s); "
        f"{load_average()}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="tsbench-packing-") as tmp:
        for workers in args.workers:
            r = train(args, Path(tmp) / f"w{workers}", workers)
            results[workers] = r
            threads = cpu_packing(None, cores, workers)[1]
            print(
                f"    {workers} worker(s) x {threads} thread(s): {r['total']:.1f} s, "
                f"{r['per_hour']:.0f} runs/hour; run wall_s median {r['wall']:.1f} s, step "
                f"{r['step'] * 1000:.0f} ms; devices {', '.join(r['devices'])}; {load_average()}",
                flush=True,
            )
    one, most = results[min(args.workers)], results[max(args.workers)]
    same, diffs = 0, []
    for seed, (loss, score) in one["numbers"].items():
        other_loss, other_score = most["numbers"][seed]
        same += (loss, score) == (other_loss, other_score)
        diffs.append((abs(loss - other_loss), abs(score - other_score)))
    print(
        f"    same numbers per seed ({min(args.workers)} vs {max(args.workers)} workers): "
        f"{same} of {len(diffs)} seeds identical; largest |Δ final train loss| "
        f"{max(d[0] for d in diffs):.2e}, largest |Δ test score| {max(d[1] for d in diffs):.2e}"
    )
    print(f"sweep packing: runs_per_hour_ratio={most['per_hour'] / one['per_hour']:.2f}")


if __name__ == "__main__":
    main()
