"""The layer claims of Xie et al. 2022: X1 (ν tracks the probe), X2 (ℓ* lies mid-network),
X3 (first-token ν curves are less smooth) from bootstrap repeats of the layer metrics on S
samples, and X4 (tuning up to ℓ* matches full fine-tuning at a fraction of the cost) from runs.

X1–X3 are judged on every sample and combined (`combine_samples`): a verdict holds only when
the samples agree on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from analysis.claims.config import ClaimInputs, ClaimsConfig, SampleInputs
from analysis.claims.papers import LAYER_CLAIMS
from analysis.claims.result import ClaimResult
from analysis.claims.runs import comparison_result, full_run
from analysis.config import ExtractConfig, SampleSpec
from analysis.extract import extract_states
from analysis.layers.repeats import (
    RepeatSummary,
    cached_layer_repeats,
    difference_estimate,
    mid_network_verdict,
    rho_verdict,
    smoothness_verdict,
    summarise_repeats,
)
from analysis.layers.table import cached_layer_metrics, summary
from analysis.progress import Progress, scaled
from analysis.runs.planner import planned_compare

if TYPE_CHECKING:
    from analysis.layers.repeats import LayerRepeats
    from analysis.models import LoadedModel

CLAIM_METRICS = ("nu", "probe")  # X1–X3 rest on ν and the probe only (ρ(ν, s), ℓ*, ζ)


def layer_samples(cfg: ClaimsConfig, part_size: int) -> tuple[str, list[tuple[int, range]]]:
    """How the S samples of the layer claims are drawn from a part of ``part_size`` examples:
    ("disjoint", [(seed, positions)…]) when it holds S · N examples — one seeded sample of S · N
    (sampling seed ``sample_seed``), cut into S consecutive blocks of N: disjoint uniform samples
    — else ("overlapping", …): S samples of N with sampling seeds sample_seed, sample_seed + 1,
    …, each its own draw (they share examples). One sample is always ("one sample", …)."""
    s, n = cfg.samples, cfg.n
    if s == 1:
        return "one sample", [(cfg.sample_seed, range(n))]
    if s * n <= part_size:
        return "disjoint", [(cfg.sample_seed, range(i * n, (i + 1) * n)) for i in range(s)]
    return "overlapping", [(cfg.sample_seed + i, range(n)) for i in range(s)]


def train_size(cfg: ClaimsConfig) -> int:
    """How many examples the data's train part holds (the samples are drawn from it)."""
    from analysis.data import load_data

    return len(load_data(cfg.data).parts["train"])


def sample_block(states: Any, block: range, tag: str) -> Any:
    """The examples ``block`` of an extraction as LayerStates of their own (in memory), with a
    cache key of their own (the extraction's key and the block)."""
    if block == range(states.n):
        return states
    index = torch.arange(block.start, block.stop)
    meta = {**states.meta, "cache_path": f"{states.meta['cache_path']}-{tag}"}
    return dataclasses.replace(
        states, states=states.states[:, index].clone(), labels=states.labels[index],
        rows=states.rows[index], meta=meta, stored=None,
    )  # fmt: skip


def layer_extractions(
    cfg: ClaimsConfig, pooling: str = "mean"
) -> tuple[str, list[tuple[int, range]], dict[int, ExtractConfig]]:
    """(how the samples are drawn, [(sampling seed, positions)…] per sample, sampling seed →
    its extraction with ``pooling``): the layer claims' S samples (`layer_samples`; one sample
    when only X4 is asked), one extraction per sampling seed — of S · N examples when the
    samples are blocks of one disjoint draw, else of N."""
    samples = cfg.samples if cfg.layer_claims else 1
    mode, draws = layer_samples(dataclasses.replace(cfg, samples=samples), train_size(cfg))
    size = samples * cfg.n if mode == "disjoint" else cfg.n
    extractions = {
        seed: dataclasses.replace(cfg.extract_config(pooling), sample=SampleSpec(n=size, seed=seed))
        for seed, _ in draws
    }  # fmt: skip
    return mode, draws, extractions


