"""Scale: streamed extraction and streamed layer metrics, time and peak memory (issue #14).

    .venv/bin/python bench/bench_scale.py [--part a|b|all] [--n-a 20000] [--n-b 100000]
        [--n-small 10000 30000] [--rounds 2] [--workdir DIR]

(a) **Real model.** MiniLM on N = 20,000 movie snippets (the 10,568 snippets repeated, with a
    counter appended so that no two texts are equal): `extract_states` (the windowed forward,
    pooling of every layer, the streamed cache write with its hashes and fsync) against a bare
    forward over the same windows and batches (no hidden states kept, nothing pooled or written).
    Rounds alternate the order (bare first, then ours first), each stage in a fresh process;
    medians are reported. Then the layer
    metrics of those states by both routes (in memory and streamed), which must agree.
(b) **BERT-large shape, synthetic states.** 25 hidden-state layers × d = 1,024 at N = 100,000 (and
    at N = 10,000, to show that memory does not follow N). The states come from a SYNTHETIC SOURCE
    — class signal + anisotropic noise + a large offset, generated window by window with
    torch.randn — not from a model (a randomly initialised BERT-large would take hours on this
    CPU and prove nothing more about the pipeline). They go through the real pieces: the streamed
    cache writer (`analysis.extract.write_states`, `DiskCache.get_or_write`), the cache's load (its
    content check: the first load in a process hashes the file), and the layer table's streamed
    route (`analysis.layers.table.cached_layer_metrics`).

On a machine shared with other sessions, wall times swing with their load; each extraction stage
also reports its CPU time (all threads), whose ratio is the steadier comparison.

Every measured stage runs in a fresh subprocess and reports its own peak resident set size
(``getrusage(RUSAGE_SELF).ru_maxrss``: it includes the interpreter, torch and everything the stage
touched, memory-mapped pages too), plus the peak of each worker process it has started (the
layer table's, `analysis.compute.Workers`). The page cache is not part of it.

Goals: extraction ≤ 1.1× the bare forward; peak RSS ≤ 3 GB at N = 100,000 × 25 × 1,024; the layer
metrics at that size ≤ 60 s on this CPU, linear in N (part (b) runs N = 10,000, 30,000 and
100,000). The Gram phase's achieved GFLOP/s (rows · d² flops per cell, a symmetric rank-k update)
is printed next to the machine's `X.T @ X` (float64, 8,192 × 1,024, on every core's BLAS thread),
measured in the same process right before and after the metrics. States in a file share their
layers between processes (one BLAS thread each: `analysis.layers.streamed`), so the Gram phase's
seconds are summed over them: its rate a core, and that times the processes (the rate the
machine got, their Gram phases running side by side) against the limit. The last line is
``scale: n=… layers=… d=… metrics_s=… peak_rss_mb=… gram_gflops=… limit_gflops=…``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Idle OpenMP threads sleep instead of spinning (as ./tasks.sh sets it): on a shared, loaded
# machine spinning threads slowed a MiniLM forward 50-fold.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SYNTHETIC_LAYERS, SYNTHETIC_D = 24, 1024  # BERT-large: 24 layers + embeddings, d = 1,024
# Class signal per layer: 0.1 + 1.5 · sin(π ℓ / 25) along a random unit direction; the probe then
# scores ≈ 0.6 at layer 1 and ≈ 0.98 mid-network (real BERT states on SST-2: ≈ 0.8-0.9).
STRENGTH = (0.1, 1.5)


def peak_rss_mb() -> float:
    """This stage's peak RSS plus its live worker processes' (the layer table's,
    `analysis.compute.Workers`: each one's own peak, VmHWM; a sum of peaks, so an upper bound)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    helpers = 0.0
    for task in Path("/proc").glob(f"{os.getpid()}/task/*/children"):
        for pid in task.read_text().split():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    helpers += int(line.split()[1]) / 1024
    return own + helpers


def emit(result: dict) -> None:
    """A stage's result: one JSON line, the last thing it prints."""
    print(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}), flush=True)


# --- (a) MiniLM ------------------------------------------------------------------------------------


