"""The comparison at equal budget and the sentence (docs/explanation/recommendation.md, "The
comparison" and "The sentence").

The comparison is a planned experiment (`analysis.runs.planner`): full fine-tuning (the
reference) and every other choice, seeded by the one seed design every comparison uses
(`analysis.runs.planner.SEED_DESIGN`: independent seeds, each arm compared with full by Welch's
test; under common random numbers the paired t, seed by seed). The arms that may be the answer
are those cheaper than full — measured step-time ratio < 1 (unknown: a trainable share < 1) —
and within the budget, cheapest first (the timed step-time ratio, then the trainable share).

Each arm's row: d = mean score(arm) − mean score(full), d̄ ± c · se with the design's test,
c = t_{1 − α/K, df} adjusted for the K looks its design may take
(`analysis.runs.sequential`, Bonferroni over looks; the fixed grid looks once, K = 1), and its
status — **held up** (lower end ≥ −δ), **shown worse** (upper end < −δ), **undecided**, or **not
needed** (a cheaper arm held up). The design (`RecommendConfig.design`): sequential rounds
(default: r₀ seeds each, then one more seed to full and every undecided arm, up to R_max), the
fixed grid, or the whole table (every arm to R_max). Runs are matched to an arm by run group and
seed, so unlike runs are never averaged; a seed trained twice counts once (its newest run). Two
arms whose runs are all at chance level get no verdict.

The sentence: the cheapest arm that held up, with its cost, its difference and interval, n seeds,
δ and the test; else "no cheaper choice held up within δ: fine-tune the whole model" when every
cheaper arm was shown worse; else, once the design has no seed left to add, "undecided after
R_max seeds", each undecided arm's interval beside it; while rounds remain, "not decided yet".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.compare import Arm
from analysis.io import json_ready
from analysis.recommend.budget import Costs
from analysis.recommend.choices import Proposal
from analysis.recommend.config import Budget, RecommendConfig
from analysis.runs.chance import chance_flag
from analysis.runs.planner import (
    FIXED,
    Experiment,
    PlannedArm,
    Stand,
    design_test,
    judge,
    look_at,
    seed_list,
    status_of,
)
from analysis.runs.results import pareto_front
from analysis.runs.sequential import (
    HELD_UP,
    NOT_NEEDED,
    SHOWN_WORSE,
    UNDECIDED,
    SequentialDesign,
    classify,
)

if TYPE_CHECKING:
    from analysis.recommend.evidence import Evidence

POINTS = 100.0  # one point of a task's metric is 0.01
REFERENCE = "full fine-tuning"
NOT_RUN = "not run yet"
ALPHA = 0.025  # one-sided, per arm: the chance of holding up an arm whose true difference is −δ
VERDICTS = {HELD_UP: "held up", SHOWN_WORSE: "shown worse", UNDECIDED: "undecided",
            NOT_NEEDED: "not needed: a cheaper arm held up"}  # fmt: skip


@dataclass(frozen=True)
class ArmOutcome:
    """One arm's row of the comparison: its runs' test scores (mean ± s.e. over n_seeds), the
    difference to full with its margin c · se, the test and critical value c it comes from, its
    status and verdict, and its costs (``step_time_ratio``: timed side by side, what orders the
    arms; ``run_step_time_ratio``: from the finished runs' own steps, once there are some)."""

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
    status: str = ""  # held up / shown worse / undecided / not needed ("": the reference, none)
    test: str = ""  # "paired" / "welch": the interval's test
    c: float = math.nan  # the interval's critical value (adjusted for looks)
    n_pairs: int = 0  # the seeds the interval rests on
    eligible: bool = True  # may be the answer: cheaper than full and within the budget
    run_step_time_ratio: float | None = None

    @property
    def lo(self) -> float:
        return self.diff - self.margin

    @property
    def hi(self) -> float:
        return self.diff + self.margin

    def judged(self, delta: float) -> str:
        """Its status; for a row built without one, its interval's against −δ."""
        if self.status:
            return self.status
        return classify(self.lo, self.hi, delta) if self.role != "reference" else ""


# -- the experiment ------------------------------------------------------------------------------


def cheaper_order(proposal: Proposal, costs: Costs | None, budget: Budget) -> list[str]:
    """The arms that may be the answer, cheapest first (module docstring)."""
    rows = []
    for choice in proposal.choices[1:]:
        cost = costs.get(choice.name) if costs is not None else None
        ratio = None if cost is None else cost.step_time_ratio
        share = None if cost is None else cost.share
        cheaper = ratio < 1 if ratio is not None else (share is not None and share < 1)
        if cheaper and budget.allows(share, ratio):
            rows.append((ratio if ratio is not None else math.inf,
                         share if share is not None else math.inf, choice.name))  # fmt: skip
    return [name for _, _, name in sorted(rows)]


def design_of(cfg: RecommendConfig) -> SequentialDesign:
    """The rule the comparison is judged by: the sequential design (r₀ = the given seeds, R_max,
    α, δ, the test of the seed design); the fixed grid looks once, when every seed is in (a grid
    of one seed gives no interval)."""
    n = max(2, len(cfg.seeds))
    if cfg.design == FIXED:
        return SequentialDesign(cfg.delta / POINTS, n, n, ALPHA, design_test())
    return SequentialDesign(cfg.delta / POINTS, n, cfg.max_seeds, ALPHA, design_test())


def experiment_of(cfg: RecommendConfig, proposal: Proposal, costs: Costs | None) -> Experiment:
    """The comparison as a planned experiment: full fine-tuning and every choice, the seeds, the
    design's policy and rule, and the arms that may be the answer in cost order."""
    base = cfg.base_run()
    arms = tuple(
        PlannedArm(choice.name, choice.config(base), reference=(i == 0))
        for i, choice in enumerate(proposal.choices)
    )
    fixed = cfg.design == FIXED
    return Experiment(
        arms=arms, seeds=cfg.seeds if fixed else seed_list(cfg.seeds, cfg.max_seeds),
        policy=cfg.design, order=tuple(cheaper_order(proposal, costs, cfg.budget)),
        design=None if fixed else design_of(cfg),
    )  # fmt: skip


def planned_runs(
    cfg: RecommendConfig, proposal: Proposal, costs: Costs | None = None
) -> list[tuple[str, Any]]:
    """(arm name, FinetuneConfig) of every arm × the seeds every arm starts with (the first
    round; the whole grid of a fixed design), the reference first."""
    experiment = experiment_of(cfg, proposal, costs)
    return [
        (arm.name, arm.run(experiment.training_seed(arm, i)))
        for arm in experiment.arms
        for i in range(len(cfg.seeds))
    ]


def arm_outcomes(
    cfg: RecommendConfig,
    proposal: Proposal,
    timed: Costs | None,
    stands: Mapping[str, Mapping[int, Stand]],
    refined: Costs | None = None,
) -> list[ArmOutcome]:
    """Every arm's row (module docstring): full fine-tuning first, then the arms as proposed.
    ``stands``: arm → seed index → the run standing for it (`analysis.runs.planner.standings`);
    ``timed``: the costs measured side by side; ``refined``: the same with finished runs' step
    times."""
    experiment = experiment_of(cfg, proposal, timed)
    design = design_of(cfg)
    result = judge(experiment, stands, design)
    reference = proposal.choices[0].name
    done = {
        name: [s.result or {} for _, s in sorted(by_seed.items()) if s.status == "done"]
        for name, by_seed in stands.items()
    }
    at_chance = {name: bool(r) and all(chance_flag(x) for x in r) for name, r in done.items()}
    out = []
    for choice in proposal.choices:
        records = done[choice.name]
        arm = Arm.from_results(choice.name, records)
        cost = timed.get(choice.name) if timed is not None else None
        run_cost = refined.get(choice.name) if refined is not None else None
        peaks = [float(r["peak_mem_mb"]) for r in records if r.get("peak_mem_mb") is not None]
        row = ArmOutcome(
            name=choice.name, role=choice.role, method=choice.method, n_seeds=arm.n_seeds,
            step_time_ratio=None if cost is None else cost.step_time_ratio,
            trainable_share=None if cost is None else cost.share,
            peak_mem_mb=float(np.mean(peaks)) if peaks else None,
            match=cost.match if cost is not None else "",
            runs=tuple(s.run_id for _, s in sorted(stands[choice.name].items())
                       if s.status == "done"),
            at_chance=at_chance[choice.name], eligible=choice.name in experiment.answers,
            run_step_time_ratio=(run_cost.step_time_ratio
                                 if run_cost is not None and run_cost.runs else None),
        )  # fmt: skip
        if arm.n_seeds:
            se = float(np.std(arm.scores, ddof=1) / math.sqrt(arm.n_seeds)) if arm.n_seeds > 1 else math.nan  # fmt: skip
            row = dataclasses.replace(row, mean=float(np.mean(arm.scores)), se=se)
        out.append(_judged(row, reference, result, experiment, stands, design, at_chance))
    return _with_frontier(out)


def _judged(row, reference, result, experiment, stands, design, at_chance) -> ArmOutcome:
    """``row`` with its interval, status and verdict against full fine-tuning."""
    if row.name == reference:
        return dataclasses.replace(row, verdict="reference")
    status = status_of(result, row.name) or look_at(experiment, stands, row.name, design)
    if not row.n_seeds:
        if not row.eligible and experiment.policy != FIXED:
            return dataclasses.replace(row, status=NOT_NEEDED, test=design.test,
                                       verdict="not trained: not cheaper than full, or over the "
                                       "budget")  # fmt: skip
        verdict = VERDICTS[NOT_NEEDED] if status.status == NOT_NEEDED else NOT_RUN
        return dataclasses.replace(row, status=status.status, verdict=verdict, test=design.test)
    if not stands[reference]:
        return dataclasses.replace(row, verdict="full fine-tuning not run yet")
    if at_chance[row.name] and at_chance[reference]:
        return dataclasses.replace(row, verdict="no verdict: both at chance level")
    verdict = VERDICTS[status.status]
    if not row.eligible:
        verdict += " (not the answer: not cheaper than full, or over the budget)"
    return dataclasses.replace(
        row, diff=status.diff, margin=status.margin, status=status.status, verdict=verdict,
        test=status.test, c=status.c, n_pairs=status.n,
    )  # fmt: skip


def _with_frontier(arms: list[ArmOutcome]) -> list[ArmOutcome]:
    """Mark the arms no other beats on cost (step-time ratio) and mean score together."""
    cost = [a.step_time_ratio if a.step_time_ratio is not None else math.nan for a in arms]
    mask = pareto_front(cost, [a.mean for a in arms])
    return [dataclasses.replace(a, frontier=bool(m)) for a, m in zip(arms, mask, strict=True)]


# -- the sentence ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the comparison says: ``branch`` one of "recommend", "none held up", "undecided"
    (after R_max seeds), "in progress" (rounds remain), "not tested", "full at chance";
    ``candidate`` the arm recommended (None otherwise), the sentence with its numbers, and the
    arms still undecided (``waiting``)."""

    branch: str
    sentence: str
    candidate: str | None = None
    waiting: tuple[str, ...] = field(default=())
    final: bool = True


def cheaper_arms(arms: Sequence[ArmOutcome], budget: Budget) -> list[ArmOutcome]:
    """The rows that may be the answer (cheaper than full, within the budget), cheapest first
    (timed step-time ratio, then trainable share)."""
    out = []
    for arm in arms:
        if arm.role == "reference" or not arm.eligible:
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


def _delta_words(delta_points: float) -> str:
    return f"δ = {delta_points:g} point{'s' if delta_points != 1 else ''}"


def _cost_words(arm: ArmOutcome) -> str:
    parts = []
    timed, runs = arm.step_time_ratio, arm.run_step_time_ratio
    shown = runs if runs is not None else timed
    if shown is not None:
        words = f"{shown:.2f}× full's step time"
        # the arms are ordered by the timed ratio; a run's own steps can tell another story (an
        # arm that draws its layers anew for every seed costs what each draw costs)
        if runs is not None and timed is not None and f"{runs:.2f}" != f"{timed:.2f}":
            words += f" in its runs ({timed:.2f}× timed)"
        parts.append(words)
    if arm.trainable_share is not None:
        parts.append(f"{100 * arm.trainable_share:.2g} % of the parameters trained")
    return ", ".join(parts)


def _test_words(arm: ArmOutcome, full_seeds: int) -> str:
    """``paired t over 4 seeds, c = 4.03 for 8 looks`` (how the interval was made)."""
    if arm.test == "paired":
        what = f"paired t over {arm.n_pairs} seeds"
    elif arm.test == "welch":
        what = f"Welch's t, n seeds = {arm.n_seeds}, {full_seeds}"
    else:
        return f"n seeds = {arm.n_seeds}, {full_seeds}"
    return f"{what}, c = {arm.c:.2f}" if math.isfinite(arm.c) else what


def interval_words(arm: ArmOutcome) -> str:
    """``-0.4 ± 1.1 points [-1.5, +0.7]`` (or that there is no interval yet)."""
    if not math.isfinite(arm.margin):
        return f"no interval yet (n seeds = {arm.n_seeds})"
    return (f"{_points(arm.diff)} ± {POINTS * arm.margin:.1f} points "
            f"[{_points(arm.lo)}, {_points(arm.hi)}]")  # fmt: skip


def decide(
    arms: Sequence[ArmOutcome], delta_points: float = 1.0, budget: Budget | None = None,
    trains: Mapping[str, str] | None = None, final: bool = True, looks: int = 1,
) -> Decision:  # fmt: skip
    """The sentence by the rule of the module docstring (δ in points of the metric; ``final``:
    the design has no seed left to add for any arm that matters; ``looks``: K of its boundary)."""
    budget = budget or Budget()
    delta = delta_points / POINTS
    trains = trains or {}
    full = next((a for a in arms if a.role == "reference"), None)
    if full is None or not full.n_seeds:
        return Decision("not tested", "Not tested yet: queue the comparison (Test these / "
                        "`recommend --compare`) to learn which choice holds up against full "
                        "fine-tuning.", final=False)  # fmt: skip
    if full.at_chance:
        return Decision("full at chance", "No recommendation: full fine-tuning itself is at "
                        "chance level (it predicts one class or does not beat the majority "
                        "class), so nothing can be shown to hold up against it — train longer "
                        "or with a larger learning rate.")  # fmt: skip
    cheaper = cheaper_arms(arms, budget)
    looked = f"{looks} look{'s' if looks != 1 else ''}"
    held = [a for a in cheaper if a.judged(delta) == HELD_UP]
    if held:
        arm = held[0]
        tail = "" if final else " (cheaper choices are still being trained)"
        sentence = (
            f"Tune {trains.get(arm.name, arm.name)} ({arm.name}): {_cost_words(arm)}, "
            f"{interval_words(arm)} against full fine-tuning ({_test_words(arm, full.n_seeds)}, "
            f"adjusted for {looked}) — the cheapest choice not shown worse by more than "
            f"{_delta_words(delta_points)}{tail}."
        )
        return Decision("recommend", sentence, arm.name, final=final)
    scope = " within the budget" if budget.kind else ""
    if cheaper and all(a.judged(delta) == SHOWN_WORSE for a in cheaper):
        best = max(cheaper, key=lambda a: a.diff)
        return Decision(
            "none held up",
            f"No cheaper choice{scope} held up within {_delta_words(delta_points)}: fine-tune "
            f"the whole model (every cheaper one was shown worse; the best, {best.name}, "
            f"{interval_words(best)}).",
        )
    waiting = tuple(a.name for a in cheaper if a.judged(delta) == UNDECIDED)
    shown = "; ".join(f"{a.name} {interval_words(a)}" for a in cheaper if a.name in waiting[:4])
    more = f" and {len(waiting) - 4} more" if len(waiting) > 4 else ""
    if not cheaper:
        return Decision("none held up", f"No choice{scope} is cheaper than full fine-tuning: "
                        "fine-tune the whole model.")  # fmt: skip
    if final:
        seeds = max((a.n_seeds for a in cheaper), default=0)
        return Decision(
            "undecided",
            f"Undecided after {seeds} seeds: {shown}{more} stay within reach of −δ "
            f"({_delta_words(delta_points)}, adjusted for {looked}) — more seeds, a larger test "
            "part or a larger δ could settle it.",
            waiting=waiting,
        )
    return Decision(
        "in progress",
        f"Not decided yet: {shown}{more} get more seeds as their runs finish "
        f"({_delta_words(delta_points)}, adjusted for {looked}).",
        waiting=waiting, final=False,
    )  # fmt: skip


# -- JSON ---------------------------------------------------------------------------------------

# The degrees of freedom of each test's critical value, as the JSON's boundary writes them.
DF_WORDS = {"paired": "n − 1", "welch": "Welch–Satterthwaite df"}


def design_json(cfg: RecommendConfig) -> dict[str, Any]:
    """``{"kind", "r0", "max_seeds", "alpha", "delta", "boundary", "test"}`` of the comparison."""
    design = design_of(cfg)
    return {"kind": cfg.design, "r0": design.r0, "max_seeds": design.r_max, "alpha": design.alpha,
            "delta": cfg.delta, "test": design.test,
            "boundary": f"Bonferroni over {design.looks} look{'s' if design.looks != 1 else ''}: "
                        f"c = t(1 − α/{design.looks}, {DF_WORDS[design.test]})"}  # fmt: skip


def recommendation_json(
    cfg: RecommendConfig,
    proposal: Proposal,
    costs: Costs | None,
    arms: Sequence[ArmOutcome] | None,
    decision: Decision,
    evidence: Evidence | None = None,
) -> dict[str, Any]:
    """``{"model", "data", "budget", "design", "candidates": [...], "comparison": [...] (when
    compared), "runs_trained", "recommendation": {"candidate", "sentence", "branch", "final"}}``
    (docs/reference/json.md: recommend --json)."""
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
        "design": design_json(cfg),
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
                "lo": None if a.role == "reference" else a.lo,
                "hi": None if a.role == "reference" else a.hi,
                "test": None if a.role == "reference" else (a.test or None),
                "status": None if a.role == "reference" else (a.status or None),
                "verdict": a.verdict,
                "step_time_ratio": a.step_time_ratio,
                "run_step_time_ratio": a.run_step_time_ratio,
                "trainable_share": a.trainable_share,
            }
            for a in arms
        ]
    out["runs_trained"] = sum(a.n_seeds for a in arms) if arms else 0
    out["recommendation"] = {"candidate": decision.candidate, "sentence": decision.sentence,
                             "branch": decision.branch, "final": decision.final}  # fmt: skip
    return json_ready(out)


def comparison_frame(arms: Sequence[ArmOutcome]) -> pd.DataFrame:
    """The table the page and the report show: one row per arm, in points where a difference."""
    rows = []
    for a in arms:
        ref = a.role == "reference"
        rows.append({
            "arm": a.name, "role": a.role, "n_seeds": a.n_seeds, "score": a.mean, "se": a.se,
            "diff vs full (points)": None if ref else POINTS * a.diff,
            "margin c·se (points)": None if ref else POINTS * a.margin,
            "lo (points)": None if ref else POINTS * a.lo,
            "hi (points)": None if ref else POINTS * a.hi,
            "test": None if ref else (a.test or None), "verdict": a.verdict,
            "step time ×full": a.step_time_ratio,
            "step time ×full (runs)": a.run_step_time_ratio,
            "trainable %": None if a.trainable_share is None else 100 * a.trainable_share,
            "peak MB": a.peak_mem_mb, "frontier": "yes" if a.frontier else "",
            "budget match": a.match,
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    return frame.replace({np.nan: None})
