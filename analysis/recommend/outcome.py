"""The comparison at equal budget and the sentence (docs/explanation/recommendation.md, "The
comparison" and "The sentence").

Every arm is compared with full fine-tuning by `analysis.compare.compare`: diff = mean − mean_full
(test scores over seeds), se = √(se² + se_full²), margin = t · se with t the 97.5 % quantile of
Student's t at the Welch degrees of freedom; the verdict "<arm> better" / "full fine-tuning better"
when |diff| > margin, else "no difference shown (n seeds = …)". Runs are matched to an arm by their
run group (every setting but the seed) and seed, so unlike runs are never averaged; a seed trained
twice counts once (its newest run). Two arms whose runs are all at chance level get no verdict.

The sentence: among the arms cheaper than full (step-time ratio < 1; ordered by step-time ratio,
then trainable share) — within the budget when there is one — the **cheapest** whose interval's
lower end diff − margin ≥ −δ ("held up"). If none held up: "too few seeds to tell" while some
arm's interval is undefined or reaches above −δ (more seeds could settle it), else "no cheaper
choice held up within δ: fine-tune the whole model".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.compare import Arm, compare
from analysis.io import json_ready
from analysis.recommend.budget import Costs
from analysis.recommend.choices import Choice, Proposal
from analysis.recommend.config import Budget, RecommendConfig
from analysis.runs.chance import chance_flag
from analysis.runs.record import runs_of
from analysis.runs.results import group_of, pareto_front

if TYPE_CHECKING:
    from analysis.recommend.evidence import Evidence

POINTS = 100.0  # one point of a task's metric is 0.01
REFERENCE = "full fine-tuning"
NOT_RUN = "not run yet"


@dataclass(frozen=True)
class ArmOutcome:
    """One arm's row of the comparison: its runs' test scores (mean ± s.e. over n_seeds), the
    difference to full with its margin t · se and verdict, and its costs."""

    name: str
    role: str
    method: str
    n_seeds: int
    mean: float = math.nan
    se: float = math.nan
    diff: float = math.nan
    margin: float = math.nan
    verdict: str = NOT_RUN
    step_time_ratio: float | None = None
    trainable_share: float | None = None
    peak_mem_mb: float | None = None
    match: str = ""
    frontier: bool = False
    runs: tuple[str, ...] = ()
    at_chance: bool = False

    @property
    def lo(self) -> float:
        return self.diff - self.margin

    @property
    def hi(self) -> float:
        return self.diff + self.margin

    def held_up(self, delta: float) -> bool:
        """The interval's lower end is ≥ −δ (δ in the metric's units): not shown worse by more."""
        return math.isfinite(self.lo) and self.lo >= -delta - 1e-12

    def undecided(self, delta: float) -> bool:
        """No interval yet, or one that reaches above −δ without holding up: more seeds could
        tell."""
        return not math.isfinite(self.lo) or (not self.held_up(delta) and self.hi > -delta)


def run_key(choice: Choice, cfg: RecommendConfig, seed: int, runs: pd.DataFrame) -> tuple[str, int]:
    """(run group, seed) of ``choice``'s run with ``seed`` among ``runs``
    (`analysis.runs.results.group_of`)."""
    return group_of(choice.config(cfg.base_run(seed)).to_dict(), runs), seed


def planned_runs(cfg: RecommendConfig, proposal: Proposal) -> list[tuple[str, Any]]:
    """(arm name, FinetuneConfig) of every arm × seed."""
    return [
        (choice.name, choice.config(cfg.base_run(seed)))
        for choice in proposal.choices
        for seed in cfg.seeds
    ]


def run_status(
    cfg: RecommendConfig, proposal: Proposal, runs: pd.DataFrame
) -> dict[str, dict[int, tuple[str, str]]]:
    """Arm → seed → (status, run id) of the run that stands for it: a done one (the newest),
    else a running or queued one, else the newest failed or cancelled one; absent: none."""
    order = ("done", "running", "queued", "failed", "cancelled")
    best: dict[tuple[str, int], tuple[int, str]] = {}
    for run in runs_of(runs) if not runs.empty else []:
        if run.status not in order or not run.stored:
            continue
        key = (run.group, int(run.stored.get("seed", 0)))
        rank = order.index(run.status)
        if key not in best or rank < best[key][0]:  # list_runs is newest first
            best[key] = (rank, run.id)
    out: dict[str, dict[int, tuple[str, str]]] = {}
    for choice in proposal.choices:
        found = {seed: best.get(run_key(choice, cfg, seed, runs)) for seed in cfg.seeds}
        out[choice.name] = {s: (order[f[0]], f[1]) for s, f in found.items() if f is not None}
    return out


def done_runs(status: Mapping[int, tuple[str, str]]) -> list[str]:
    return [run_id for state, run_id in status.values() if state == "done"]


def missing_runs(
    cfg: RecommendConfig, proposal: Proposal, runs: pd.DataFrame
) -> list[tuple[str, Any]]:
    """(arm name, config) of the arm × seed runs that no done, running or queued run stands for
    (a failed or cancelled one is queued again)."""
    status = run_status(cfg, proposal, runs)
    alive = ("done", "running", "queued")
    return [
        (name, config)
        for name, config in planned_runs(cfg, proposal)
        if status[name].get(config.seed, ("", ""))[0] not in alive
    ]


def progress_counts(status: Mapping[str, Mapping[int, tuple[str, str]]]) -> dict[str, int]:
    """How many planned runs are done, running, queued, failed or cancelled."""
    counts = dict.fromkeys(("done", "running", "queued", "failed", "cancelled"), 0)
    for by_seed in status.values():
        for state, _ in by_seed.values():
            counts[state] += 1
    return counts


def arm_outcomes(
    cfg: RecommendConfig, proposal: Proposal, costs: Costs | None, runs: pd.DataFrame
) -> list[ArmOutcome]:
    """Every arm's row (module docstring): full fine-tuning first, then the arms as proposed."""
    status = run_status(cfg, proposal, runs)
    results = {run.id: run.result for run in runs_of(runs)} if not runs.empty else {}
    arms: dict[str, Arm] = {}
    flags: dict[str, bool] = {}
    memory: dict[str, float | None] = {}
    for choice in proposal.choices:
        records = [results.get(i) or {} for i in done_runs(status[choice.name])]
        arms[choice.name] = Arm.from_results(choice.name, records)
        flags[choice.name] = bool(records) and all(chance_flag(r) for r in records)
        peaks = [float(r["peak_mem_mb"]) for r in records if r.get("peak_mem_mb") is not None]
        memory[choice.name] = float(np.mean(peaks)) if peaks else None
    reference = proposal.choices[0].name
    full = arms[reference]
    out = []
    for choice in proposal.choices:
        arm = arms[choice.name]
        cost = costs.get(choice.name) if costs is not None else None
        common = dict(
            name=choice.name, role=choice.role, method=choice.method, n_seeds=arm.n_seeds,
            step_time_ratio=None if cost is None else cost.step_time_ratio,
            trainable_share=None if cost is None else cost.share, peak_mem_mb=memory[choice.name],
            match=cost.match if cost is not None else "", runs=tuple(done_runs(status[choice.name])),
            at_chance=flags[choice.name],
        )  # fmt: skip
        if not arm.n_seeds:
            out.append(ArmOutcome(**common))
            continue
        mean = float(np.mean(arm.scores))
        se = (
            float(np.std(arm.scores, ddof=1) / math.sqrt(arm.n_seeds))
            if arm.n_seeds > 1
            else math.nan
        )
        if choice.name == reference:
            out.append(ArmOutcome(**common, mean=mean, se=se, verdict="reference"))
            continue
        if not full.n_seeds:
            out.append(
                ArmOutcome(**common, mean=mean, se=se, verdict="full fine-tuning not run yet")
            )
            continue
        if flags[choice.name] and flags[reference]:
            out.append(ArmOutcome(**common, mean=mean, se=se,
                                  verdict="no verdict: both at chance level"))  # fmt: skip
            continue
        c = compare(arm, full)
        out.append(ArmOutcome(**common, mean=mean, se=se, diff=c.diff, margin=c.margin,
                              verdict=c.verdict))  # fmt: skip
    return _with_frontier(out)


