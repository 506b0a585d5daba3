"""All four layer metrics for every layer from cached states: per-metric times (issue #3).

    python bench/bench_layer_metrics.py                # synthetic MiniLM-shaped states
    python bench/bench_layer_metrics.py --real         # real MiniLM states via analysis.extract
    python bench/bench_layer_metrics.py --real --data trec6 --n 2000

Last, the whole table in this process (`analysis.compute.InProcess`) against its layers shared
out over worker processes (`analysis.compute.Workers`, ``--processes``, default
`analysis.compute.processes`: every usable core up to 8), ``--rounds`` times each, alternating,
after the workers have started; the last line is
``layer table: processes=… one_s=… shared_s=… ratio=… same=…`` (medians; ``same``: the two
tables equal bit for bit).

Synthetic states: (7, N, 384), two classes whose separation peaks in the middle layers, plus a
large shared offset and a few outlier dimensions, like a small BERT's pooled states.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis import compute
from analysis.layers import metrics, table
from analysis.layers import probe as probes


def synthetic_states(
    n: int = 2000, d: int = 384, n_layers: int = 6, n_classes: int = 2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, str]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n)
    directions = rng.standard_normal((n_classes, d)) / np.sqrt(d)
    mixing = rng.standard_normal((d, d)) / np.sqrt(d)  # anisotropic within-class noise
    offset = rng.standard_normal(d)
    offset[:3] *= 20.0  # outlier dimensions
    states = np.empty((n_layers + 1, n, d), dtype=np.float32)
    for layer in range(n_layers + 1):
        strength = 1.5 * np.sin(np.pi * layer / (n_layers + 1)) + 0.2
        noise = rng.standard_normal((n, d)) @ mixing
        states[layer] = offset + noise + strength * 1.2 * directions[labels]
    return states, labels, "accuracy"


def real_states(model: str, data: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
    from analysis.extract import extract_states

    cfg = ExtractConfig(ModelSpec(model), DataSpec(data), SampleSpec(n=n, seed=seed))
    t0 = time.perf_counter()
    ls = extract_states(cfg)
    print(f"states ready in {time.perf_counter() - t0:.1f} s (cached after the first run)")
    return ls.states.numpy(), ls.labels.numpy(), ls.metric


def time_layer(states, labels, split, metric: str, times: dict[str, float]) -> None:
    """Add one layer's time per metric to ``times``."""
    h = metrics.as_float64(states)
    t = time.perf_counter()
    metrics.nu(h, labels)
    times["nu"] += time.perf_counter() - t
    t = time.perf_counter()
    metrics.cca_score(h, labels, split=split)
    times["cca"] += time.perf_counter() - t
    t = time.perf_counter()
    metrics.rank_metric(h, labels)
    times["rank"] += time.perf_counter() - t
    t = time.perf_counter()
    held_out = np.concatenate([split.dev, split.test])
    probes.probe_score(h[split.train], labels[split.train], h[held_out], labels[held_out], metric)
    times["probe"] += time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="real MiniLM states (analysis.extract)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--processes", type=int, default=None, help="(default: analysis.compute.processes())"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    if args.real:
        states, labels, metric = real_states(args.model, args.data, args.n, args.seed)
    else:
        states, labels, metric = synthetic_states(n=args.n, seed=args.seed)
    n_layers1, n, d = states.shape
    print(
        f"states (L+1, N, d) = ({n_layers1}, {n}, {d}), classes {len(np.unique(labels))}, metric {metric}"
    )

    # Per metric, each over every layer, the way layer_metrics runs them.
    split = metrics.split_indices(labels, args.seed)
    times = dict.fromkeys(metrics.METRICS, 0.0)
    with compute.one_thread():  # as a layer's task runs them
        blas = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
        for layer in range(n_layers1):
            time_layer(states[layer], labels, split, metric, times)
    print(f"BLAS threads {sorted(blas)}; per metric, over every layer:")
    for name, seconds in times.items():
        print(
            f"  {name:6s} {seconds:7.3f} s for {n_layers1} layers ({1000 * seconds / n_layers1:6.1f} ms/layer)"
        )

    t = time.perf_counter()
    df = table.layer_metrics(states, labels, metric, args.seed)
    total = time.perf_counter() - t
    s = table.summary(df)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"layer_metrics, all four metrics, all layers: {total:.2f} s")
    rho = {k: round(v, 3) for k, v in s["rho"].items()}
    print(f"l_star {s['l_star']}, zeta {s['zeta']:.3g}, rho {rho}")
    side_by_side(states, labels, metric, args)


def side_by_side(states, labels, metric: str, args) -> None:
    """The table in one process vs shared with helpers, alternating (module docstring)."""
    import statistics

    count = args.processes or compute.processes()
    workers = compute.Workers(count)
    started = time.perf_counter()
    compute.run_all(time.sleep, [(0.5,)] * count, executor=workers)  # every worker up
    print(f"{workers.started} worker(s) up after {time.perf_counter() - started:.2f} s")
    executors = {"one": compute.IN_PROCESS, "shared": workers}
    times: dict[str, list[float]] = {name: [] for name in executors}
    tables = {}
    for _ in range(args.rounds):
        for name, executor in executors.items():
            t = time.perf_counter()
            tables[name] = table.layer_metrics(states, labels, metric, args.seed, executor=executor)
            times[name].append(time.perf_counter() - t)
    workers.shutdown()
    print(f"  seconds {times}")
    one, shared = statistics.median(times["one"]), statistics.median(times["shared"])
    same = tables["one"].equals(tables["shared"])
    print(
        f"layer table: processes={count} one_s={one:.2f} shared_s={shared:.2f} "
        f"ratio={shared / one:.2f} same={same}"
    )


if __name__ == "__main__":
    main()
