"""Results against baselines: the first paper's Figure 4, score vs trainable parameters with the
Pareto frontier, comparisons with verdicts against full fine-tuning, costs per run group, the
compute a cut model saves, a learning-rate grid's choice on dev, and a downloadable table.

Every point and bar is one run group (runs identical in every setting but the seed,
`analysis.runs.results`), shown as its mean ± standard error with its n_seeds."""

from __future__ import annotations

import json

import streamlit as st

from analysis.io import json_ready
from analysis.runs import results
from analysis.runs.chance import BOTH_AT_CHANCE, flags_of, groups_at_chance, page_baseline
from analysis.runs.planner import planned_compare
from analysis.runs.record import runs_of
from analysis.words import counted
from ui import verdicts
from ui.figures import finetune as figures
from ui.finetune.state import get_db
from ui.tables import dashes


@st.fragment(run_every=10)
def results_view(model: str, data: str, n_layers: int, l_star: int | None) -> None:
    db = get_db()
    runs = db.list_runs(model=model, data=data)
    table = results.results_table(runs, l_star=l_star, n_layers=n_layers)
    if table.empty:
        st.info("No finished run of this model on this data yet: queue some in the form above.")
        return
    by_id = {run.id: run.result for run in runs_of(runs)}
    table.insert(table.columns.get_loc("score") + 1, "flag", flags_of(table["id"], by_id))
    baseline = page_baseline(by_id.get(i) for i in table["id"])
    everything = results.summarise(table)
    choices = results.lr_choices(everything)
    summary = results.without_unchosen_lrs(everything)
    metric = str(table["metric"].dropna().iloc[0]) if table["metric"].notna().any() else "score"
    st.caption(
        f"{counted(len(table), 'finished run')} in {counted(len(everything), 'run group')} of "
        "this model and data (a group: runs identical in every setting but the seed) · refreshes "
        f"every 10 s · families: as queued by a sweep, else judged against ℓ* = {l_star}"
    )
    chance_note(table, baseline)

    st.subheader("Score vs number of tuned layers")
    st.markdown(
        "Each dot is one strategy (ℓ_bottom, ℓ_top, ℓ_cls): blue ℓ*-down (tune up to ℓ*), green "
        "ℓ*-up (tune above ℓ*), red the usual baselines. The paper's claim: with a budget of ≤ 3 "
        "tuned layers, ℓ*-down beats tuning the top layers. Circles: the model is cut at ℓ_cls < L; "
        "diamonds: the classifier reads the top layer L. Bars: the standard error over seeds:"
    )
    st.latex(r"\bar s \pm \frac{\mathrm{sd}(s_1,\dots,s_n)}{\sqrt{n}}\quad (n = \text{seeds})")
    st.plotly_chart(figures.score_vs_layers(summary, metric, n_layers, baseline), width="stretch")

    st.subheader("Score vs trainable parameters")
    st.markdown(
        "Where each method sits on the cost/benefit curve. The dotted line is the Pareto frontier: "
        "the runs no other run beats with as few or fewer trainable parameters."
    )
    st.latex(r"\text{share} = n_\text{trainable} / n_\text{params}")
    st.plotly_chart(figures.score_vs_params(summary, metric, baseline), width="stretch")

    comparisons_view(table, summary, runs, metric)

    st.subheader("Wall-clock and peak memory")
    st.markdown(
        "Measured per run; each bar is a run group's mean over its seeds (n = … on the bar) with "
        "± one standard error. Peak memory is measured per process: the peak resident memory of "
        "the worker process that trained the run, less what that process held when the run "
        "started (its model loaded) — the trainable copy, optimizer state and activations. Runs "
        "that train side by side each train in a worker process of their own, so neither counts "
        "the other's memory."
    )
    st.plotly_chart(figures.costs(summary), width="stretch")
    if not choices.empty:
        lr_grid_view(choices)

    saved = results.compute_saved(summary, n_layers)
    st.subheader("Compute saved by cutting the model at the classifier's layer")
    if saved.empty:
        st.info("Needs a full fine-tuning run and a run with ℓ_cls < L, such as (1, ℓ*, ℓ*).")
    else:
        st.markdown(
            "A run whose classifier reads layer ℓ_cls < L never computes the layers above it. "
            "Bars: what it saves against full fine-tuning; dots: its score."
        )
        st.latex(r"\text{saved} = 1 - t_\text{step} / t_\text{step}^{(1, L, L)}")
        st.plotly_chart(figures.compute_saved(saved, metric, baseline), width="stretch")
        percent = st.column_config.NumberColumn(format="percent")
        st.dataframe(
            saved,
            hide_index=True,
            width="stretch",
            column_config={
                "layers_saved": percent,
                "step_time_saved": percent,
                "memory_saved": percent,
            },
        )

    st.subheader("Every finished run")
    st.dataframe(dashes(table), hide_index=True, width="stretch")
    left, right = st.columns(2)
    left.download_button(
        "Download CSV", table.to_csv(index=False), "finetune_results.csv", "text/csv"
    )
    right.download_button(
        "Download JSON",
        json.dumps(json_ready(table), indent=1),
        "finetune_results.json",
        "application/json",
    )

    st.subheader("Run groups: mean ± standard error over seeds")
    groups = everything.drop(columns=["lr_sibling", "budget"])
    st.dataframe(dashes(groups), hide_index=True, width="stretch")
    st.download_button(
        "Download the groups (CSV)", groups.to_csv(index=False), "finetune_groups.csv", "text/csv"
    )


