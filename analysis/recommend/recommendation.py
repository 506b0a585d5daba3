"""The recommendation in one object: the analyses (`Evidence`), the choices (`Proposal`), their
measured costs (`Costs`) and — from the runs database — the comparison and the sentence; how its
runs are queued (the one launch path) and how the chosen candidate is taken home.

    rec = recommend(cfg, loaded, progress)            # analyses (cached), choices, costs
    launched = queue(db, rec, db.list_runs(...))       # the comparison's missing runs
    arms, decision = rec.outcome(db.list_runs(...))    # table rows and the sentence
    rec.to_json(runs)                                  # `recommend --json`
"""

from __future__ import annotations

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
    missing_runs,
    recommendation_json,
    run_status,
)
from analysis.runs.record import runs_of

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

    def outcome(self, runs: pd.DataFrame) -> tuple[list[ArmOutcome], Decision]:
        """The comparison's rows (full first) and the sentence, from the runs database's rows."""
        arms = arm_outcomes(self.cfg, self.proposal, self.costs_with(runs), runs)
        return arms, decide(arms, self.cfg.delta, self.cfg.budget, self.trains)

    def costs_with(self, runs: pd.DataFrame | None) -> Costs | None:
        """The measured costs, each step-time ratio refined by the finished runs' own step times
        where the arm and full fine-tuning have runs of the same seeds
        (`analysis.recommend.budget.run_step_time_ratios`)."""
        if self.costs is None or runs is None or runs.empty:
            return self.costs
        results = {run.id: run.result or {} for run in runs_of(runs)}
        times = {
            name: {seed: results.get(run_id, {}).get("step_time_s")
                   for seed, (state, run_id) in by_seed.items() if state == "done"}
            for name, by_seed in run_status(self.cfg, self.proposal, runs).items()
        }  # fmt: skip
        return self.costs.refined(run_step_time_ratios(times, self.proposal.choices[0].name))

    def to_json(self, runs: pd.DataFrame | None = None) -> dict[str, Any]:
        arms, decision = self.outcome(runs) if runs is not None else (None, None)
        if decision is None:
            decision = decide([], self.cfg.delta, self.cfg.budget)
        return recommendation_json(
            self.cfg, self.proposal, self.costs_with(runs), arms, decision, self.evidence
        )


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
    """Queue the comparison's missing runs (every arm × seed that no done, running or queued run
    stands for) through the one launch path, and start the workers it needs. A run records no
    family (no sweep strategy queued it); its arm is its run group (`run_status`)."""
    from analysis.runs.launch import launch

    missing = missing_runs(rec.cfg, rec.proposal, runs)
    return launch(db, [(c, None) for _, c in missing], executor, sweep_id)


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
