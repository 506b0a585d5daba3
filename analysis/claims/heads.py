"""The head claims of HiFi (Gui & Xiao 2023): H1 (top-k PageRank heads beat k random heads per
layer) and H2 (both information and correlation matter: PageRank against top-k I_h and top-k
total correlation), from fine-tuning runs of each selector's heads; and the Heads page's own
comparison of finished heads runs by selector (`heads_comparisons`).

When a selector picks exactly PageRank's heads, H2 reports "same heads chosen: not tested" for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.claims.config import ClaimInputs, ClaimsConfig
from analysis.claims.result import ClaimResult
from analysis.claims.runs import comparison_result
from analysis.compare import Arm, Comparison
from analysis.finetune.methods.heads import HeadsOptions
from analysis.finetune.registry import method_names
from analysis.heads.collect import HeadStatsConfig, head_stats
from analysis.heads.select import HeadSelectionConfig, analyse_heads
from analysis.runs.planner import planned_compare
from analysis.runs.record import runs_of, setting_digest
from analysis.runs.results import distinct_labels

if TYPE_CHECKING:
    from analysis.heads.selection_file import HeadSelection
    from analysis.heads.stats import HeadStats
    from analysis.models import LoadedModel
    from analysis.progress import Progress

HEAD_SELECTORS = {"PageRank heads": "pagerank", "random heads": "random",
                  "top-k I_h heads": "richness", "top-k correlation heads": "correlation"}  # fmt: skip
ARMS = {
    "H1": ("PageRank heads", "random heads"),
    "H2": ("PageRank heads", "top-k I_h heads", "top-k correlation heads"),
}


def head_selections(
    stats: HeadStats,
    k: int,
    model: str,
    provenance: Mapping[str, Any],
    selectors: Iterable[str] = HEAD_SELECTORS.values(),
    base: Any = None,
) -> dict[str, HeadSelection]:
    """selector → its HeadSelection (k heads per layer, every layer, the paper's PageRank), with
    the provenance the Heads page records, so that runs queued there and here match."""

    base = base or HeadSelectionConfig(k=k)
    return {
        s: analyse_heads(stats, dataclasses.replace(base, selector=s)).to_selection(
            model, dict(provenance)
        )
        for s in selectors
    }


def stats_config(cfg: ClaimsConfig) -> HeadStatsConfig:
    """The head statistics the heads claims rest on: ``heads_n`` examples, mean pooling, ξ."""
    return HeadStatsConfig(cfg.extract_config("mean", n=cfg.heads_n), xi=cfg.xi)


def select_heads(
    cfg: ClaimsConfig, loaded: LoadedModel, progress: Progress | None = None
) -> tuple[dict[str, HeadSelection], dict[int, HeadSelection]]:
    """The head statistics on ``heads_n`` examples and, from them, each selector's heads
    (`HEAD_SELECTORS`) and the random selector's draw for every training seed (a random arm
    draws anew per seed). Disk-cached underneath."""
    stats, _ = head_stats(stats_config(cfg), progress=progress, loaded=loaded)
    selections = head_selections(stats, cfg.k, loaded.name, cfg.heads_provenance())
    random_selections = {
        seed: head_selections(stats, cfg.k, loaded.name, cfg.heads_provenance(), ("random",),
                              HeadSelectionConfig(k=cfg.k, seed=seed))["random"]
        for seed in cfg.seeds
    }  # fmt: skip
    return selections, random_selections


def plan_heads(cfg: ClaimsConfig, inputs: ClaimInputs, add: Callable[..., None]) -> None:
    """H1's and H2's runs, one per arm and seed (none before the heads are selected)."""
    for claim, arms in ARMS.items():
        if claim not in cfg.only or not inputs.selections:
            continue
        for arm in arms:
            for seed in cfg.seeds:
                selection = inputs.selections[HEAD_SELECTORS[arm]]
                if arm == "random heads":  # a random arm draws anew for every training seed
                    selection = inputs.random_selections.get(seed, selection)
                config = dataclasses.replace(  # lr=None: the method's own default rate
                    cfg.base_run(seed), method="heads", options=HeadsOptions(selection), lr=None
                )
                add(claim, arm, config)


def same_heads(inputs: ClaimInputs, a: str, b: str) -> bool:
    """Whether two arms' selectors chose exactly the same heads (HeadSelection equality)."""
    sel_a = inputs.selections.get(HEAD_SELECTORS.get(a, ""))
    sel_b = inputs.selections.get(HEAD_SELECTORS.get(b, ""))
    return sel_a is not None and sel_a == sel_b


def judge_h1(arms, entries, n_seeds, ids, need) -> ClaimResult:
    c = planned_compare(arms["PageRank heads"], arms["random heads"])
    verdict = {"A": "holds", "B": "does not hold", None: "inconclusive"}[c.winner]
    return comparison_result("H1", verdict, c, n_seeds, ids, c.verdict, [c])


def judge_h2(arms, entries, n_seeds, ids, need) -> ClaimResult:
    cs = [planned_compare(arms["PageRank heads"], arms[a]) for a in need[1:]]
    if any(c.winner == "B" for c in cs):
        verdict = "does not hold"
    elif all(c.diff >= 0 for c in cs) and any(c.winner == "A" for c in cs):
        verdict = "holds"
    else:
        verdict = "inconclusive"
    closest = min(cs, key=lambda c: c.diff)
    return comparison_result(
        "H2", verdict, closest, n_seeds, ids, "; ".join(c.verdict for c in cs), cs
    )


def heads_comparisons(runs: pd.DataFrame) -> list[Comparison]:
    """Finished heads runs (``RunsDB.list_runs`` rows, newest first) compared by selector: top-k
    PageRank against every other selector whose runs agree with it in every other setting —
    budget, learning rates, zero-weights file and the other selection settings (k, scope,
    PageRank settings…) — each side one run group (`analysis.runs.results`), one run per seed
    (the newest). Runs whose stored config does not name its selector (older runs) are left
    out."""
    groups: dict[str, dict[str, Any]] = {}
    selecting = method_names(lambda spec: spec.option_field("heads") is not None)
    for run in runs_of(runs):
        if run.status != "done" or run.method not in selecting or not run.stored:
            continue
        config = run.stored
        setting = run.setting
        provenance = dict(setting.get("heads_settings") or {})
        selector = provenance.pop("selector", None)
        if selector is None:
            continue
        provenance.pop("seed", None)  # the random selector's draw
        # everything but the heads the selector chose: what must agree for a fair comparison
        rest = {k: v for k, v in setting.items() if k not in ("heads", "heads_settings")}
        key = run.group
        entry = groups.setdefault(key, {"selector": selector, "setting": setting, "results": [],
                                        "seeds": set(),
                                        "match": setting_digest({**rest, "selection": provenance})})  # fmt: skip
        seed = config.get("seed", 0)
        if seed in entry["seeds"]:
            continue  # the same seed trained again: the newest run stands for it
        entry["seeds"].add(seed)
        entry["results"].append(run.result or {})
    labels = distinct_labels({k: g["setting"] for k, g in groups.items()})
    out = []
    for key, entry in groups.items():
        if entry["selector"] != "pagerank":
            continue
        pagerank = Arm.from_results(labels[key], entry["results"])
        for other_key, other in groups.items():
            if other["selector"] != "pagerank" and other["match"] == entry["match"]:
                out.append(
                    planned_compare(pagerank, Arm.from_results(labels[other_key], other["results"]))
                )
    return out