def comparisons_view(table, summary, runs, metric: str) -> None:
    """Every run group against full fine-tuning of the same budget, and any two groups."""
    st.subheader("Against full fine-tuning, with verdicts")
    arms = results.group_arms(table, runs)
    refs = results.full_references(summary).set_index("budget")["group"]
    labels = dict(zip(summary["group"], summary["label"], strict=True))
    at_chance = groups_at_chance(table)
    pairs = [
        (g, refs[b])
        for g, b in zip(summary["group"], summary["budget"], strict=True)
        if b in refs.index and g != refs[b]
    ]
    withheld = [p for p in pairs if set(p) <= at_chance]
    against_full = [planned_compare(arms[a], arms[b]) for a, b in pairs if (a, b) not in withheld]
    verdicts.explain()
    if against_full:
        verdicts.show(against_full, metric, "ft_vs_full")
    elif not withheld:
        st.info("Needs a full fine-tuning run with the same steps, batch size and data.")
    verdicts.withheld([BOTH_AT_CHANCE.format(a=labels[a], b=labels[b]) for a, b in withheld])
    if len(labels) >= 2:
        left, right = st.columns(2)
        a = left.selectbox("A", list(labels), format_func=labels.get, key="ft_cmp_a")
        b = right.selectbox("B", list(labels), index=1, format_func=labels.get, key="ft_cmp_b")
        if a != b and {a, b} <= at_chance:
            verdicts.withheld([BOTH_AT_CHANCE.format(a=labels[a], b=labels[b])])
        elif a != b:
            verdicts.show([planned_compare(arms[a], arms[b])], metric, "ft_pair")


def chance_note(table, baseline) -> None:
    """The majority-class and chance baselines, and a warning naming the runs at chance level."""
    if baseline is not None:
        st.caption(
            f"Baselines of the test part (dashed and dotted lines on the score figures): "
            f"{baseline.describe()}. A score at or below the majority class means the run has "
            "not learned the task."
        )
    flagged = table[table["flag"] != ""]
    if not flagged.empty:
        st.warning(
            f"{len(flagged)} of {counted(len(table), 'run')} {'is' if len(flagged) == 1 else 'are'} "
            "at chance level (column *flag*): "
            + "; ".join(f"{i} ({lab}): {f}" for i, lab, f in
                        zip(flagged["id"], flagged["label"], flagged["flag"], strict=True))
            + ". Their scores are not findings; train longer or with a larger learning rate.",
            icon=":material/warning:",
        )  # fmt: skip


def lr_grid_view(choices) -> None:
    st.subheader("Learning-rate grid, chosen on the dev part")
    st.markdown(
        "A sweep tried several body learning rates per strategy (the classifier's stays fixed). "
        "For each strategy the rate with the best mean **dev** score is kept; the figures above "
        "show only that one. The test scores below are reported, never used to choose."
    )
    st.dataframe(choices.drop(columns=["lr_sibling", "group"]), hide_index=True, width="stretch")
