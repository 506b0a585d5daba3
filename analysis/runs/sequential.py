"""Sequential rounds: train only the seeds the answer needs (docs/explanation/statistics.md,
"Sequential rounds").

Every arm is compared with full fine-tuning, d = score(arm) − score(full), by the paired t over
the seeds both have or by Welch's test (`analysis.compare`). Arms come cheapest first. Each arm
starts with r₀ seeds; after each round it gets the interval

    d̄ ± c · se,   c = t_{1 − α/K, df},   K = R_max − r₀ + 1

(df = n − 1 for the paired t over n seeds, Welch–Satterthwaite's for Welch), and a status:

- **held up**: lower end ≥ −δ (not worse than full by more than δ, in the metric's units);
- **shown worse**: upper end < −δ;
- **undecided**: neither — one more seed next round, up to R_max;
- **not needed**: undecided (or not started) while a cheaper arm held up; it gets no more seeds.

The boundary is Bonferroni over looks: an arm is looked at once per round, with n = r₀, r₀ + 1, …,
R_max seeds, so at most K times, and each look calls it held up with chance ≤ α/K when its true
difference is −δ or worse (exactly α/K at −δ for the paired t on Gaussian scores). By the union
bound the whole procedure holds it up wrongly with chance ≤ α (one-sided, per arm). Bonferroni
rather than an alpha-spending boundary: it needs no assumption about when the procedure stops, a
look skipped (runs arriving in bulk) only makes it more conservative, and the simulation test
shows it still decides true-zero arms with a moderate seed spread. Seeds beyond R_max are not
used: the boundary counts only the design's looks, and no look is taken before r₀.

The paired t uses the seeds the arm and full both have; Welch the first n seeds (in seed order)
of each, n the fewer of the two counts, so that a look depends only on the round, although full
keeps getting seeds for other arms. Full fine-tuning gets a seed whenever an arm does, so it
always has at least as many seeds as any arm (the first n of one seed list under common random
numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analysis.compare import TESTS, Arm, compare
from analysis.io import json_ready

HELD_UP, SHOWN_WORSE, UNDECIDED, NOT_NEEDED = "held up", "shown worse", "undecided", "not needed"
STATUSES = (HELD_UP, SHOWN_WORSE, UNDECIDED, NOT_NEEDED)
FULL = "full fine-tuning"


@dataclass(frozen=True)
class SequentialDesign:
    """The sequential rule's settings: δ (the metric's units), r₀ seeds to start, R_max at most,
    α one-sided per arm, and the test ("paired" over common seeds, or "welch")."""

    delta: float
    r0: int = 3
    r_max: int = 10
    alpha: float = 0.025
    test: str = "paired"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta) and self.delta > 0):
            raise ValueError(f"delta must be > 0 (the metric's units), got {self.delta}.")
        if not 2 <= self.r0 <= self.r_max:
            raise ValueError(f"Need 2 ≤ r0 ≤ r_max, got r0 = {self.r0}, r_max = {self.r_max}.")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}.")
        if self.test not in TESTS:
            raise ValueError(f"Unknown test {self.test!r}: choose one of {', '.join(TESTS)}.")

    @property
    def looks(self) -> int:
        """K = R_max − r₀ + 1: the rounds at which an arm can be looked at."""
        return self.r_max - self.r0 + 1

    def critical(self, df: Any) -> Any:
        """c = t_{1 − α/K, df}, elementwise; NaN where df is not > 0."""
        from scipy.stats import t

        df = np.asarray(df, dtype=float)
        with np.errstate(invalid="ignore"):
            c = t.ppf(1 - self.alpha / self.looks, np.where(df > 0, df, np.nan))
        return float(c) if c.ndim == 0 else c


def classify(lo: Any, hi: Any, delta: float) -> Any:
    """ "held up" where lo ≥ −δ, "shown worse" where hi < −δ, else "undecided" (NaN bounds:
    undecided), elementwise."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    out = np.where(lo >= -delta - 1e-12, HELD_UP, np.where(hi < -delta, SHOWN_WORSE, UNDECIDED))
    return str(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class ArmStatus:
    """One arm against full after a round: its status, the n seeds its interval rests on (pairs
    with full for the paired t; the arm's seeds for Welch), d̄, se and the critical value c."""

    name: str
    status: str
    n: int
    diff: float = math.nan
    se: float = math.nan
    c: float = math.nan
    test: str = "paired"

    @property
    def margin(self) -> float:
        return self.c * self.se

    @property
    def lo(self) -> float:
        return self.diff - self.margin

    @property
    def hi(self) -> float:
        return self.diff + self.margin

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN → None)."""
        return json_ready({
            "arm": self.name, "status": self.status, "n": self.n, "diff": self.diff,
            "se": self.se, "c": self.c, "lo": self.lo, "hi": self.hi, "test": self.test,
        })  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """Where the comparison stands: every arm's status (cheapest first) and the next round —
    ``next_seeds``: arm → the seeds it should have after it (arms still in play; empty when the
    answer is final), ``full_seeds``: full's, at least every arm's."""

    arms: tuple[ArmStatus, ...]
    next_seeds: dict[str, int]
    full_seeds: int
    design: SequentialDesign

    @property
    def final(self) -> bool:
        """No arm cheaper than the cheapest held-up one (every arm, when none held up) is
        undecided with fewer than R_max seeds."""
        return not self.next_seeds

    @property
    def held_up(self) -> ArmStatus | None:
        """The cheapest arm that held up."""
        return next((a for a in self.arms if a.status == HELD_UP), None)

    @property
    def not_needed(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms if a.status == NOT_NEEDED)


def look(
    name: str, scores: Mapping[int, float], full: Mapping[int, float], design: SequentialDesign
) -> ArmStatus:
    """One arm's interval and status (held up / shown worse / undecided) from its scores and
    full's, seed → score (the seeds each test uses: module docstring); no look (undecided, no
    interval) before r₀ seeds."""
    arm, reference = _arm(name, scores, design.r_max), _arm(FULL, full, design.r_max)
    if design.test == "welch":
        n = min(arm.n_seeds, reference.n_seeds)
        arm, reference = _first(arm, n), _first(reference, n)
    if not arm.n_seeds or not reference.n_seeds:
        return ArmStatus(name, UNDECIDED, 0, test=design.test)
    c = compare(arm, reference, test=design.test)
    n = c.n_pairs if design.test == "paired" else arm.n_seeds
    crit = design.critical(c.df) if n >= design.r0 else math.nan
    status = ArmStatus(name, UNDECIDED, n, c.diff, c.se, crit, design.test)
    return replace(status, status=classify(status.lo, status.hi, design.delta))


def plan(
    full: Mapping[int, float],
    arms: Mapping[str, Mapping[int, float]],
    order: Sequence[str],
    design: SequentialDesign,
) -> Plan:
    """Every arm's status and the next round (module docstring). full: seed → full's test
    score; arms: name → seed → score; order: the arms' names, cheapest first."""
    if sorted(order) != sorted(arms) or len(set(order)) != len(order):
        raise ValueError(f"order {list(order)} must name each arm once: {sorted(arms)}.")
    statuses = [look(name, arms[name], full, design) for name in order]
    cheapest = next((i for i, a in enumerate(statuses) if a.status == HELD_UP), len(statuses))
    statuses = [
        replace(a, status=NOT_NEEDED) if i > cheapest and a.status == UNDECIDED else a
        for i, a in enumerate(statuses)
    ]
    next_seeds = {
        a.name: min(design.r_max, max(design.r0, a.n + 1))
        for a in statuses
        if a.status == UNDECIDED and a.n < design.r_max
    }
    have = [min(len(arms[a.name]), design.r_max) for a in statuses]
    full_seeds = max([min(len(full), design.r_max), *have, *next_seeds.values()])
    return Plan(tuple(statuses), next_seeds, full_seeds, design)


