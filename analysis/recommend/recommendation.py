"""The recommendation in one object: the analyses (`Evidence`), the choices (`Proposal`), their
measured costs (`Costs`) and — from the runs database — the comparison and the sentence; how its
runs are queued (the one launch path) and how the chosen candidate is taken home.

    rec = recommend(cfg, loaded, progress)            # analyses (cached), choices, costs
    launched = queue(db, rec, db.list_runs(...))       # the comparison's first round
    arms, decision = rec.outcome(db.list_runs(...))    # table rows and the sentence
    rec.progress(db.list_runs(...))                    # the round, the arms decided
    rec.to_json(runs)                                  # `recommend --json`
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.progress import Progress, no_progress, scaled
from analysis.recommend.budget import Costs, measure, run_step_time_ratios
from analysis.recommend.choices import Proposal, propose
from analysis.recommend.config import RecommendConfig
from analysis.recommend.evidence import Evidence, gather
from analysis.recommend.outcome import (
    ArmOutcome,
    Decision,
    arm_outcomes,
    decide,
    design_of,
    experiment_of,
    recommendation_json,
)
from analysis.runs.planner import Experiment, progress, standings
from analysis.runs.planner import Progress as PlanProgress
from analysis.words import counted

if TYPE_CHECKING:
    import pandas as pd

    from analysis.models import LoadedModel
    from analysis.runs.db import RunsDB
    from analysis.runs.executor import ExecutorChoice
    from analysis.runs.launch import Launched


@dataclass
class Recommendation:
    cfg: RecommendConfig
    evidence: Evidence
    proposal: Proposal
    costs: Costs

    @property
    def trains(self) -> dict[str, str]:
        return {c.name: c.trains for c in self.proposal.choices}

    def experiment(self) -> Experiment:
        """The comparison as a planned experiment (`analysis.recommend.outcome.experiment_of`)."""
        return experiment_of(self.cfg, self.proposal, self.costs)

    def outcome(self, runs: pd.DataFrame) -> tuple[list[ArmOutcome], Decision]:
        """The comparison's rows (full first) and the sentence, from the runs database's rows."""
        experiment = self.experiment()
        stands = standings(experiment, runs)
        arms = arm_outcomes(self.cfg, self.proposal, self.costs, stands, self.refined(stands))
        return arms, self._decide(arms, experiment, stands)

    def _decide(self, arms, experiment: Experiment, stands) -> Decision:
        from analysis.runs.planner import judge

        design = design_of(self.cfg)
        final = judge(experiment, stands, design).final
        return decide(arms, self.cfg.delta, self.cfg.budget, self.trains, final, design.looks)

    def progress(self, runs: pd.DataFrame) -> PlanProgress:
        """Where the comparison's runs stand: counts, the round, the arms decided."""
        return progress(self.experiment(), runs)

    def refined(self, stands) -> Costs | None:
        """The measured costs, each step-time ratio refined by the finished runs' own step times
        where the arm and full fine-tuning have runs of the same seeds
        (`analysis.recommend.budget.run_step_time_ratios`)."""
        if self.costs is None:
            return None
        times = {
            name: {i: (s.result or {}).get("step_time_s")
                   for i, s in by_seed.items() if s.status == "done"}
            for name, by_seed in stands.items()
        }  # fmt: skip
        return self.costs.refined(run_step_time_ratios(times, self.proposal.choices[0].name))

    def queue_seconds(self, to_queue, runs: pd.DataFrame, parallel: int = 1) -> tuple[float, str]:
        """About how long the planned runs ``to_queue`` ((arm, config) pairs) take to train here,
        ``parallel`` at a time, and where the figure comes from: an arm's finished runs' own wall
        times (each worker training one run on its share of the cores), else its timed steps
        (all cores on one step) × its steps, and its scoring of the dev part at every evaluation
        and of the test part at the end (`_eval_steps`)."""
        stands = standings(self.experiment(), runs)
        total, measured, timed = 0.0, 0, 0
        for arm, cfg in to_queue:
            walls = [float(s.result["wall_s"]) for s in stands.get(arm.name, {}).values()
                     if s.status == "done" and (s.result or {}).get("wall_s")]  # fmt: skip
            cost = self.costs.get(arm.name) if self.costs is not None else None
            if walls:
                total += statistics.median(walls) / max(1, parallel)
                measured += 1
            elif cost is not None:
                total += cost.step_time_s * (cfg.steps + _eval_steps(cfg))
                timed += 1
        sources = [f"{counted(measured, 'run')} from finished runs' times"] if measured else []
        if timed:
            sources.append(f"{counted(timed, 'run')} from timed steps × (steps + evaluation)")
        return total, "; ".join(sources) or "no timing yet"

    def to_json(self, runs: pd.DataFrame | None = None) -> dict[str, Any]:
        if runs is None:
            arms, decision, costs = None, decide([], self.cfg.delta, self.cfg.budget), self.costs
        else:
            arms, decision = self.outcome(runs)
            costs = self.costs
        return recommendation_json(self.cfg, self.proposal, costs, arms, decision, self.evidence)


def _eval_steps(cfg) -> float:
    """A run's scoring in training steps: every evaluation of ``n_eval`` dev examples and the
    test part's at the end, a forward pass being about a third of a step (forward, then backward
    at about twice its cost); none when ``n_eval`` is the whole part (its size is the data's)."""
    if not cfg.n_eval:
        return 0.0
    scored = (-(-cfg.steps // cfg.eval_every) + 1) * cfg.n_eval  # the dev evaluations + the test
    return scored / (3 * cfg.batch_size)


def recommend(
    cfg: RecommendConfig, loaded: LoadedModel, progress: Progress | None = None
) -> Recommendation:
    """Run (or reuse from the disk cache) the analyses, propose the choices and measure their
    costs (a few timed steps each)."""
    progress = progress or no_progress
    evidence = gather(cfg, loaded, scaled(progress, 0.0, 0.6))
    proposal = propose(cfg, evidence, loaded.name)
    costs = measure(cfg, proposal, loaded, scaled(progress, 0.6, 1.0))
    return Recommendation(cfg, evidence, proposal, costs)


def queue(
    db: RunsDB,
    rec: Recommendation,
    runs: pd.DataFrame,
    executor: ExecutorChoice | None = None,
    sweep_id: str | None = None,
) -> Launched:
    """Queue what the comparison needs now through the one launch path and start the workers it
    needs (`analysis.runs.launch.launch_experiment`): the first round (every arm's first seeds,
    cheapest first; finished runs reused, failed ones queued again), or the whole grid of a fixed
    design. Later rounds are queued as runs end. A run records no family (no sweep strategy
    queued it); its arm is its run group."""
    from analysis.runs.launch import launch_experiment

    return launch_experiment(db, rec.experiment(), runs, executor, sweep_id)


def take_home(
    rec: Recommendation, name: str, folder: Path | str, loaded: LoadedModel
) -> list[Path]:
    """Write choice ``name``'s recipe into ``folder``: the export every run has
    (`analysis.export.build`: recipe.json, the recipe module, a README and, for LoRA, PEFT's
    ``adapter_config.json`` with its ``rank_pattern`` / ``alpha_pattern``); a ValueError for
    what cannot be exported (EVA's data-dependent start)."""
    from analysis.export.build import build_recipe, write_recipe

    choice = rec.proposal.by_name(name)
    config = choice.config(rec.cfg.base_run())
    provenance = {"source": "recommend", "candidate": name, "evidence": choice.evidence}
    recipe = build_recipe(config, loaded, rec.evidence.n_outputs, provenance)
    return write_recipe(recipe, folder)
