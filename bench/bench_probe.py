"""The CV probe of one layer: its fits one at a time against side by side.

    .venv/bin/python bench/bench_probe.py [--layers 1 6 12 24] [--rounds 2]

The probe of docs/explanation/layer-metrics.md, "The probe and its cross-validation" (5 outer
folds × an inner 3-fold search over 7 C values, then a refit per fold) on the streamed route's
capped rows of BERT-large-shaped SYNTHETIC states (3,750 × 1,024, the generator of
`bench_scale.py`; weak layers at both ends, strong ones mid-network), one BLAS thread:

- one at a time: every fit its own `L2Logistic.fit` (scipy's L-BFGS-B over the fold's standardised
  float32 rows), the inner folds walking the C grid with warm starts — the probe without
  `analysis/layers/logistic_batch.py`, built here from the same pieces;
- side by side: `analysis.layers.probe.cv_predictions` (every fit's own L-BFGS-B iterates, the
  products of all waiting fits taken together over the shared rows).

Rounds alternate the order; medians are reported. Both give each layer's score; they differ only
where the rounding of the products moves where an L-BFGS run stops (the difference is printed with
the score's s.e.). The last line is ``probe: layers=… one_s=… side_s=… ratio=… max_diff_se=…``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from analysis.layers import probe as probes  # noqa: E402
from analysis.layers.logistic import L2Logistic  # noqa: E402
from analysis.scores import task_score  # noqa: E402


def one_at_a_time(x: np.ndarray, y: np.ndarray, folds: np.ndarray, seed: int = 0) -> float:
    """The CV probe's score with every fit made alone (module docstring)."""
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    grid = probes.PROBE_GRID
    predictions = np.empty_like(y)
    for k in np.unique(folds):
        train, held = folds != k, folds == k
        scaler = StandardScaler().fit(x[train])
        z, y_train = scaler.transform(x[train]).astype(np.float32), y[train]
        splitter = StratifiedKFold(probes.CV_FOLDS, shuffle=True, random_state=seed)
        scores, paths = [], []
        for inner_train, inner_held in splitter.split(np.zeros(len(y_train)), y_train):
            model, row, path = L2Logistic(C=grid[0], warm_start=True), [], []
            for c in grid:
                model.set_params(C=c).fit(z[inner_train], y_train[inner_train])
                row.append(
                    task_score("accuracy", y_train[inner_held], model.predict(z[inner_held]))
                )
                path.append((model.coef_.copy(), model.intercept_.copy()))
            scores.append(row)
            paths.append(path)
        best = int(np.argmax(np.mean(scores, axis=0)))
        model = L2Logistic(C=grid[best], warm_start=True)
        model.coef_ = np.mean([path[best][0] for path in paths], axis=0)
        model.intercept_ = np.mean([path[best][1] for path in paths], axis=0)
        model.fit(z, y_train)
        predictions[held] = model.predict(scaler.transform(x[held]))
    return task_score("accuracy", y, predictions)


def main() -> None:
    import bench_scale
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[1, 6, 12, 24])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=3750, help="rows (the cap at d = 1,024)")
    args = parser.parse_args()
    labels = bench_scale.synthetic_labels(args.n)
    windows = bench_scale.synthetic_windows(args.n, torch.from_numpy(labels))
    states = torch.cat([window for _, window in windows], dim=1).numpy()  # (25, n, 1,024)
    folds = probes.outer_folds(labels, 0)
    one, side, diffs = [], [], []
    print(f"CV probe of {len(args.layers)} layers of {args.n:,} x {states.shape[2]:,} SYNTHETIC "
          f"states, one BLAS thread, {args.rounds} alternating rounds")  # fmt: skip
    with threadpool_limits(1, user_api="blas"):
        for r in range(args.rounds):
            times = {"one": 0.0, "side": 0.0}
            for layer in args.layers:
                x = states[layer].astype(np.float64)
                for how in ("one", "side") if r % 2 == 0 else ("side", "one"):
                    start = time.perf_counter()
                    if how == "one":
                        alone = one_at_a_time(x, labels, folds)
                    else:
                        cv = probes.cv_predictions(x, labels, "accuracy", folds)
                    times[how] += time.perf_counter() - start
                if r == 0:
                    diffs.append(abs(cv.score - alone) / cv.se)
                    print(f"    layer {layer:>2}: score {alone:.4f} one at a time, {cv.score:.4f} "
                          f"side by side (s.e. {cv.se:.4f})")  # fmt: skip
            one.append(times["one"])
            side.append(times["side"])
            print(f"    round {r + 1}: one at a time {times['one']:.1f} s, side by side "
                  f"{times['side']:.1f} s")  # fmt: skip
    t_one, t_side = statistics.median(one), statistics.median(side)
    print(
        f"probe: layers={len(args.layers)} one_s={t_one:.1f} side_s={t_side:.1f} "
        f"ratio={t_side / t_one:.2f} max_diff_se={max(diffs):.2f}"
    )


if __name__ == "__main__":
    main()
