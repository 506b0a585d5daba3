"""A small recommendation (three choices, with finished runs) and a crowded set of choices, for
the tests of the Recommend page's figures and report (tests/ui, tests/browser)."""

from __future__ import annotations

import os

import pandas as pd

from analysis.config import DataSpec, ModelSpec
from analysis.recommend.budget import Cost, Costs
from analysis.recommend.choices import Choice, Proposal
from analysis.recommend.config import RecommendConfig
from analysis.recommend.evidence import Evidence
from analysis.recommend.outcome import planned_runs
from analysis.recommend.recommendation import Recommendation
from analysis.runs.db import RunsDB
from ui.figures.recommend import cost_figure


def recommendation() -> Recommendation:
    cfg = RecommendConfig(model=ModelSpec("tiny-model"), data=DataSpec("movie-snippets"), steps=2)
    evidence = Evidence(
        n_layers=2, n_heads=2, d_model=8, family="bert", metric="accuracy", n_outputs=2,
        table=pd.DataFrame(), l_star=1, repeats=5, l_star_counts={1: 4, 2: 1},
    )  # fmt: skip
    proposal = Proposal([
        Choice("full fine-tuning", "reference", "full", "everything"),
        Choice("layer 1 (ℓ*)", "candidate", "layers", "layer 1 <and> the classifier",
               "ν is lowest at layer 1", layers=(1, 1, 1)),
        Choice("BitFit", "alternative", "bitfit", "every bias", "a small budget"),
    ], notes=["The last 1 layer is layer 1 (ℓ*) itself."])  # fmt: skip
    costs = Costs({"full fine-tuning": Cost(100, 100, 1.0, 1.0),
                   "layer 1 (ℓ*)": Cost(30, 100, 0.4, 0.4),
                   "BitFit": Cost(3, 100, 0.7, 0.7, "not matched: 90 % fewer trainable "
                                  "parameters than layer 1 (ℓ*)", "layer 1 (ℓ*)")}, 0.0)  # fmt: skip
    return Recommendation(cfg, evidence, proposal, costs)


def finished_runs(rec: Recommendation) -> pd.DataFrame:
    db = RunsDB()
    score = {"full fine-tuning": 0.805, "layer 1 (ℓ*)": 0.80, "BitFit": 0.60}
    index: dict[str, int] = {}  # each arm's k-th run (an arm's seeds may be its own)
    for name, config in planned_runs(rec.cfg, rec.proposal):
        run_id = db.enqueue(config, running_pid=os.getpid())
        index[name] = index.get(name, -1) + 1
        db.finish(run_id, {"score": score[name] + 0.001 * index[name], "metric": "accuracy",
                           "peak_mem_mb": 50.0})  # fmt: skip
    return db.list_runs()


# Crowded as on a real model: four choices near 0.6 % trainable, four at 32 %, similar step times.
CROWDED = {
    "full fine-tuning": ("reference", 1.0, 1.0), "layers 1–3 (ℓ*)": ("candidate", 0.32, 0.55),
    "layers 2–4 (probe)": ("candidate", 0.32, 0.57), "PageRank heads ×2": ("candidate", 0.05, 0.62),
    "LoRA by probe gain": ("candidate", 0.0062, 0.71), "last 3 layers": ("alternative", 0.32, 0.56),
    "3 random layers": ("alternative", 0.32, 0.58), "3 SNR layers": ("alternative", 0.32, 0.54),
    "uniform LoRA r=8": ("alternative", 0.0065, 0.72), "EVA LoRA r=8": ("alternative", 0.0066, 0.73),
    "BitFit": ("alternative", 0.0061, 0.70),
}  # fmt: skip


def crowded_cost_figure():
    roles, shares, ratios = zip(*CROWDED.values(), strict=True)
    return cost_figure(list(CROWDED), list(shares), list(ratios), list(roles))
