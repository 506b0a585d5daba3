"""The experiment planner: arms × seeds → the runs to queue, the run that stands for each planned
run, and the rounds (docs/explanation/statistics.md, "Sequential rounds").

One planner for every comparison tunescope trains — the recommendation's arms against full
fine-tuning, the Paper check's run claims, the Fine-tune page's sweeps. An `Experiment` is its
arms (each a config whose seed the planner sets), the seeds, how seeds turn into each arm's
training seeds (`SEED_DESIGN`, `analysis.seeding.arm_seed`) and a policy:

- ``fixed``: every arm × every seed (the grid), judged once at the end;
- ``sequential``: rounds, cheapest arm first (`analysis.runs.sequential`): every arm starts with
  r₀ seeds; each later round adds one seed to full fine-tuning and to every arm still undecided,
  up to R_max; once an arm holds up, costlier arms get no more seeds and their queued or running
  runs are cancelled ("not needed");
- ``whole-table``: every arm to R_max seeds, under the sequential design's boundary.

A planned run is matched to the database by its run group and training seed
(`analysis.runs.results.group_of`): a done run stands for it (the newest), else a running or
queued one, else the newest failed or cancelled one (which is queued again).

An experiment with more than one round is stored with its runs (`RunsDB.save_experiment`, keyed
by the runs' sweep id): the process that records a run's end advances it (`advance`), so the
rounds go on whether or not a page or a command line is still watching.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analysis.compare import Arm, Comparison, compare
from analysis.finetune.config import FinetuneConfig
from analysis.runs.record import runs_of
from analysis.runs.results import group_of
from analysis.runs.sequential import (
    NOT_NEEDED,
    UNDECIDED,
    ArmStatus,
    Plan,
    SequentialDesign,
    look,
    plan,
)
from analysis.seeding import DESIGNS, arm_seed

if TYPE_CHECKING:
    import pandas as pd

    from analysis.runs.db import RunsDB

FIXED, SEQUENTIAL, WHOLE_TABLE = "fixed", "sequential", "whole-table"
POLICIES = (FIXED, SEQUENTIAL, WHOLE_TABLE)
# The seed design every planned comparison uses, chosen by measurement on the built-in demo
# (docs/explanation/statistics.md, "Seeds"): independent seeds, compared by Welch's test.
SEED_DESIGN = "independent"
TEST_OF = {"common": "paired", "independent": "welch"}
STATES = ("done", "running", "queued", "failed", "cancelled")  # best stand-in first
ALIVE = ("done", "running", "queued")


def design_test(seed_design: str = SEED_DESIGN) -> str:
    """The test a comparison planned under ``seed_design`` uses: paired t under common random
    numbers, Welch under independent seeds."""
    return TEST_OF[seed_design]


def planned_compare(a: Arm, b: Arm) -> Comparison:
    """A − B for two arms of one planned comparison (the Paper check's claims, the Heads page's
    selectors, the Fine-tune page's sweep against full), by the test their seeds make valid: the
    paired t when both ran the same seeds (at least two: one seed's runs share every stream,
    `analysis.seeding`, so their scores are not independent), else Welch's; the comparison says
    which."""
    pairable = bool(a.seeds) and set(a.seeds) == set(b.seeds) and len(a.seeds) >= 2
    return compare(a, b, test="paired" if pairable else "welch")


@dataclass(frozen=True)
class PlannedArm:
    """One arm: its name, the run it trains (``config``, whose seed the planner sets), whether it
    is the reference (full fine-tuning) and the sweep family its runs are recorded under."""

    name: str
    config: FinetuneConfig
    reference: bool = False
    family: str | None = None

    def run(self, seed: int) -> FinetuneConfig:
        return dataclasses.replace(self.config, seed=int(seed))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "config": self.config.to_dict(), "reference": self.reference,
                "family": self.family}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedArm:
        return cls(str(data["name"]), FinetuneConfig.from_dict(data["config"]),
                   bool(data.get("reference")), data.get("family"))  # fmt: skip


@dataclass(frozen=True)
class Stand:
    """The run that stands for a planned run: its status, id, (done) result and device."""

    status: str
    run_id: str
    result: dict[str, Any] | None = None
    device: str | None = None


@dataclass(frozen=True)
class Experiment:
    """Arms × seeds under a policy (module docstring).

    arms: the reference (for ``sequential`` and ``whole-table``: exactly one) and the other arms,
    cheapest first; order: the arms that may be the answer, cheapest first (None: every arm but
    the reference, as given; an arm outside a budget is left out); seeds: the seed list — a ``fixed`` experiment runs all of them, the others
    its first ``design.r_max``; design: the sequential rule (δ, r₀, R_max, α, the test) —
    required by ``sequential`` and ``whole-table``; a ``fixed`` experiment judged by a rule
    looks once, with every seed (`judging_design`).
    """

    arms: tuple[PlannedArm, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    policy: str = FIXED
    order: tuple[str, ...] | None = None
    design: SequentialDesign | None = None
    seed_design: str = SEED_DESIGN

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"Arm names must be distinct (got {names}).")
        if self.order is not None:
            object.__setattr__(self, "order", tuple(self.order))
            unknown = set(self.order) - {a.name for a in self.others}
            if unknown or len(set(self.order)) != len(self.order):
                raise ValueError(f"order {list(self.order)} must name compared arms, once each.")
        if self.policy not in POLICIES:
            raise ValueError(
                f"Unknown policy {self.policy!r}: choose one of {', '.join(POLICIES)}."
            )
        if self.seed_design not in DESIGNS:
            raise ValueError(f"Unknown seed design {self.seed_design!r}.")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"Seeds must be distinct whole numbers ≥ 0 (got {self.seeds}).")
        if self.policy != FIXED:
            if self.design is None:
                raise ValueError(f"A {self.policy} experiment needs its design (δ, r₀, R_max).")
            if sum(a.reference for a in self.arms) != 1:
                raise ValueError(f"A {self.policy} experiment needs exactly one reference arm.")
            if len(self.seeds) < self.design.r_max:
                raise ValueError(
                    f"{len(self.seeds)} seeds given, but the design goes to R_max = "
                    f"{self.design.r_max}."
                )

    @property
    def reference(self) -> PlannedArm | None:
        return next((a for a in self.arms if a.reference), None)

    @property
    def others(self) -> tuple[PlannedArm, ...]:
        """The arms compared with the reference, cheapest first."""
        return tuple(a for a in self.arms if not a.reference)

    @property
    def answers(self) -> tuple[str, ...]:
        """The arms that may be the answer, cheapest first."""
        return self.order if self.order is not None else tuple(a.name for a in self.others)

    @property
    def most_seeds(self) -> int:
        return len(self.seeds) if self.policy == FIXED else self.design.r_max

    def training_seed(self, arm: PlannedArm, i: int) -> int:
        """Arm ``arm``'s i-th training seed (`analysis.seeding.arm_seed` of the i-th seed)."""
        return arm_seed(arm.name, self.seeds[i], self.seed_design, arm.reference)

    def judging_design(self, delta: float, alpha: float = 0.025) -> SequentialDesign:
        """The rule the comparison is judged by: the experiment's design; a ``fixed`` one looks
        once, when every seed is in (r₀ = R_max = the number of seeds)."""
        if self.design is not None:
            return self.design
        n = max(2, len(self.seeds))
        return SequentialDesign(delta, n, n, alpha, design_test(self.seed_design))

    def to_dict(self) -> dict[str, Any]:
        design = None if self.design is None else dataclasses.asdict(self.design)
        order = None if self.order is None else list(self.order)
        return {"arms": [a.to_dict() for a in self.arms], "seeds": list(self.seeds),
                "policy": self.policy, "order": order, "design": design,
                "seed_design": self.seed_design}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Experiment:
        design = data.get("design")
        return cls(
            arms=tuple(PlannedArm.from_dict(a) for a in data["arms"]),
            seeds=tuple(data["seeds"]), policy=data["policy"], order=data.get("order"),
            design=None if design is None else SequentialDesign(**design),
            seed_design=data.get("seed_design", SEED_DESIGN),
        )  # fmt: skip


def seed_list(first: Sequence[int], n: int) -> tuple[int, ...]:
    """``first`` continued with the next whole numbers not in it, to ``n`` seeds (at least
    ``first``): the seeds of a design that starts with ``first`` and goes to n."""
    seeds = [int(s) for s in first]
    start = max(seeds, default=-1) + 1
    extra = (s for s in itertools.count(start) if s not in seeds)
    return tuple(seeds + list(itertools.islice(extra, max(0, n - len(seeds)))))


# -- where the planned runs stand ------------------------------------------------------------------


def stand_index(runs: pd.DataFrame) -> dict[tuple[str, int], Stand]:
    """(run group, training seed) → the run that stands for it among ``runs`` (rows of
    ``RunsDB.list_runs``, newest first): a done one (the newest), else a running or queued
    one, else the newest failed or cancelled one."""
    best: dict[tuple[str, int], tuple[int, Stand]] = {}
    for run in runs_of(runs) if len(runs) else []:
        if run.status not in STATES or not run.stored:
            continue
        key = (run.group, int(run.stored.get("seed", 0)))
        rank = STATES.index(run.status)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, Stand(run.status, run.id, run.result, run.device))
    return {key: stand for key, (_, stand) in best.items()}


