"""What ``layers --repeats 5`` costs against one repeat's metrics, on top of one extraction
(goal: at most 5×).

    python bench/bench_layer_repeats.py                          # MiniLM, 2,000 movie snippets
    python bench/bench_layer_repeats.py --data trec6 --rounds 3

The extraction runs once (into a temporary cache, so it is really computed); then, side by side in
each round, one table of metrics on the N states (what one repeat costs) and R bootstrap repeats
(`analysis.layers.repeats.layer_repeats`: ν, CCA and ϱ recomputed, the table's out-of-fold probe
predictions resampled, plus the 20 jackknife subsamples, as ``layers --repeats`` does).
``layers --repeats R`` computes the single table and the R repeats, so its metrics cost is
table + repeats. Printed: medians over rounds, and

    metrics ratio    = (table + R repeats) / table
    end-to-end ratio = (extraction + table + R repeats) / (extraction + table)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.cache import DiskCache
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
from analysis.extract import extract_states
from analysis.layers.repeats import layer_repeats, summarise_repeats
from analysis.layers.table import layer_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    cfg = ExtractConfig(ModelSpec(args.model), DataSpec(args.data), SampleSpec(n=args.n))
    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        states = extract_states(cfg, cache=DiskCache(root))
        extraction = time.perf_counter() - t
    x, y, metric = states.states, states.labels.numpy(), states.metric
    print(f"{args.model} × {args.n} {args.data}: states {tuple(x.shape)}, metric {metric}")
    print(f"extraction (once): {extraction:.1f} s")

    tables, reps = [], []
    for _ in range(args.rounds):
        t = time.perf_counter()
        full = layer_metrics(x, y, metric)
        tables.append(time.perf_counter() - t)
        t = time.perf_counter()
        rep = layer_repeats(x, y, metric, repeats=args.repeats, table=full)
        reps.append(time.perf_counter() - t)
    table, repeats = statistics.median(tables), statistics.median(reps)
    r = args.repeats
    print(f"one table of metrics (one repeat's cost): {table:.1f} s  (rounds: {tables})")
    print(f"{r} bootstrap repeats: {repeats:.1f} s = {repeats / r / table:.2f}× a table each")
    print(
        f"metrics ratio (table + {r} repeats) / table: {(table + repeats) / table:.2f}×  (goal ≤ 5×)"
    )
    print(
        f"end-to-end ratio (extraction + table + {r} repeats) / (extraction + table): "
        f"{(extraction + table + repeats) / (extraction + table):.2f}×"
    )
    summ = summarise_repeats(rep)
    print(f"ρ(ν, s) {summ.rho['nu'].text(3)}; {summ.l_star_sentence()}")


if __name__ == "__main__":
    main()
