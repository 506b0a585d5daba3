"""One claim's result (`ClaimResult`: our number, its interval, the verdict and what it rests
on) and how results read: the table the page and the CLI show, the JSON ``claims`` writes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.claims.papers import CLAIMS, ClaimInfo
from analysis.compare import Comparison

if TYPE_CHECKING:
    from analysis.claims.config import ClaimsConfig

VERDICTS = ("holds", "holds weakly", "does not hold", "inconclusive", "unstable",
            "not measured yet")  # fmt: skip
# A run claim gives a verdict only from ≥ 3 seeds per arm (docs/explanation/claims.md).
MIN_SEEDS = 3


@dataclass
class ClaimResult:
    """One claim's row: ``ours`` with its ``interval`` (None where the claim has none), the
    verdict, n_seeds (run claims) or repeats (layer claims), the runs it rests on, a sentence
    (``detail``) and every comparison behind it."""

    id: str
    verdict: str
    ours: float | None = None
    interval: tuple[float, float] | None = None
    n_seeds: int | None = None
    repeats: int | None = None
    runs: list[str] = field(default_factory=list)
    detail: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # what the figures draw

    @property
    def info(self) -> ClaimInfo:
        return CLAIMS[self.id]

    def to_dict(self) -> dict[str, Any]:
        def clean(x: Any) -> Any:
            if isinstance(x, float | np.floating):
                return float(x) if math.isfinite(x) else None
            if isinstance(x, dict):
                return {str(k): clean(v) for k, v in x.items()}
            if isinstance(x, list | tuple | np.ndarray):
                return [clean(v) for v in x]
            if isinstance(x, np.integer):
                return int(x)
            return x

        return {
            "id": self.id,
            "claim": self.info.claim,
            "paper": self.info.paper,
            "ours": clean(self.ours),
            "interval": clean(list(self.interval)) if self.interval is not None else None,
            "verdict": self.verdict,
            "n_seeds": self.n_seeds,
            "runs": list(self.runs),
            "repeats": self.repeats,
            "measured_as": self.info.measured_as,
            "rule": self.info.rule,
            "detail": self.detail,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "values": clean(self.values),
        }


def claims_json(cfg: ClaimsConfig, results: Sequence[ClaimResult]) -> dict[str, Any]:
    """``{"model", "data", "settings", "claims": [{"id", "claim", "paper", "ours", "interval",
    "verdict", "n_seeds", "runs", …}]}``."""
    settings = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(cfg).items()
        if k not in ("model", "data")
    }
    return {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "settings": settings,
        "claims": [r.to_dict() for r in results],
    }


def ours_text(result: ClaimResult) -> str:
    """Our number as it reads: "ℓ* = 4 (41 of 50 repeats)" (X2), a signed ρ (X1), ζ difference
    (X3) or score difference."""
    x = result.ours
    if x is None or not math.isfinite(x):
        return ""
    if result.id == "X2":
        counts = result.values.get("l_star_counts", {})
        k = counts.get(str(int(x)), 0)
        return (
            f"ℓ* = {int(x)} ({k} of {result.repeats} repeats)"
            if result.repeats
            else f"ℓ* = {int(x)}"
        )
    if result.id == "X3":
        return f"{x:+.3g}"
    return f"{x:+.2f}" if result.id == "X1" else f"{x:+.4f}"


def _layer_n(r: ClaimResult) -> str:
    """ "N = 1,000, R = 50, S = 3 (disjoint)" for a layer claim."""
    v = r.values
    if "n_samples" not in v:
        return f"R = {r.repeats}"
    mode = f" ({v['sample_mode']})" if v["n_samples"] > 1 else ""
    return f"N = {v['n']:,}, R = {r.repeats}, S = {v['n_samples']}{mode}"


def claims_table(results: Sequence[ClaimResult]) -> pd.DataFrame:
    """id, claim, paper, ours (as text: `ours_text`), interval, verdict, n (seeds or repeats),
    detail — for pages and reports."""
    rows = []
    for r in results:
        known = r.interval is not None and all(math.isfinite(x) for x in r.interval)
        lo_hi = f"[{r.interval[0]:+.3g}, {r.interval[1]:+.3g}]" if known else ""
        rows.append(
            {"id": r.id, "claim": r.info.claim, "paper": r.info.paper, "ours": ours_text(r),
             "interval": lo_hi,
             "verdict": r.verdict,
             "n": f"{r.n_seeds} seeds" if r.n_seeds else _layer_n(r) if r.repeats else "",
             "detail": r.detail}
        )  # fmt: skip
    return pd.DataFrame(
        rows, columns=["id", "claim", "paper", "ours", "interval", "verdict", "n", "detail"]
    )