def planned_key(config: FinetuneConfig, runs: pd.DataFrame) -> tuple[str, int]:
    """(run group, training seed) of a planned run among ``runs``: the group a run of ``config``
    joins when queued (`analysis.runs.results.group_of`)."""
    return group_of(config.to_dict(), runs), int(config.seed)


def standings(experiment: Experiment, runs: pd.DataFrame) -> dict[str, dict[int, Stand]]:
    """Arm → seed index i → the run that stands for the arm's i-th run (`stand_index`); absent
    where no run does."""
    index = stand_index(runs)
    out: dict[str, dict[int, Stand]] = {}
    for arm in experiment.arms:
        found = {}
        for i in range(experiment.most_seeds):
            hit = index.get(planned_key(arm.run(experiment.training_seed(arm, i)), runs))
            if hit is not None:
                found[i] = hit
        out[arm.name] = found
    return out


def scores(standing: Mapping[int, Stand]) -> dict[int, float]:
    """Seed index → test score of the done runs (a run without a finite score left out)."""
    out = {}
    for i, stand in standing.items():
        score = (stand.result or {}).get("score") if stand.status == "done" else None
        if score is not None and math.isfinite(float(score)):
            out[i] = float(score)
    return out


def judge(
    experiment: Experiment, stands: Mapping[str, Mapping[int, Stand]], design: SequentialDesign
) -> Plan:
    """The status against the reference of every arm that may be the answer (cheapest first),
    after the runs done so far, by the sequential rule of ``design``
    (`analysis.runs.sequential.plan`)."""
    order = list(experiment.answers)
    full = scores(stands[experiment.reference.name])
    return plan(full, {name: scores(stands[name]) for name in order}, order, design)


