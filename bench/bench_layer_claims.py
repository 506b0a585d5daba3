"""What the layer claims (X1–X3) cost at the new defaults against the old ones (issue 19: at most
3×), side by side on the same machine, and where the time goes.

    python bench/bench_layer_claims.py --before /work/main --data bench/heldout/sms-spam.csv

``--before`` is a checkout of the old code (its own ``.venv``): ``claims --only X1,X2,X3
--repeats 5`` there (one sample, R = 5, the probe refit per repeat) and ``claims --only X1,X2,X3``
here (S = 3 samples, R = 50, the probe scored by 5-fold CV predictions and resampled, not refit),
each with a fresh cache, alternating, ``--rounds`` times; medians and the ratio are printed. Then
one in-process run of the new pipeline with a clock around each part: extraction (S · N examples
per pooling), the mean-pooling table per sample (ν, CCA, ϱ and the cross-validated probe), and
the repeats per sample and pooling (ν and the resampled probe predictions; ν only for the first
token).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_cli(code: Path, python: Path, args: list[str], cache: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + system) of one ``claims`` call in a fresh process. The
    CPU time is the steadier figure on a shared machine (wall time grows with the load)."""
    env = {**os.environ, "TUNESCOPE_CACHE": cache, "PYTHONPATH": str(code)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(python), "-m", "tunescope", "claims", *args], env=env, cwd=cache,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def breakdown(data: list[str], n: int, seed: int) -> dict[str, float]:
    import dataclasses

    from analysis import claims
    from analysis.cache import DiskCache
    from analysis.claims.layers import sample_block, train_size
    from analysis.config import SampleSpec
    from analysis.extract import extract_states
    from analysis.layers.repeats import cached_layer_repeats
    from analysis.layers.table import cached_layer_metrics
    from analysis.models import load_model
    from tunescope.commands.options import data_spec_from_args

    parser = argparse.ArgumentParser()
    from tunescope.commands.options import add_model_data

    add_model_data(parser)
    ns = parser.parse_args(data)
    cfg = claims.ClaimsConfig(data=data_spec_from_args(ns), only=("X1", "X2", "X3"), n=n,
                              sample_seed=seed)  # fmt: skip
    clock = {"extraction": 0.0, "tables (mean pooling)": 0.0, "repeats": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        cache = DiskCache(tmp)
        os.environ["TUNESCOPE_CACHE"] = tmp
        loaded = load_model(cfg.model)
        mode, draws = claims.layer_samples(cfg, train_size(cfg))
        size = cfg.samples * n if mode == "disjoint" else n
        for pooling in ("mean", "first"):
            done: dict[int, object] = {}
            for s, block in draws:
                t = time.perf_counter()
                if s not in done:
                    extract = dataclasses.replace(cfg.extract_config(pooling),
                                                  sample=SampleSpec(n=size, seed=s))  # fmt: skip
                    done[s] = extract_states(extract, loaded=loaded)
                clock["extraction"] += time.perf_counter() - t
                states = sample_block(done[s], block, f"block{block.start}-{block.stop}")
                t = time.perf_counter()
                if pooling == "mean":
                    cached_layer_metrics(states, seed=s, cache=cache)
                clock["tables (mean pooling)"] += time.perf_counter() - t
                t = time.perf_counter()
                cached_layer_repeats(states, seed=s, repeats=cfg.repeats, cache=cache,
                                     which=claims.CLAIM_METRICS if pooling == "mean" else ("nu",))  # fmt: skip
                clock["repeats"] += time.perf_counter() - t
        clock["samples"] = f"{cfg.samples} {mode}"  # type: ignore[assignment]
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="checkout of the old code (with .venv)")
    parser.add_argument("--data", default="bench/heldout/sms-spam.csv")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    data = ["--data", str(Path(args.data).resolve())]
    if args.data.endswith((".csv", ".tsv", ".jsonl", ".parquet")):
        data += ["--text-col", "text", "--label-col", "label"]
    common = [*data, "--only", "X1,X2,X3", "--n", str(args.n), "--seed", str(args.seed)]
    before, after = [], []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            before.append(timed_cli(Path(args.before), Path(args.before) / ".venv/bin/python",
                                    [*common, "--repeats", "5"], tmp))  # fmt: skip
        print(f"round {r + 1}: before {before[-1][0]:.1f} s wall, {before[-1][1]:.1f} s CPU",
              flush=True)  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            after.append(timed_cli(ROOT, Path(sys.executable), common, tmp))
        print(f"round {r + 1}: after {after[-1][0]:.1f} s wall, {after[-1][1]:.1f} s CPU",
              flush=True)  # fmt: skip
    print(
        f"claims --only X1,X2,X3, N = {args.n:,}, {args.data}, {args.rounds} round(s), fresh caches:"
    )
    for i, what in enumerate(("wall", "CPU")):
        old = statistics.median(b[i] for b in before)
        new = statistics.median(a[i] for a in after)
        print(f"  {what:4s}: before (R = 5, one sample) {old:7.1f} s; after (R = 50, S = 3) "
              f"{new:7.1f} s; ratio {new / old:.2f}× (goal ≤ 3×)")  # fmt: skip
    sys.path.insert(0, str(ROOT))
    clock = breakdown(data, args.n, args.seed)
    print("where the time goes (after, in process):")
    for part, seconds in clock.items():
        print(f"  {part:24s} {seconds if isinstance(seconds, str) else f'{seconds:7.1f} s'}")


if __name__ == "__main__":
    main()
