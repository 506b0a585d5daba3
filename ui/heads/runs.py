"""The Heads page's comparison: do the chosen heads train better than random ones, and than the
ablation selectors? Finished heads runs compared by selector with verdicts, and a form that
queues the runs (the Paper check page's claims H1 and H2 reuse them, and vice versa)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import streamlit as st

from analysis import claims
from analysis.finetune.registry import method_names
from analysis.heads.selection_file import SELECTOR_LABELS
from analysis.runs.chance import BOTH_AT_CHANCE, chance_flag
from analysis.runs.record import runs_of
from analysis.runs.results import distinct_labels
from analysis.words import counted
from ui import verdicts
from ui.finetune.executor import chosen_executor
from ui.finetune.state import format_seconds, get_db

if TYPE_CHECKING:
    from analysis.config import ExtractConfig
    from analysis.heads.select import HeadSelectionConfig
    from analysis.heads.stats import HeadStats
    from analysis.models import LoadedModel


def labels_at_chance(runs) -> set[str]:
    """The labels of the heads run groups (as `analysis.claims.heads_comparisons` names them:
    `distinct_labels` over the finished heads runs that record their selector) all of whose runs
    are at chance level (`analysis.runs.chance.chance_flag`)."""
    settings, flagged = {}, {}
    selecting = method_names(lambda spec: spec.option_field("heads") is not None)
    for run in runs_of(runs):
        if run.status != "done" or run.method not in selecting or not run.stored:
            continue
        if (run.setting.get("heads_settings") or {}).get("selector") is None:
            continue
        key = run.group
        settings.setdefault(key, run.setting)
        flagged[key] = flagged.get(key, True) and bool(chance_flag(run.result))
    labels = distinct_labels(settings)
    return {labels[k] for k, at in flagged.items() if at}


def heads_runs_view(
    base: ExtractConfig,
    stats: HeadStats,
    selection_cfg: HeadSelectionConfig,
    loaded: LoadedModel,
    xi: float,
) -> None:
    st.markdown(
        "HiFi's ablations (Table 3) fine-tune the heads each selector picks — top-k PageRank, "
        "k random heads per layer, top-k information richness I_h, top-k total correlation — "
        "with everything else equal, over several seeds. Each comparison below is PageRank "
        "minus another selector, with the same k, budget and PageRank settings."
    )
    db = get_db()
    runs = db.list_runs(model=base.model.name, data=base.data.name)
    everything = claims.heads_comparisons(runs)
    at_chance = labels_at_chance(runs)
    found = [c for c in everything if not {c.name_a, c.name_b} <= at_chance]
    metric = str(runs["metric"].dropna().iloc[0]) if runs["metric"].notna().any() else "score"
    verdicts.withheld(
        [BOTH_AT_CHANCE.format(a=c.name_a, b=c.name_b) for c in everything if c not in found]
    )
    if found:
        verdicts.show(found, metric, "heads_selectors")
        verdicts.explain()
    elif not everything:
        st.info("No finished heads runs of this model and data to compare yet: queue some below.")
    with st.form("heads_selector_runs"):
        c1, c2 = st.columns(2)
        seeds = c1.number_input("seeds", 1, 10, 3, key="heads_cmp_seeds")
        steps = c2.number_input("steps per run", 1, 100_000, 200, step=50, key="heads_cmp_steps")
        st.caption(
            "Per seed: " + ", ".join(SELECTOR_LABELS[s] for s in ("pagerank", "random",
            "richness", "correlation")) + f" (k = {selection_cfg.k}, this page's PageRank "
            "settings). Runs that already exist with the same settings are reused."
        )  # fmt: skip
        submitted = st.form_submit_button("Estimate and queue the missing runs")
    if not submitted:
        return
    cfg = claims.ClaimsConfig(
        model=base.model, data=base.data, only=("H1", "H2"), sample_seed=base.sample.seed,
        max_length=base.max_length, seeds=tuple(range(int(seeds))), steps=int(steps),
        k=selection_cfg.k, heads_n=stats.n, xi=xi,
    )  # fmt: skip
    selections = claims.head_selections(
        stats, selection_cfg.k, loaded.name, cfg.heads_provenance(), base=selection_cfg
    )
    inputs = claims.ClaimInputs(n_layers=loaded.n_layers, selections=selections)
    missing = claims.missing_runs(claims.plan_runs(cfg, inputs), runs)
    if not missing:
        st.success("Every run is already there (finished, queued or training).")
        return
    seconds, how = claims.estimate_seconds(missing, runs)
    sweep_id = "heads-" + time.strftime("%Y%m%d-%H%M%S")
    ids = claims.queue_runs(db, missing, sweep_id, chosen_executor())  # as Train on says
    estimate = "unknown" if seconds is None else f"about {format_seconds(seconds)} ({how})"
    st.success(
        f"Queued {counted(len(ids), 'heads run')}: {estimate}. A background worker trains them; "
        "the verdicts above fill in as they finish (and on the Paper check page, H1 and H2). They "
        'train where the Fine-tune page\'s "Train on" says.'
    )
