"""The Paper check page's live part: the claims table, each claim's figure and comparisons, and
queueing the runs the claims still need (a fragment that refreshes as runs finish)."""

from __future__ import annotations

import json

import streamlit as st

from analysis import claims
from analysis.claims import ClaimInputs, ClaimsConfig
from analysis.words import counted
from ui import verdicts
from ui.cancel import cancel_rest
from ui.figures.claims import VERDICT_COLOURS, VERDICT_WIDTH, claim_figure
from ui.finetune.state import format_seconds, get_db
from ui.layers.text import X1_AND_THE_LAYERS_PAGE

FOLLOW_UP = "claims_follow_up"  # the user queued claims' runs: queue the second stage too


def _style(verdict: str) -> str:
    return f"background-color: {VERDICT_COLOURS.get(verdict, '#ffffff')}55"


@st.fragment(run_every=10)
def claims_view(cfg: ClaimsConfig, inputs: ClaimInputs) -> None:
    db = get_db()
    db.reap_dead()
    runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
    planned = _plan(cfg, inputs, db, runs)
    results = claims.evaluate(cfg, inputs, planned, runs)
    table = claims.claims_table(results)
    measured = sum(r.verdict != "not measured yet" for r in results)
    st.caption(
        f"{measured} of {len(results)} claims measured on {cfg.model.name} × {cfg.data.name} · "
        "refreshes every 10 s while runs train"
    )
    # The verdict and our number come right after the id, so they are on screen without
    # scrolling sideways; the long texts follow (the papers are named below the table).
    table = table[["id", "verdict", "ours", "interval", "n", "claim", "paper", "detail"]]
    st.dataframe(
        table.style.map(_style, subset=["verdict"]), hide_index=True, width="stretch",
        column_config={
            "id": st.column_config.TextColumn("id", width="small"),
            "verdict": st.column_config.TextColumn("verdict", width=VERDICT_WIDTH),
            "claim": st.column_config.TextColumn("claim", width="large"),
            "paper": st.column_config.TextColumn("the paper's number", width="large"),
        },
    )  # fmt: skip
    papers_section()
    left, right = st.columns(2)
    left.download_button(
        "Claims (JSON)", json.dumps(claims.claims_json(cfg, results), indent=1),
        "claims.json", "application/json",
    )  # fmt: skip
    right.download_button("Claims (CSV)", table.to_csv(index=False), "claims.csv", "text/csv")
    _queue_section(cfg, db, planned, runs)
    metric = str(runs["metric"].dropna().iloc[0]) if runs["metric"].notna().any() else "score"
    for result in results:
        info = result.info
        with st.expander(f"{result.id} · {info.claim} — **{result.verdict}**"):
            st.markdown(
                f"**Paper:** {info.paper}  \n**Measured as:** {info.measured_as}  \n"
                f"**Rule:** {info.rule}  \n**Ours:** {result.detail}"
            )
            if result.id == "X1":
                st.caption(X1_AND_THE_LAYERS_PAGE)
            fig = claim_figure(result, metric)
            if fig is not None:
                st.plotly_chart(fig, width="stretch", key=f"claims_fig_{result.id}")
            if result.comparisons:
                verdicts.show(result.comparisons, metric, f"claims_{result.id}")
            if result.runs:
                st.caption("Runs: " + ", ".join(result.runs))


def papers_section() -> None:
    """The papers the claims cite, by name (title, authors, year, venue, arXiv id)."""
    st.markdown(
        "**The papers** — " + "  \n".join(
            f"**{p.short}**: {p.authors} ({p.year}). [*{p.title}*]({p.url}). {p.venue}, "
            f"arXiv {p.arxiv}." for p in claims.PAPERS.values()
        )
    )  # fmt: skip


def _plan(cfg: ClaimsConfig, inputs: ClaimInputs, db, runs) -> list:
    """The plan, with the second stage once the trajectory run is done (and, after the user
    queued the claims' runs here, its disable files written and its runs queued)."""
    source = claims.source_run(cfg, runs) if {"S1", "S2"} & set(cfg.only) else None
    source_id = source["id"] if source and source["status"] == "done" else None
    if (
        source_id
        and st.session_state.get(FOLLOW_UP)
        and "S2" in cfg.only
        and not db.workspace.outlier_file(source_id).is_file()
    ):
        with st.spinner("Finding the outlier weights of the trajectory run…"):
            claims.write_disable_files(db, source_id, cfg.seeds)
    planned = claims.plan_runs(cfg, inputs, source=source_id, root=db.workspace.root)
    if st.session_state.get(FOLLOW_UP) and source_id:
        second = [p for p in claims.missing_runs(planned, runs) if p.stage == 1]
        if second:
            ids = claims.queue_runs(db, second, st.session_state[FOLLOW_UP])
            st.toast(f"The trajectory run is done: queued {counted(len(ids), 'subspace run')}.")
    return planned


def _queue_section(cfg: ClaimsConfig, db, planned: list, runs) -> None:
    missing = claims.missing_runs(planned, runs)
    status = claims.run_status(planned, runs)
    active = sum(v["status"] in ("queued", "running") for v in status.values())
    if active:
        st.info(f"{active} of the claims' runs are queued or training; the table fills in as "
                "they finish (the Fine-tune page shows them live).")  # fmt: skip
        statuses = {v["id"]: v["status"] for v in status.values()}
        # Cancelled, the claims' second stage is not queued when the trajectory run is done.
        cancel_rest(
            db, statuses, "claims_cancel_rest", then=lambda: st.session_state.pop(FOLLOW_UP, None)
        )
    if not missing:
        return
    seconds, how = claims.estimate_seconds(missing, runs)
    estimate = (
        f"about **{format_seconds(seconds)}** of training ({how})"
        if seconds is not None
        else f"time unknown until a run of {cfg.model.name} has finished ({how})"
    )
    arms = sorted({p.arm for p in missing})
    st.markdown(
        f"**{counted(len(missing), 'run')} missing** ({', '.join(arms)}; "
        f"{counted(cfg.steps, 'step')} each, seeds {', '.join(map(str, cfg.seeds))}): {estimate}. "
        "Finished runs with the same settings are reused."
        + (" The subspace claims first need a fine-tuning run that records its trajectory; "
           "their other runs are queued once it is done." if any(
               p.arm == "trajectory source" for p in missing) else "")
    )  # fmt: skip
    if st.button(
        f"Queue the {counted(len(missing), 'missing run')}", type="primary", key="claims_queue"
    ):
        import time

        sweep_id = "claims-" + time.strftime("%Y%m%d-%H%M%S")
        ids = claims.queue_runs(db, missing, sweep_id)
        st.session_state[FOLLOW_UP] = sweep_id
        st.success(
            f"Queued {counted(len(ids), 'run')} as {sweep_id}; a background worker trains them."
        )