def measure_layers(
    cfg: ClaimsConfig,
    loaded: LoadedModel,
    inputs: ClaimInputs,
    poolings: Sequence[str],
    progress: Progress | None = None,
) -> None:
    """Fill ``inputs`` with what the layer claims rest on: per sample (`layer_extractions`) the
    full-sample ℓ* (mean pooling) and the repeats of each of ``poolings`` (mean: ν and the
    probe; first token: ν only, for X3). X4's ℓ* is the first sample's. Everything is
    disk-cached."""
    mode, draws, _ = layer_extractions(cfg)
    inputs.sample_mode = mode
    inputs.samples = [
        SampleInputs(label=f"seed {seed}" + (f", examples {b.start + 1}–{b.stop}"
                                             if mode == "disjoint" else ""), n=cfg.n)
        for seed, b in draws
    ]  # fmt: skip
    for done, pooling in enumerate(poolings):
        part = scaled(progress, done / len(poolings), (done + 1) / len(poolings))
        extractions = layer_extractions(cfg, pooling)[2]
        extracted: dict[int, Any] = {}
        for i, (seed, block) in enumerate(draws):
            sub = scaled(part, i / len(draws), (i + 1) / len(draws))
            if seed not in extracted:
                extracted[seed] = extract_states(
                    extractions[seed], progress=scaled(sub, 0, 0.3), loaded=loaded
                )
            states = sample_block(extracted[seed], block, f"block{block.start}-{block.stop}")
            if pooling == "mean":
                df, _ = cached_layer_metrics(states, seed=seed, progress=scaled(sub, 0.3, 0.8))
                inputs.samples[i].l_star = summary(df)["l_star"]
            rep, _ = cached_layer_repeats(
                states, seed=seed, repeats=cfg.repeats, progress=scaled(sub, 0.8, 1.0),
                which=CLAIM_METRICS if pooling == "mean" else ("nu",),
            )  # fmt: skip
            setattr(inputs.samples[i], f"{pooling}_repeats", rep)
    first = inputs.samples[0]
    inputs.l_star, inputs.mean_repeats, inputs.first_repeats = (
        first.l_star, first.mean_repeats, first.first_repeats,
    )  # fmt: skip


def layer_claims_estimate(cfg: ClaimsConfig, d_model: int = 384, n_layers: int = 6) -> float:
    """Rough seconds the layer claims take on a 2-core CPU before anything is cached: per sample
    and pooling one extraction, per sample the mean-pooling table (its cross-validated probe
    dominates) and the cheap repeats, scaled by N, L and d_model (bench/bench_layer_claims.py
    prints where the time goes)."""
    if not cfg.layer_claims:
        return 0.0
    poolings = 2 if "X3" in cfg.only else 1
    scale = cfg.n / 1000 * (n_layers + 1) / 7 * d_model / 384
    extraction, table, repeats = 4.0, 5.0, 0.03 * cfg.repeats
    return cfg.samples * scale * (poolings * extraction + table + poolings * repeats)


def layer_claims(inputs: ClaimInputs, only: Iterable[str] = LAYER_CLAIMS) -> list[ClaimResult]:
    """X1, X2 (mean-pooling repeats) and X3 (both poolings, the same resamples), each judged on
    every sample (`combine_samples`)."""
    samples = inputs.samples or (
        [SampleInputs("the sample", int(inputs.mean_repeats.attrs.get("n", 0)), inputs.l_star,
                      inputs.mean_repeats, inputs.first_repeats)]
        if inputs.mean_repeats is not None else []
    )  # fmt: skip
    out = []
    for claim in only:
        if claim not in LAYER_CLAIMS:
            continue
        need_first = claim == "X3"
        if not samples or any(
            s.mean_repeats is None or (need_first and s.first_repeats is None) for s in samples
        ):
            out.append(ClaimResult(claim, "not measured yet", detail="the repeats are missing"))
            continue
        per = [
            _x1(summarise_repeats(s.mean_repeats)) if claim == "X1"
            else _x2(summarise_repeats(s.mean_repeats), inputs.n_layers) if claim == "X2"
            else _x3(s.mean_repeats, s.first_repeats)
            for s in samples
        ]  # fmt: skip
        out.append(combine_samples(claim, per, samples, inputs.sample_mode or "one sample"))
    return out


def combine_samples(
    claim: str, per: Sequence[ClaimResult], samples: Sequence[SampleInputs], mode: str
) -> ClaimResult:
    """One verdict from the samples' verdicts (docs/explanation/statistics.md, "Samples"): the
    common verdict when every sample gives it; **unstable** when they disagree (X1's "holds" and
    "holds weakly" together make "holds weakly"), never the first sample's. The detail says on how
    many samples it holds and states N, R and S; the first sample's number and interval are shown,
    every sample's are in ``values["samples"]``."""
    verdicts = [r.verdict for r in per]
    distinct = set(verdicts)
    if len(distinct) == 1:
        verdict = verdicts[0]
    elif distinct == {"holds", "holds weakly"}:
        verdict = "holds weakly"
    else:
        verdict = "unstable"
    n_hold = sum(v in ("holds", "holds weakly") for v in verdicts)
    first = per[0]
    s = len(per)
    repeats = first.repeats or 0
    n = samples[0].n
    how = f"N = {n:,}, R = {repeats}, S = {s}" + (f" ({mode} samples)" if s > 1 else "")
    each = "; ".join(
        f"{smp.label}: {r.verdict} ({r.detail})" for smp, r in zip(samples, per, strict=True)
    )
    detail = f"holds on {n_hold} of {s} sample{'s' if s > 1 else ''}; {how}. {each}"
    return ClaimResult(
        claim, verdict, ours=first.ours, interval=first.interval, repeats=repeats,
        detail=detail,
        values={**first.values, "samples": [
            {"label": smp.label, "n": smp.n, "verdict": r.verdict, "ours": r.ours,
             "interval": list(r.interval) if r.interval is not None else None,
             "detail": r.detail, **r.values}
            for smp, r in zip(samples, per, strict=True)
        ], "n": n, "repeats": repeats, "n_samples": s, "sample_mode": mode, "holds_on": n_hold},
    )  # fmt: skip