def wanted(experiment: Experiment, stands: Mapping[str, Mapping[int, Stand]]) -> dict[str, int]:
    """Arm → how many of its seeds (the first n) should have a run now, by the policy: every seed
    (``fixed``), R_max (``whole-table``), or the next round of the sequential rule — the arms it
    leaves out keep the runs they have, and an arm that may not be the answer gets none
    (``sequential``)."""
    if experiment.policy == FIXED:
        return {a.name: len(experiment.seeds) for a in experiment.arms}
    if experiment.policy == WHOLE_TABLE:
        return {a.name: experiment.design.r_max for a in experiment.arms}
    result = judge(experiment, stands, experiment.design)
    have = {name: len(scores(by_seed)) for name, by_seed in stands.items()}
    out = {name: have[name] for name in stands}
    out.update(result.next_seeds)
    for status in result.arms:
        if status.status == NOT_NEEDED:
            out[status.name] = have[status.name]
    out[experiment.reference.name] = result.full_seeds
    considered = {experiment.reference.name, *(a.name for a in result.arms)}
    for name in out:
        if name not in considered:
            out[name] = have[name]
    return out


@dataclass(frozen=True)
class Steps:
    """What to do now: the runs to queue ((arm, config), reference first, then the arms in
    order, each seed in turn) and the queued or running runs no longer wanted (their ids)."""

    queue: list[tuple[PlannedArm, FinetuneConfig]] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)


def next_steps(experiment: Experiment, runs: pd.DataFrame, retry: bool = True) -> Steps:
    """The runs the policy wants that no done, running or queued run stands for (nor, without
    ``retry``, a failed or cancelled one: a round taken as a run ends never re-queues a failure),
    and the queued or running runs beyond what it wants (`wanted`: an arm not needed any more)."""
    stands = standings(experiment, runs)
    standing = ALIVE if retry else STATES
    want = wanted(experiment, stands)
    queue, cancel = [], []
    for arm in experiment.arms:
        by_seed = stands[arm.name]
        for i in range(experiment.most_seeds):
            stand = by_seed.get(i)
            if i < want[arm.name]:
                if stand is None or stand.status not in standing:
                    queue.append((arm, arm.run(experiment.training_seed(arm, i))))
            elif stand is not None and stand.status in ("queued", "running"):
                cancel.append(stand.run_id)  # a running one stops at its next step
    return Steps(queue, cancel)