def snippets_csv(path: Path, n_rows: int) -> Path:
    """The movie snippets repeated to ``n_rows`` rows (texts made distinct by a counter)."""
    import pandas as pd

    from analysis.config import DataSpec
    from analysis.data import load_data

    data = load_data(DataSpec("movie-snippets"))
    rows = pd.concat([p[["text", "label"]] for p in data.parts.values()], ignore_index=True)
    reps = -(-n_rows // len(rows))
    big = pd.concat([rows] * reps, ignore_index=True).iloc[:n_rows].copy()
    big["text"] = [f"{t} ({i})" for i, t in enumerate(big["text"])]
    big.to_csv(path, index=False)
    return path


def stage_bare(args) -> None:
    """The bare forward over the windows and batches `extract_states` would use."""
    import torch

    from analysis.config import DataSpec, ModelSpec, SampleSpec
    from analysis.data import load_data, sample
    from analysis.extract import iter_encoded_batches, model_inputs, texts_of, window_rows
    from analysis.models import load_model

    loaded = load_model(ModelSpec("minilm"), device="cpu")
    rows = sample(load_data(DataSpec(args.csv)), SampleSpec(n=args.n))
    texts, _ = texts_of(rows)
    per_window = window_rows(loaded.n_layers + 1, loaded.d_model)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for first in range(0, len(texts), per_window):
            for batch in iter_encoded_batches(
                loaded.tokenizer, texts[first : first + per_window], None, 128, 32
            ):
                loaded.model(**model_inputs(loaded.model, batch.inputs))
    emit(
        {
            "seconds": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu,
            "n": len(texts),
        }
    )


def stage_extract(args) -> None:
    """`extract_states` on a fresh cache: windowed forward, pooling, streamed write, hashes."""
    from analysis.cache import DiskCache
    from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
    from analysis.extract import extract_states
    from analysis.models import load_model

    loaded = load_model(ModelSpec("minilm"), device="cpu")
    cfg = ExtractConfig(ModelSpec("minilm"), DataSpec(args.csv), SampleSpec(n=args.n))
    start, cpu = time.perf_counter(), time.process_time()
    states = extract_states(cfg, cache=DiskCache(args.cache), loaded=loaded)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    assert not states.meta["cache_hit"]
    emit({"seconds": seconds, "cpu_s": cpu_s, "n": states.n, "layers": states.n_layers + 1,
          "d": states.d_model})  # fmt: skip


def stage_metrics_a(args) -> None:
    """Layer metrics of the MiniLM states by both routes, side by side."""
    import numpy as np

    from analysis.cache import DiskCache
    from analysis.compute import default_executor
    from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
    from analysis.extract import extract_states
    from analysis.layers.streamed import streamed_metrics_of
    from analysis.layers.table import layer_metrics

    cfg = ExtractConfig(ModelSpec("minilm"), DataSpec(args.csv), SampleSpec(n=args.n))
    states = extract_states(cfg, cache=DiskCache(args.cache))
    executor = default_executor()  # the CLI's
    t0 = time.perf_counter()
    memory = layer_metrics(states.stored, states.labels, states.metric, executor=executor)
    t1 = time.perf_counter()
    stream = streamed_metrics_of(states, 0, 2, None, executor)
    t2 = time.perf_counter()
    diff = {
        m: float(np.max(np.abs(stream[m] - memory[m]) / np.maximum(np.abs(memory[m]), 1e-300)))
        for m in ("nu", "cca", "rank", "probe")
    }
    emit({"memory_s": t1 - t0, "streamed_s": t2 - t1, "max_rel_diff": diff,
          "timing": stream.attrs.get("timing")})  # fmt: skip


# --- (b) BERT-large shape, synthetic states --------------------------------------------------------


def synthetic_windows(n: int, labels, seed: int = 0):
    """SYNTHETIC pooled states, (25, M, 1,024) float32 windows: per layer an offset with a few
    outlier dimensions, a class signal that peaks mid-network, and anisotropic noise (64 shared
    latent directions plus per-dimension scales spanning two decades)."""
    import math

    import torch

    from analysis.extract import window_rows

    gen = torch.Generator().manual_seed(seed)
    n_states, d = SYNTHETIC_LAYERS + 1, SYNTHETIC_D
    offset = torch.randn(n_states, d, generator=gen) * 2
    offset[:, :3] *= 15  # outlier dimensions
    directions = torch.randn(n_states, 2, d, generator=gen) / math.sqrt(d)
    mixing = torch.randn(n_states, 64, d, generator=gen) / 8
    scales = torch.logspace(-1, 1, d)[torch.randperm(d, generator=gen)]
    strength = [
        STRENGTH[0] + STRENGTH[1] * math.sin(math.pi * layer / n_states)
        for layer in range(n_states)
    ]
    labels = torch.as_tensor(labels)
    rows = window_rows(n_states, d)
    for start in range(0, n, rows):
        y = labels[start : start + rows]
        m = len(y)
        window = torch.empty(n_states, m, d)
        for layer in range(n_states):
            latent = torch.randn(m, 64, generator=gen)
            noise = torch.randn(m, d, generator=gen) * scales
            torch.addmm(noise, latent, mixing[layer], out=window[layer])
            window[layer] += offset[layer] + strength[layer] * directions[layer][y]
        yield start, window
        del window


def synthetic_recipe(n: int) -> dict:
    return {"synthetic": "bench_scale", "n": n, "layers": SYNTHETIC_LAYERS, "d": SYNTHETIC_D}


def synthetic_labels(n: int):
    import numpy as np

    return np.random.default_rng(0).integers(0, 2, n)


def stage_write_b(args) -> None:
    """Stream the synthetic states through the real writer into the cache."""
    import torch

    from analysis.cache import DiskCache
    from analysis.extract import states_specs, write_states

    labels = torch.from_numpy(synthetic_labels(args.n))
    specs = states_specs(SYNTHETIC_LAYERS, args.n, SYNTHETIC_D, regression=False)
    start = time.perf_counter()

    def write(writer) -> dict:
        windows = synthetic_windows(args.n, labels)
        write_states(writer, windows, labels, torch.arange(args.n))
        return {"source": "synthetic"}

    _, _, hit = DiskCache(args.cache).get_or_write("states", synthetic_recipe(args.n), specs, write)
    assert not hit
    bytes_ = sum(s.nbytes for s in specs.values())
    emit({"seconds": time.perf_counter() - start, "gb": bytes_ / 1e9})


def xtx_limit(threads: int, rows: int = 8192, d: int = SYNTHETIC_D, repeats: int = 5) -> float:
    """The machine's `X.T @ X` speed now: float64, (rows, d) (the issue's reference shape), with
    ``threads`` BLAS threads, best of ``repeats``, counted as rows · d² flops (a symmetric rank-k
    update: numpy's X.T @ X is a syrk). GFLOP/s."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    x = np.random.default_rng(0).standard_normal((rows, d))
    best = float("inf")
    with threadpool_limits(threads, user_api="blas"):
        for _ in range(repeats):
            start = time.perf_counter()
            x.T @ x
            best = min(best, time.perf_counter() - start)
    return rows * d * d / best / 1e9


def stage_metrics_b(args) -> None:
    """Load the entry (first load in this process: the content hash) and run the layer table;
    the `X.T @ X` limit measured right before and right after it, in the same process."""
    from analysis.cache import DiskCache
    from analysis.compute import default_executor, usable_cores
    from analysis.config import ExtractConfig
    from analysis.extract import LayerStates
    from analysis.layers.table import cached_layer_metrics

    cache, recipe = DiskCache(args.cache), synthetic_recipe(args.n)
    start = time.perf_counter()
    tensors, _ = cache.load("states", recipe)
    load_s = time.perf_counter() - start
    layer_states = LayerStates(
        states=tensors["states"],
        labels=tensors["labels"],
        rows=tensors["rows"],
        label_names=("a", "b"),
        task_type="classification",
        metric="accuracy",
        config=ExtractConfig(),
        meta={"cache_path": str(cache.entry_dir("states", recipe))},
        stored=cache.stored("states", recipe)["states"],
    )
    cores = usable_cores()
    limit_before = xtx_limit(cores)
    # The CLI's executor: a worker process per core (at most 8); kept until this stage ends, so
    # that their peak memory is counted.
    executor = default_executor()
    start = time.perf_counter()
    df, hit = cached_layer_metrics(layer_states, cache=cache, executor=executor)
    seconds = time.perf_counter() - start
    processes = executor.count
    assert not hit
    limit_after = xtx_limit(cores)
    timing = df.attrs.get("timing")
    emit({
        "load_s": load_s, "metrics_s": seconds, "route": df.attrs.get("route"),
        "probe_n": df.attrs.get("probe_n"), "timing": timing,
        "l_star": int(df.loc[df["layer"] >= 1, "nu"].idxmin()),
        "gram_gflop": df.attrs["gram_gflop"],
        # per core: the Gram phase's seconds are summed over the processes that shared the
        # layers; the machine's rate counts those processes side by side (as the limit's
        # threads are)
        "gram_gflops_core": df.attrs["gram_gflop"] / timing["read_and_moments"],
        "gram_gflops": df.attrs["gram_gflop"] / timing["read_and_moments"] * processes,
        "processes": processes,
        "limit_gflops": max(limit_before, limit_after),
        "limit_before": limit_before, "limit_after": limit_after,
        "threads_limit": cores,
    })  # fmt: skip


STAGES = {
    "bare": stage_bare,
    "extract": stage_extract,
    "metrics-a": stage_metrics_a,
    "write-b": stage_write_b,
    "metrics-b": stage_metrics_b,
}


def run_stage(stage: str, env: dict[str, str] | None = None, **kwargs) -> dict:
    command = [sys.executable, __file__, "--stage", stage]
    for key, value in kwargs.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    out = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"stage {stage} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min) on {os.cpu_count()} cores"


def part_a(args, work: Path) -> dict:
    csv = snippets_csv(work / "snippets.csv", round(args.n_a / 0.8) + 10)
    print(
        f"(a) MiniLM, N = {args.n_a:,} repeated movie snippets, {args.rounds} rounds; {load_average()}"
    )
    bare, ours, rss_bare, rss_ours, cpu_bare, cpu_ours = [], [], [], [], [], []
    for r in range(args.rounds):  # the order alternates, so a drifting load favours neither
        cache = work / f"cache-a{r}"
        if r % 2 == 0:
            b = run_stage("bare", csv=csv, n=args.n_a)
            o = run_stage("extract", csv=csv, n=args.n_a, cache=cache)
        else:
            o = run_stage("extract", csv=csv, n=args.n_a, cache=cache)
            b = run_stage("bare", csv=csv, n=args.n_a)
        if r < args.rounds - 1:
            shutil.rmtree(cache)
        bare.append(b["seconds"]), ours.append(o["seconds"])
        cpu_bare.append(b["cpu_s"]), cpu_ours.append(o["cpu_s"])
        rss_bare.append(b["peak_rss_mb"]), rss_ours.append(o["peak_rss_mb"])
        print(f"    round {r + 1}: bare {b['seconds']:.1f} s ({b['cpu_s']:.1f} s CPU), "
              f"extract_states {o['seconds']:.1f} s ({o['cpu_s']:.1f} s CPU); {load_average()}")  # fmt: skip
    t_bare, t_ours = statistics.median(bare), statistics.median(ours)
    print(
        f"    bare forward, same windows and batches : {t_bare:8.1f} s   peak RSS {max(rss_bare):7.0f} MB"
    )
    print(
        f"    extract_states (pool, stream, hash)    : {t_ours:8.1f} s   peak RSS {max(rss_ours):7.0f} MB"
    )
    c_bare, c_ours = statistics.median(cpu_bare), statistics.median(cpu_ours)
    print(f"    ratio, wall time                       : {t_ours / t_bare:8.3f} x  (goal <= 1.1)")
    print(f"    ratio, CPU time (less sensitive to the other sessions' load): "
          f"{c_ours / c_bare:.3f} x ({c_ours:.0f} s vs {c_bare:.0f} s)")  # fmt: skip
    result = {"ratio": t_ours / t_bare, "bare_s": t_bare, "ours_s": t_ours, "rss": max(rss_ours)}
    if not args.skip_metrics_a:
        m = run_stage("metrics-a", csv=csv, n=args.n_a, cache=work / f"cache-a{args.rounds - 1}")
        print(f"    layer metrics, in memory               : {m['memory_s']:8.1f} s")
        print(f"    layer metrics, streamed                : {m['streamed_s']:8.1f} s   "
              f"peak RSS (both) {m['peak_rss_mb']:.0f} MB; parts {m['timing']}")  # fmt: skip
        print(f"    largest relative difference            : {m['max_rel_diff']}")
    return result


def part_b(args, work: Path) -> dict:
    # Every size takes the streamed route (N = 100,000 would anyway: 800 MB per float64 layer).
    env = {"TUNESCOPE_STREAM_METRICS_MB": "0"}
    sizes = sorted({*args.n_small, args.n_b})
    print(f"(b) BERT-large shape, SYNTHETIC states: {SYNTHETIC_LAYERS + 1} layers x d = "
          f"{SYNTHETIC_D:,}; N = {', '.join(f'{n:,}' for n in sizes)}; {load_average()}")  # fmt: skip
    results = {}
    for n in sizes:
        cache = work / f"cache-b{n}"
        w = run_stage("write-b", env, n=n, cache=cache)
        m = run_stage("metrics-b", env, n=n, cache=cache)
        shutil.rmtree(cache)
        results[n] = (w, m)
        t = m["timing"]
        print(f"    N = {n:>7,}: write {w['gb']:.2f} GB in {w['seconds']:.1f} s "
              f"(peak RSS {w['peak_rss_mb']:.0f} MB); load + content check {m['load_s']:.1f} s; "
              f"metrics ({m['route']}, probe on {m['probe_n']:,}) {m['metrics_s']:.1f} s "
              f"(peak RSS {m['peak_rss_mb']:.0f} MB); ℓ* = {m['l_star']}; {load_average()}")  # fmt: skip
        where = (f"{m['processes']} processes sharing the layers, 1 BLAS thread each; seconds "
                 "summed over them")  # fmt: skip
        print(f"      Gram phase (read + moments; {where}): "
              f"{t['read_and_moments']:.1f} s for {m['gram_gflop']:,.0f} GFLOP = "
              f"{m['gram_gflops_core']:.1f} GFLOP/s a core, {m['gram_gflops']:.1f} on "
              f"{m['processes']} vs X.T @ X (8,192 x 1,024 float64, {m['threads_limit']} BLAS "
              f"threads, this process, before / after) {m['limit_before']:.1f} / "
              f"{m['limit_after']:.1f} GFLOP/s: {m['gram_gflops'] / m['limit_gflops']:.2f} of the limit")  # fmt: skip
        print(f"      ν / CCA / ϱ (d x d algebra) {t['nu_cca_rank']:.1f} s; probe "
              f"(CV on {m['probe_n']:,} rows, N-independent) {t['probe']:.1f} s")  # fmt: skip
    first = sizes[0]
    print(f"    growth with N (relative to N = {first:,}):")
    for n in sizes:
        g0, g = results[first][1]["timing"], results[n][1]["timing"]
        print(f"      N = {n:>7,} ({n / first:5.1f}x N): metrics {results[n][1]['metrics_s'] / results[first][1]['metrics_s']:5.2f}x, "
              f"Gram phase {g['read_and_moments'] / g0['read_and_moments']:5.2f}x, "
              f"per-example Gram time {g['read_and_moments'] / n * 1e6:.0f} µs")  # fmt: skip
    w, m = results[args.n_b]
    peak = max(w["peak_rss_mb"], m["peak_rss_mb"])
    print(f"    peak RSS at N = {args.n_b:,}: {peak:.0f} MB (goal <= 3,072); "
          f"metrics {m['metrics_s']:.1f} s (goal <= 60); {load_average()}")  # fmt: skip
    return {"peak": peak, "metrics_s": m["metrics_s"], "gram_gflops": m["gram_gflops"],
            "limit_gflops": m["limit_gflops"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("a", "b", "all"), default="all")
    parser.add_argument("--n-a", type=int, default=20_000)
    parser.add_argument("--n-b", type=int, default=100_000)
    parser.add_argument(
        "--n-small", type=int, nargs="*", default=[10_000, 30_000], help="(b) at smaller N too"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-metrics-a", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the caches go (needs 12 GB)")
    # a stage, run in its own process by the parent
    parser.add_argument("--stage", choices=sorted(STAGES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--csv", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        STAGES[args.stage](args)
        return

    work = Path(tempfile.mkdtemp(prefix="tunescope-scale-", dir=args.workdir))
    try:
        a = part_a(args, work) if args.part in ("a", "all") else {"ratio": float("nan")}
        b = (
            part_b(args, work)
            if args.part in ("b", "all")
            else {k: float("nan") for k in ("peak", "metrics_s", "gram_gflops", "limit_gflops")}
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"extract ratio_vs_bare={a['ratio']:.3f}")
    print(
        f"scale: n={args.n_b} layers={SYNTHETIC_LAYERS + 1} d={SYNTHETIC_D} "
        f"metrics_s={b['metrics_s']:.1f} peak_rss_mb={b['peak']:.0f} "
        f"gram_gflops={b['gram_gflops']:.1f} limit_gflops={b['limit_gflops']:.1f}"
    )


if __name__ == "__main__":
    main()