def _x1(mean: RepeatSummary) -> ClaimResult:
    est = mean.rho["nu"]
    return ClaimResult(
        "X1", rho_verdict(est), ours=est.value, interval=est.interval, repeats=mean.repeats,
        detail=f"ρ(ν, s) = {est.text()}",
        values={"rho": mean.rho_replicates["nu"].tolist(), "rho_estimate": est.to_dict()},
    )  # fmt: skip


def _x2(mean: RepeatSummary, n_layers: int) -> ClaimResult:
    counts = mean.l_star_counts
    return ClaimResult(
        "X2", mid_network_verdict(counts, mean.repeats, n_layers),
        ours=None if mean.l_star is None else float(mean.l_star),
        repeats=mean.repeats,
        detail=f"full-sample ℓ* = {mean.l_star}; {mean.l_star_sentence()}, L = {n_layers}",
        values={"l_star_counts": {str(k): v for k, v in counts.items()}, "n_layers": n_layers},
    )  # fmt: skip


def _x3(mean: LayerRepeats, first: LayerRepeats) -> ClaimResult:
    diff = difference_estimate(first, mean, "zeta")
    if not math.isfinite(diff.value):
        return ClaimResult("X3", "inconclusive", repeats=mean.n_repeats,
                           detail="ζ is undefined (fewer than 3 layers)")  # fmt: skip
    zf, zm = summarise_repeats(first).zeta, summarise_repeats(mean).zeta
    return ClaimResult(
        "X3", smoothness_verdict(diff), ours=diff.value, interval=diff.interval,
        repeats=mean.n_repeats,
        detail=f"ζ(first) − ζ(mean) = {diff.text(3)}; ζ(first) = {zf.value:.3g}, "
        f"ζ(mean) = {zm.value:.3g}",
        values={"zeta_first": zf.to_dict(), "zeta_mean": zm.to_dict(),
                "difference": diff.to_dict()},
    )  # fmt: skip


def x4_arms(l_star: int) -> tuple[str, str]:
    """X4's two arms: tuning layers 1..ℓ* with the classifier at ℓ*, and full fine-tuning."""
    return f"(1, {l_star}, {l_star})", "full"


def plan_x4(cfg: ClaimsConfig, inputs: ClaimInputs, add: Callable[..., None]) -> None:
    """X4's runs, one per seed and arm; none while ℓ* is unknown, and none when ℓ* = L (then
    (1, ℓ*, ℓ*) is full fine-tuning: nothing to cut, X4 is inconclusive without runs)."""
    if inputs.l_star is None or inputs.l_star >= inputs.n_layers:
        return
    star = inputs.l_star
    cut_arm, full_arm = x4_arms(star)
    for seed in cfg.seeds:
        base = cfg.base_run(seed)
        add("X4", full_arm, full_run(base))
        cut = dataclasses.replace(base, method="layers", layers=(1, star, star), lr=None)
        add("X4", cut_arm, cut)


def judge_x4(arms, entries, n_seeds, ids, need) -> ClaimResult:
    cut, full = need
    c = planned_compare(arms[cut], arms["full"])
    devices = {r.get("device") for arm in need for r in entries[arm] if r["status"] == "done"}
    if len(devices) > 1:  # step times of different machines compare hardware, not methods
        detail = f"{c.verdict}; step times not comparable (runs on {', '.join(map(str, devices))})"
        return comparison_result("X4", "inconclusive", c, n_seeds, ids, detail, [c])
    step = {
        arm: float(np.mean([r["result"].get("step_time_s") or np.nan for r in entries[arm]
                            if r["status"] == "done"]))
        for arm in need
    }  # fmt: skip
    ratio = step[cut] / step[full] if step[full] > 0 else math.nan
    faster = math.isfinite(ratio) and ratio < 1
    verdict = "does not hold" if c.winner == "B" or not faster else "holds"
    detail = f"{c.verdict}; step time {ratio:.2f}× full" if math.isfinite(ratio) else c.verdict
    result = comparison_result("X4", verdict, c, n_seeds, ids, detail, [c])
    result.values["step_time_ratio"] = ratio
    return result
