"""ν at RoBERTa-large size: our rank-(C−1) route vs the textbook route, side by side (issue #3).

Synthetic float32 states, d = 1,024, N = 20,000, C = 2 and C = 6. Textbook: form Σ_w and Σ_b
(d × d, float64), pinv, trace (`analysis.layers.metrics.nu_textbook`, array-API pinv cut-off).
Goal: ≥ 50× faster, same value to ≤ 1e-8 relative.

    python bench/bench_nu.py [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.layers.metrics import nu, nu_textbook


def synthetic(n: int, d: int, n_classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Anisotropic Gaussian classes around a large shared offset, like pooled encoder states."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n)
    scales = np.exp(rng.standard_normal(d))  # per-dimension spread
    means = 0.3 * rng.standard_normal((n_classes, d))
    offset = 2.0 * rng.standard_normal(d)
    x = offset + means[labels] + scales * rng.standard_normal((n, d), dtype=np.float32)
    return x.astype(np.float32), labels


def best_time(fn, repeats: int) -> tuple[float, float]:
    times, value = [], 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    return min(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs, each route")
    parser.add_argument("--threads", type=int, default=None, help="limit BLAS threads")
    args = parser.parse_args()
    if args.threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)

    print(f"N = {args.n}, d = {args.d}, float32 states, float64 maths")
    print(f"{'C':>3} {'ours (s)':>10} {'textbook (s)':>13} {'ratio':>8} {'rel diff':>10}  nu")
    summary = {}
    for n_classes in (2, 6):
        x, y = synthetic(args.n, args.d, n_classes)
        t_ours, ours = best_time(lambda x=x, y=y: nu(x, y), args.repeats)
        t_book, book = best_time(lambda x=x, y=y: nu_textbook(x, y), args.repeats)
        rel = abs(ours - book) / abs(book)
        print(
            f"{n_classes:>3} {t_ours:>10.4f} {t_book:>13.3f} {t_book / t_ours:>7.0f}× {rel:>10.1e}  {ours:.10g}"
        )
        numpy_default = nu_textbook(x, y, rtol=1e-15)
        print(f"    (textbook with numpy's default pinv cut-off 1e-15: {numpy_default:.6g})")
        summary[n_classes] = (t_book / t_ours, rel)
    # The summary line (docs/benchmarks.md records each benchmark's last line).
    print(
        f"nu: n={args.n} d={args.d} "
        + " ".join(f"ratio_c{c}={r:.0f}" for c, (r, _) in summary.items())
        + f" max_rel_diff={max(rel for _, rel in summary.values()):.1e}"
    )


if __name__ == "__main__":
    main()