def _with_frontier(arms: list[ArmOutcome]) -> list[ArmOutcome]:
    """Mark the arms no other beats on cost (step-time ratio) and mean score together."""
    from dataclasses import replace

    cost = [a.step_time_ratio if a.step_time_ratio is not None else math.nan for a in arms]
    mask = pareto_front(cost, [a.mean for a in arms])
    return [replace(a, frontier=bool(m)) for a, m in zip(arms, mask, strict=True)]


# -- the sentence ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the comparison says: ``branch`` one of "recommend", "none held up", "too few seeds",
    "not tested", "full at chance"; ``candidate`` the arm recommended (None otherwise) and the
    sentence, with its numbers."""

    branch: str
    sentence: str
    candidate: str | None = None
    waiting: tuple[str, ...] = field(default=())


def cheaper_arms(arms: Sequence[ArmOutcome], budget: Budget) -> list[ArmOutcome]:
    """Arms cheaper than full (step-time ratio < 1; unknown: a trainable share < 1) and within the
    budget, cheapest first (step-time ratio, then trainable share)."""
    out = []
    for arm in arms:
        if arm.role == "reference":
            continue
        ratio, share = arm.step_time_ratio, arm.trainable_share
        cheaper = ratio < 1 if ratio is not None else (share is not None and share < 1)
        if cheaper and budget.allows(share, ratio):
            out.append(arm)
    inf = math.inf
    return sorted(out, key=lambda a: (a.step_time_ratio if a.step_time_ratio is not None else inf,
                                      a.trainable_share if a.trainable_share is not None else inf))  # fmt: skip


def _points(value: float) -> str:
    return f"{POINTS * value:+.1f}"


def _cost_words(arm: ArmOutcome) -> str:
    parts = []
    if arm.step_time_ratio is not None:
        parts.append(f"{arm.step_time_ratio:.2f}× full's step time")
    if arm.trainable_share is not None:
        parts.append(f"{100 * arm.trainable_share:.2g} % of the parameters trained")
    return ", ".join(parts)


def decide(
    arms: Sequence[ArmOutcome], delta_points: float = 1.0, budget: Budget | None = None,
    trains: Mapping[str, str] | None = None,
) -> Decision:  # fmt: skip
    """The sentence by the rule of the module docstring (δ in points of the metric)."""
    budget = budget or Budget()
    delta = delta_points / POINTS
    trains = trains or {}
    full = next((a for a in arms if a.role == "reference"), None)
    if full is None or not full.n_seeds:
        return Decision("not tested", "Not tested yet: queue the comparison (Test these / "
                        "`recommend --compare`) to learn which choice holds up against full "
                        "fine-tuning.")  # fmt: skip
    if full.at_chance:
        return Decision("full at chance", "No recommendation: full fine-tuning itself is at "
                        "chance level (it predicts one class or does not beat the majority "
                        "class), so nothing can be shown to hold up against it — train longer "
                        "or with a larger learning rate.")  # fmt: skip
    cheaper = cheaper_arms(arms, budget)
    held = [a for a in cheaper if a.held_up(delta)]
    if held:
        arm = held[0]
        what = trains.get(arm.name, arm.name)
        verdict = arm.verdict
        if "n seeds" not in verdict:
            verdict += f", n seeds = {arm.n_seeds}, {full.n_seeds}"
        sentence = (
            f"Tune {what} ({arm.name}): {_cost_words(arm)}, {_points(arm.diff)} ± "
            f"{POINTS * arm.margin:.1f} points against full fine-tuning ({verdict}) — the "
            f"cheapest choice not shown worse by more than δ = {delta_points:g} "
            f"point{'s' if delta_points != 1 else ''}."
        )
        return Decision("recommend", sentence, arm.name)
    waiting = tuple(a.name for a in cheaper if a.undecided(delta))
    if waiting:
        shown = ", ".join(waiting[:4]) + (
            f" and {len(waiting) - 4} more" if len(waiting) > 4 else ""
        )
        return Decision(
            "too few seeds",
            f"Too few seeds to tell: the intervals of {shown} still reach across −δ = "
            f"−{delta_points:g} point{'s' if delta_points != 1 else ''} (or have none yet), so no "
            "cheaper choice is shown to hold up or to fall short — add seeds (or wait for the "
            "runs still training).",
            waiting=waiting,
        )
    best = max(cheaper, key=lambda a: a.diff, default=None)
    tail = (
        f" (the best cheaper one, {best.name}, {_points(best.diff)} ± {POINTS * best.margin:.1f} "
        f"points, {best.verdict})"
        if best is not None and math.isfinite(best.diff)
        else ""
    )
    scope = " within the budget" if budget.kind else ""
    return Decision(
        "none held up",
        f"No cheaper choice{scope} held up within δ = {delta_points:g} "
        f"point{'s' if delta_points != 1 else ''}: fine-tune the whole model{tail}.",
    )


# -- JSON ---------------------------------------------------------------------------------------


def recommendation_json(
    cfg: RecommendConfig,
    proposal: Proposal,
    costs: Costs | None,
    arms: Sequence[ArmOutcome] | None,
    decision: Decision,
    evidence: Evidence | None = None,
) -> dict[str, Any]:
    """``{"model", "data", "budget", "candidates": [...], "comparison": [...] (when compared),
    "recommendation": {"candidate", "sentence"}}`` (docs/reference: recommend --json)."""
    family = evidence.family if evidence is not None else None
    candidates = []
    for choice in proposal.candidates:
        cost = costs.get(choice.name) if costs is not None else None
        candidates.append({
            "name": choice.name,
            "method": choice.method,
            "trains": choice.trains,
            "trainable_share": None if cost is None else cost.share,
            "step_time_ratio": None if cost is None else cost.step_time_ratio,
            "evidence": choice.evidence,
            "lora": None if choice.lora is None else choice.lora.to_dict(family),
        })  # fmt: skip
    out: dict[str, Any] = {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "budget": cfg.budget.to_dict(),
        "candidates": candidates,
    }
    if arms and any(a.n_seeds for a in arms):
        out["comparison"] = [
            {
                "arm": a.name,
                "mean": a.mean,
                "se": a.se,
                "n_seeds": a.n_seeds,
                "diff_vs_full": None if a.role == "reference" else a.diff,
                "margin": None if a.role == "reference" else a.margin,
                "verdict": a.verdict,
                "step_time_ratio": a.step_time_ratio,
                "trainable_share": a.trainable_share,
            }
            for a in arms
        ]
    out["recommendation"] = {"candidate": decision.candidate, "sentence": decision.sentence}
    return json_ready(out)


def comparison_frame(arms: Sequence[ArmOutcome]) -> pd.DataFrame:
    """The table the page and the report show: one row per arm, in points where a difference."""
    rows = []
    for a in arms:
        rows.append({
            "arm": a.name, "role": a.role, "n_seeds": a.n_seeds, "score": a.mean, "se": a.se,
            "diff vs full (points)": None if a.role == "reference" else POINTS * a.diff,
            "margin t·se (points)": None if a.role == "reference" else POINTS * a.margin,
            "verdict": a.verdict, "step time ×full": a.step_time_ratio,
            "trainable %": None if a.trainable_share is None else 100 * a.trainable_share,
            "peak MB": a.peak_mem_mb, "frontier": "yes" if a.frontier else "",
            "budget match": a.match,
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    return frame.replace({np.nan: None})
