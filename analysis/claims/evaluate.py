"""The claims together: what they rest on (`prepare`), the runs they need (`plan_runs`), and
every asked claim's verdict from those and the finished runs (`evaluate`).

Runs are reused whenever a finished run has the same run group (`analysis.runs.results.group_of`:
every setting but the seed) and seed; a run claim gives a verdict only from ≥ `MIN_SEEDS` seeds
per arm, and then by its family's rule (`JUDGES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from analysis.claims import heads, layers, subspace
from analysis.claims.config import ClaimInputs, ClaimsConfig
from analysis.claims.papers import CLAIMS
from analysis.claims.result import MIN_SEEDS, ClaimResult
from analysis.claims.runs import PlannedRun, arm_of, run_status
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_spec
from analysis.progress import Progress, scaled
from analysis.runs.planner import SEED_DESIGN
from analysis.seeding import arm_seed

if TYPE_CHECKING:
    from pathlib import Path

    from analysis.config import ExtractConfig
    from analysis.heads.collect import HeadStatsConfig
    from analysis.models import LoadedModel

# claim → its rule: (arms, entries, n_seeds, run ids, arms needed) → ClaimResult
JUDGES = {"X4": layers.judge_x4, "H1": heads.judge_h1, "H2": heads.judge_h2,
          "S1": subspace.judge_s1, "S2": subspace.judge_s2}  # fmt: skip


def prepare(
    cfg: ClaimsConfig, loaded: LoadedModel, progress: Progress | None = None
) -> ClaimInputs:
    """Extract, compute each sample's full-sample table and repeats (both poolings when X3 is
    asked; `layers.measure_layers`), and the head statistics and selections when a heads claim
    is asked (`heads.select_heads`). Everything is disk-cached."""
    poolings = _poolings(cfg)
    needs_heads = bool({"H1", "H2"} & set(cfg.only))
    inputs = ClaimInputs(n_layers=loaded.n_layers)
    # the bar's parts: one per pooling of the layer claims, one for the heads
    layer_parts = len(poolings)
    parts = max(1, layer_parts + (1 if needs_heads else 0))
    if poolings:
        layers.measure_layers(
            cfg, loaded, inputs, poolings, scaled(progress, 0, layer_parts / parts)
        )
    if needs_heads:
        inputs.selections, inputs.random_selections = heads.select_heads(
            cfg, loaded, scaled(progress, layer_parts / parts, 1.0)
        )
    return inputs


def _poolings(cfg: ClaimsConfig) -> list[str]:
    """The poolings the layer claims (and X4's ℓ*) are measured with; none without them."""
    if not cfg.layer_claims and "X4" not in cfg.only:
        return []
    return ["mean", "first"] if "X3" in cfg.only else ["mean"]


def heavy_inputs(cfg: ClaimsConfig) -> tuple[list[ExtractConfig], HeadStatsConfig | None]:
    """What `prepare` extracts and the head statistics it computes (None: no heads claim), so
    that a caller can have them computed elsewhere first (the dashboard's compute workers):
    `prepare` then reads them from the disk cache."""
    extractions = [
        extract for pooling in _poolings(cfg)
        for extract in layers.layer_extractions(cfg, pooling)[2].values()
    ]  # fmt: skip
    return extractions, heads.stats_config(cfg) if {"H1", "H2"} & set(cfg.only) else None


def plan_runs(
    cfg: ClaimsConfig,
    inputs: ClaimInputs,
    source: str | None = None,
    root: Path | str | None = None,
) -> list[PlannedRun]:
    """Every run the asked run claims need, one per arm and seed: X4's, the heads claims', the
    subspace claims' (`subspace.plan_subspace`).

    source: the id of the finished trajectory run (None: the subspace claims plan only it);
    root: the cache root holding the zero-weights files (S2 plans its runs only once they exist).
    Runs shared by claims (full fine-tuning: X4 and S1) are planned once, with both claims.
    """
    planned: dict[tuple[str, int], PlannedRun] = {}

    def add(claim: str, arm: str, config: FinetuneConfig, stage: int = 0) -> None:
        # The seed design every comparison uses (`analysis.runs.planner.SEED_DESIGN`): full
        # fine-tuning trains on the claims' seeds, under independent seeds every other arm on
        # seeds of its own (`analysis.seeding.arm_seed`).
        reference = method_spec(config.method).reference
        seed = arm_seed(arm, config.seed, SEED_DESIGN, reference)
        run = PlannedRun((claim,), arm, dataclasses.replace(config, seed=seed), stage)
        if run.key in planned:
            old = planned[run.key]
            planned[run.key] = dataclasses.replace(old, claims=(*old.claims, claim))
        else:
            planned[run.key] = run

    if "X4" in cfg.only:
        layers.plan_x4(cfg, inputs, add)
    heads.plan_heads(cfg, inputs, add)
    subspace.plan_subspace(cfg, source, root, add)
    return list(planned.values())


def run_claims(
    cfg: ClaimsConfig, inputs: ClaimInputs, planned: Sequence[PlannedRun], runs: pd.DataFrame
) -> list[ClaimResult]:
    """X4, H1, H2, S1, S2 from the finished runs matching the plan."""
    status = run_status(planned, runs)
    arms: dict[tuple[str, str], list[dict]] = {}
    for p in planned:
        for claim in p.claims:
            arms.setdefault((claim, p.arm), [])
            found = status.get(p.key)
            arms[(claim, p.arm)].append({"planned": p, **(found or {"status": "missing"})})
    out = []
    for claim in cfg.run_claims:
        entries = {arm: rows for (c, arm), rows in arms.items() if c == claim}
        out.append(_run_claim(cfg, claim, inputs, entries))
    return out


def _run_claim(
    cfg: ClaimsConfig, claim: str, inputs: ClaimInputs, entries: dict[str, list[dict]]
) -> ClaimResult:
    ids = sorted({r["id"] for rows in entries.values() for r in rows if r.get("id")})
    if claim == "X4":
        if inputs.l_star is None:
            return ClaimResult(claim, "not measured yet", detail="ℓ* is undefined")
        star = inputs.l_star
        need = layers.x4_arms(star)
        if star == inputs.n_layers:
            return ClaimResult(claim, "inconclusive", runs=ids,
                               detail=f"ℓ* = L = {star}: (1, ℓ*, ℓ*) is full fine-tuning")  # fmt: skip
    else:
        need = {**heads.ARMS, **subspace.ARMS}[claim]
    pending = [
        f"{arm}: {sum(r['status'] == 'done' for r in entries.get(arm, []))} of {len(cfg.seeds)}"
        for arm in need
        if sum(r["status"] == "done" for r in entries.get(arm, [])) < len(cfg.seeds)
    ]
    if pending:
        waiting = "waiting for the trajectory run" if claim in subspace.ARMS and not any(
            a in entries for a in need
        ) else "runs done — " + ", ".join(pending)  # fmt: skip
        return ClaimResult(claim, "not measured yet", runs=ids, detail=waiting)
    same = [arm for arm in need[1:] if heads.same_heads(inputs, "PageRank heads", arm)]
    if claim == "H2" and same:
        # a selector that picked exactly PageRank's heads compares PageRank with itself
        need = tuple(a for a in need if a not in same)
        if len(need) == 1:
            return ClaimResult(claim, "inconclusive", runs=ids,
                               detail=f"same heads chosen: not tested ({' and '.join(same)})")  # fmt: skip
    arms = {arm: arm_of(arm, entries[arm]) for arm in need}
    n_seeds = min(a.n_seeds for a in arms.values())
    result = JUDGES[claim](arms, entries, n_seeds, ids, need)
    if n_seeds < MIN_SEEDS and result.verdict != "inconclusive":
        # the claims ask ≥ 3 seeds per arm: with fewer, the numbers are shown, not judged
        result.detail += f"; a verdict needs ≥ {MIN_SEEDS} seeds per arm (here {n_seeds})"
        result.verdict = "inconclusive"
    if claim == "H2" and same:
        result.detail += f"; {' and '.join(same)}: same heads chosen: not tested"
    elif claim == "H1" and same:
        result.detail += f" ({' and '.join(same)}: chose the same heads as PageRank)"
    return result


def evaluate(
    cfg: ClaimsConfig, inputs: ClaimInputs, planned: Sequence[PlannedRun], runs: pd.DataFrame
) -> list[ClaimResult]:
    """Every asked claim, in the order of `CLAIMS`."""
    results = {r.id: r for r in layers.layer_claims(inputs, cfg.layer_claims)}
    results.update({r.id: r for r in run_claims(cfg, inputs, planned, runs)})
    return [results[c] for c in CLAIMS if c in results]
