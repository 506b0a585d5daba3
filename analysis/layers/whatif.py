"""What-ifs: the ν and probe curves of several samples of one model, side by side
(docs/explanation/layer-metrics.md, "Robustness what-ifs")."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from analysis.layers.metrics import DEFAULT_BINS, ArrayLike
from analysis.layers.table import layer_metrics, summary
from analysis.progress import Progress, scaled


def whatif_curves(
    settings: Mapping[str, tuple[ArrayLike, ArrayLike]],
    metric: str = "accuracy",
    seed: int = 0,
    n_bins: int = DEFAULT_BINS,
    progress: Progress | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ν and probe curves for several samples of one model (pooling, imbalance, scarcity, seeds).

    settings: name → (states (L+1, N, d), labels (N,)). Returns (curves, table):
    curves has columns setting, layer, nu, probe (tidy, one row per setting and layer);
    table has setting, n, l_star, zeta, rho, abs_rho (ρ(ν, s) over ℓ = 1..L), one row per setting.
    """
    frames = {}
    items = list(settings.items())
    for i, (name, (states, labels)) in enumerate(items):
        sub = scaled(progress, i / len(items), (i + 1) / len(items))
        frames[name] = layer_metrics(states, labels, metric, seed, ("nu", "probe"), n_bins, sub)
    return compare_settings(frames)


def compare_settings(frames: Mapping[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy what-if results from per-setting `layer_metrics` frames (name → frame).

    Returns (curves: setting, layer, nu, probe; table: setting, n, l_star, zeta, rho, abs_rho),
    with ρ = ρ(ν, s) over ℓ = 1..L.
    """
    if not frames:
        raise ValueError("Nothing to compare: give at least one setting.")
    curves, table = [], []
    for name, df in frames.items():
        s = summary(df)
        curves.append(df[["layer", "nu", "probe"]].assign(setting=name))
        r = s["rho"]["nu"]
        table.append(
            {"setting": name, "n": df.attrs.get("n"), "l_star": s["l_star"], "zeta": s["zeta"],
             "rho": r, "abs_rho": abs(r)}
        )  # fmt: skip
    curves_df = pd.concat(curves, ignore_index=True)[["setting", "layer", "nu", "probe"]]
    return curves_df, pd.DataFrame(table)


def seed_band(curves: pd.DataFrame, value: str = "nu") -> pd.DataFrame:
    """Mean and spread over settings (e.g. seeds) per layer: columns layer, mean, std, lo, hi.

    curves: the tidy frame of `whatif_curves`; std is the sample std (0 for a single setting);
    lo / hi are the min and max.
    """
    grouped = curves.groupby("layer")[value]
    out = pd.DataFrame(
        {
            "mean": grouped.mean(),
            "std": grouped.std(ddof=1).fillna(0.0),
            "lo": grouped.min(),
            "hi": grouped.max(),
        }
    )
    return out.reset_index()