def _arm(name: str, scores: Mapping[int, float], n: int) -> Arm:
    """The first ``n`` seeds (in seed order) with a finite score."""
    kept = sorted((int(s), float(v)) for s, v in scores.items() if math.isfinite(float(v)))
    return Arm(name, tuple(v for _, v in kept[:n]), seeds=tuple(s for s, _ in kept[:n]))


def _first(arm: Arm, n: int) -> Arm:
    return Arm(arm.name, arm.scores[:n], seeds=arm.seeds[:n])


# -- the answer -----------------------------------------------------------------------------------

RECOMMEND, NONE_HELD_UP, UNDECIDED_AT_MAX, IN_PROGRESS = (
    "recommend", "none held up", "undecided", "in progress",
)  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """The sentence's branch and its numbers: ``branch`` "recommend" (``arm``: the cheapest that
    held up; provisional until ``final``), "none held up" (every arm shown worse), "undecided"
    (final, none held up: ``undecided`` stay within reach of −δ after R_max seeds) or "in
    progress" (``undecided`` get more seeds)."""

    branch: str
    arm: ArmStatus | None
    undecided: tuple[ArmStatus, ...]
    final: bool
    design: SequentialDesign

    def sentence(self, scale: float = 1.0, unit: str = "") -> str:
        """The branch in words; differences × ``scale`` in ``unit`` (100, "points" for a share)."""
        d = self.design
        test = "paired t" if d.test == "paired" else "Welch"
        size = scale * d.delta
        delta = (
            f"δ = {size:g}{' ' + (unit.removesuffix('s') if size == 1 else unit) if unit else ''}"
        )
        unit = f" {unit}" if unit else ""

        def interval(a: ArmStatus) -> str:
            if not math.isfinite(a.lo):
                return f"{a.name} (no interval yet, n seeds = {a.n})"
            return (
                f"{a.name} {scale * a.diff:+.1f} ± {scale * a.margin:.1f}{unit} "
                f"[{scale * a.lo:+.1f}, {scale * a.hi:+.1f}] (n seeds = {a.n})"
            )

        looks = f"{test}, c adjusted for {d.looks} looks"
        if self.branch == RECOMMEND:
            tail = "" if self.final else "; cheaper choices are still being trained"
            return (
                f"{interval(self.arm)} against {FULL} ({looks}: c = {self.arm.c:.2f}) — the "
                f"cheapest choice that held up within {delta}{tail}."
            )
        if self.branch == NONE_HELD_UP:
            return f"No cheaper choice held up within {delta}: fine-tune the whole model."
        arms = "; ".join(interval(a) for a in self.undecided)
        if self.branch == UNDECIDED_AT_MAX:
            return (
                f"Undecided after {d.r_max} seeds: {arms} stay within reach of −δ ({delta}; "
                f"{looks}) — more seeds, a larger test part or a larger δ could settle it."
            )
        return f"Not decided yet: {arms} get more seeds next round ({looks})."


def answer(result: Plan) -> Answer:
    """The branch of the sentence a `Plan` supports (`Answer`)."""
    undecided = tuple(a for a in result.arms if a.status == UNDECIDED)
    held = result.held_up
    if held is not None:
        branch = RECOMMEND
    elif all(a.status == SHOWN_WORSE for a in result.arms):
        branch = NONE_HELD_UP
    else:
        branch = UNDECIDED_AT_MAX if result.final else IN_PROGRESS
    return Answer(branch, held, undecided, result.final, result.design)