def apply(db: RunsDB, experiment: Experiment, steps: Steps, sweep_id: str | None) -> list[str]:
    """Cancel the runs ``steps`` no longer wants and queue the runs it does (recorded
    under ``sweep_id`` and each arm's family); returns the new run ids."""
    if steps.cancel:  # the experiment goes on: its own cancellations do not stop it
        db.cancel_runs(steps.cancel, stop=False)
    return [db.enqueue(cfg, sweep_id=sweep_id, family=arm.family) for arm, cfg in steps.queue]


def start(db: RunsDB, experiment: Experiment, runs: pd.DataFrame, sweep_id: str) -> list[str]:
    """Queue what ``experiment`` needs now (failed runs again too) and, when it takes more than
    one round, keep it under ``sweep_id`` so that its rounds go on as its runs end (`advance`).
    Returns the new run ids."""
    if experiment.policy == SEQUENTIAL:
        db.save_experiment(sweep_id, experiment.to_dict())
    return apply(db, experiment, next_steps(experiment, runs), sweep_id)


def advance(db: RunsDB, sweep_id: str | None) -> list[str]:
    """Take the next round of the stored experiment ``sweep_id`` (nothing when there is none or
    it was stopped): what the process that records a run's end calls. Returns the new run ids.
    Rounds are taken one process at a time (`RunsDB.experiment_lock`)."""
    if not sweep_id or db.experiment_spec(sweep_id) is None:
        return []
    with db.experiment_lock(sweep_id):
        spec = db.experiment_spec(sweep_id)
        if spec is None:
            return []
        experiment = Experiment.from_dict(spec)
        config = experiment.arms[0].config
        runs = db.list_runs(model=config.model.name, data=config.data.name)
        return apply(db, experiment, next_steps(experiment, runs, retry=False), sweep_id)


# -- where the experiment is ----------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Counts of the planned runs by status, and — for a rule-judged experiment — the round, the
    arms decided (of those that may be the answer) and the most runs it may still train."""

    counts: dict[str, int]
    planned: int
    round: int | None = None
    decided: int = 0
    in_play: int = 0
    most_still: int | None = None

    def text(self) -> str:
        done = self.counts["done"]
        parts = [f"{done} of {self.planned} runs done"]
        if self.counts["running"] or self.counts["queued"]:
            parts.append(f"{self.counts['running']} running, {self.counts['queued']} queued")
        failed = self.counts["failed"] + self.counts["cancelled"]
        if failed:
            parts.append(f"{failed} failed or cancelled")
        if self.round is not None:
            parts.append(f"round {self.round}, {self.decided} of {self.in_play} arms decided")
            if self.most_still:
                parts.append(f"at most {self.most_still} more runs")
        return "; ".join(parts)


def progress(experiment: Experiment, runs: pd.DataFrame) -> Progress:
    """Where ``experiment`` stands (`Progress`)."""
    stands = standings(experiment, runs)
    want = wanted(experiment, stands)
    counts = dict.fromkeys(STATES, 0)
    planned = 0
    for arm in experiment.arms:
        for i in range(want[arm.name]):
            planned += 1
            stand = stands[arm.name].get(i)
            if stand is not None:
                counts[stand.status] += 1
    if experiment.policy == FIXED:
        return Progress(counts, planned)
    design = experiment.design
    result = judge(experiment, stands, design)
    open_arms = [a for a in result.arms if a.status == UNDECIDED]
    fewest = min((a.n for a in open_arms), default=design.r0)
    have = {name: len(scores(by_seed)) for name, by_seed in stands.items()}
    if experiment.policy == WHOLE_TABLE:
        still = sum(design.r_max - n for n in have.values())
    else:
        full = have[experiment.reference.name]
        still = sum(design.r_max - a.n for a in open_arms)
        still += max(0, design.r_max - full) if open_arms else 0
    decided = len(result.arms) - len(open_arms)
    return Progress(counts, planned, 1 + max(0, fewest - design.r0), decided, len(result.arms),
                    still)  # fmt: skip


def status_of(result: Plan, name: str) -> ArmStatus | None:
    """The status of arm ``name`` in a judged plan (None when it was not judged)."""
    return next((a for a in result.arms if a.name == name), None)


def look_at(
    experiment: Experiment, stands: Mapping[str, Mapping[int, Stand]], name: str,
    design: SequentialDesign,
) -> ArmStatus:  # fmt: skip
    """One arm's interval and status against the reference, whether or not it may be the answer
    (an arm outside the budget still gets its row)."""
    full = scores(stands[experiment.reference.name])
    return look(name, scores(stands[name]), full, design)
