"""The recommendation as one self-contained HTML file a user can send to a colleague: the question,
the settings, the candidates with their cost and evidence, the comparison at equal budget with
its verdicts, the figures and the sentence. plotly.js is written into the file once (no request
leaves the page: no CDN, no fonts, no MathJax). Nothing here imports streamlit: the CLI's
``recommend --report`` uses it too."""

from __future__ import annotations

import html
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from analysis.io import atomic_write_text
from analysis.recommend.outcome import POINTS, ArmOutcome, Decision, design_of
from ui.figures.recommend import comparison_figure, cost_figure

if TYPE_CHECKING:
    import pandas as pd

    from analysis.recommend.recommendation import Recommendation

# Plotly's own links (the logo, "edit in Chart Studio") off: nothing in the file points outside.
FIGURE_CONFIG = {"displaylogo": False, "showSendToCloud": False, "responsive": True}
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.sentence { font-size: 1.15em; padding: 0.8em 1em; background: #eef6ee; border-left: 4px solid #2ca02c; }
.muted { color: #666; font-size: 0.9em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _num(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt)


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row)
        ) + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def report_html(rec: Recommendation, runs: pd.DataFrame) -> str:
    """The whole report as one HTML document (plotly.js inline, once)."""
    import plotly.offline

    cfg, evidence = rec.cfg, rec.evidence
    arms, decision = rec.outcome(runs)
    choices = rec.proposal.choices
    costs = [rec.costs.get(c.name) for c in choices]
    cost_fig = cost_figure(
        [c.name for c in choices], [k.share for k in costs], [k.step_time_ratio for k in costs],
        [c.role for c in choices],
    )  # fmt: skip
    parts = [
        f"<h1>What to tune: {_e(cfg.model.name)} on {_e(cfg.data.name)}</h1>",
        f'<p class="muted">tunescope recommendation, {time.strftime("%Y-%m-%d %H:%M")}</p>',
        f'<p class="sentence">{_e(decision.sentence)}</p>',
        "<h2>The question</h2>",
        "<p>Which layers, heads or adapters of this encoder should be fine-tuned for this task, "
        "and what does that choice cost and buy? The candidates come from the model's own layer "
        "and head analyses; each is tested against what a practitioner would otherwise do at the "
        "same trainable budget, and against full fine-tuning.</p>",
        "<h2>Settings</h2>",
        _settings_table(rec),
        "<h2>Candidates and alternatives</h2>",
        _choices_table(rec),
        *(f'<p class="muted">{_e(note)}</p>' for note in rec.proposal.notes),
        _embedded(cost_fig),
        "<h2>The comparison at equal budget</h2>",
        _comparison_section(arms, decision, cfg.delta, evidence.metric),
        "<h2>How the sentence is decided</h2>",
        f"<p>{_e(rule_words(cfg))}</p>",
    ]
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>tunescope recommendation: {_e(cfg.model.name)} on {_e(cfg.data.name)}</title>"
        f"<style>{STYLE}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        f"</head><body>\n{body}\n</body></html>\n"
    )


def rule_words(cfg) -> str:
    """The comparison's rule in words, with the design's numbers."""
    design = design_of(cfg)
    plan = {
        "sequential": f"in rounds, cheapest arm first: every arm starts with {design.r0} seeds, "
        f"each round adds one seed to full fine-tuning and to every arm still undecided, up to "
        f"{design.r_max}, and once an arm holds up, costlier arms get no more",
        "fixed": f"every arm × {len(cfg.seeds)} seeds, judged once at the end",
        "whole-table": f"every arm to {design.r_max} seeds",
    }[cfg.design]
    return (
        f"Every arm is trained with full fine-tuning's seeds (common random numbers), {plan}. "
        "Each arm against full: d = score(arm, s) − score(full, s) over the seeds both have; the "
        "interval is d̄ ± c · se, the paired t with c = t(1 − α/K, n − 1) adjusted for the "
        f"K = {design.looks} look{'s' if design.looks != 1 else ''} the design may take "
        f"(Bonferroni over looks, α = {design.alpha:g} one-sided). An arm holds up when its "
        f"interval's lower end is at least −δ = −{cfg.delta:g} point (1 point = 0.01 of the "
        "metric), is shown worse when its upper end is below −δ, else stays undecided. The "
        "recommendation is the cheapest arm (step time, then trainable share) that held up; if "
        "none: 'fine-tune the whole model' when every cheaper arm was shown worse, else "
        "'undecided', with each interval. Only runs identical in every setting but the seed are "
        "averaged."
    )


def _settings_table(rec: Recommendation) -> str:
    cfg, evidence = rec.cfg, rec.evidence
    rows = [
        ["model", f"{_e(cfg.model.name)} ({evidence.family}, {evidence.n_layers} layers, "
                  f"{evidence.n_heads} heads, d = {evidence.d_model})"],
        ["data", f"{_e(cfg.data.name)} (metric: {evidence.metric})"],
        ["analyses", f"N = {cfg.n:,} examples (seed {cfg.sample_seed}, {cfg.pooling} pooling, "
                     f"≤ {cfg.max_length} tokens); {_e(evidence.l_star_words())}; heads on "
                     f"n = {cfg.heads_n} examples"],
        ["budget", _e(cfg.budget.text())],
        ["runs", f"{cfg.design} design, {len(cfg.seeds)} seeds to start "
                 f"({', '.join(map(str, cfg.seeds))}), at most {cfg.max_seeds}, "
                 f"{cfg.steps} steps of batch {cfg.batch_size}, test part ≤ {cfg.n_eval} "
                 "examples, each method's default learning rate, classifier 1e-3"],
        ["step time", f"median of {cfg.timed_steps} timed steps on one batch, as a share of full "
                      "fine-tuning's (timed first and last)"],
        ["δ", f"{cfg.delta:g} point"],
    ]  # fmt: skip
    return _table(["setting", "value"], rows)


def _choices_table(rec: Recommendation) -> str:
    rows = []
    for choice in rec.proposal.choices:
        cost = rec.costs.get(choice.name)
        rows.append([
            _e(choice.name), _e(choice.role), _e(choice.trains),
            _num(None if cost is None else 100 * cost.share, ".2f") + " %",
            _num(None if cost is None else cost.step_time_ratio, ".2f") + "×",
            _e(choice.evidence), _e("" if cost is None else cost.match),
        ])  # fmt: skip
    header = ["choice", "role", "trains", "trainable", "step time", "evidence", "budget"]
    return _table(header, rows, numeric={3, 4})


def _comparison_section(arms: list[ArmOutcome], decision: Decision, delta: float,
                        metric: str) -> str:  # fmt: skip
    if not any(a.n_seeds for a in arms):
        return "<p>Not compared yet: no run of these settings has finished.</p>"
    rows = []
    for a in arms:
        diff = "–" if a.role == "reference" else (
            f"{_num(POINTS * a.diff, '+.1f')} ± {_num(POINTS * a.margin, '.1f')} "
            f"[{_num(POINTS * a.lo, '+.1f')}, {_num(POINTS * a.hi, '+.1f')}]"
        )  # fmt: skip
        rows.append([
            _e(a.name), str(a.n_seeds), f"{_num(a.mean, '.4f')} ± {_num(a.se, '.4f')}", diff,
            _e(a.verdict), _num(a.step_time_ratio, ".2f") + "×",
            _num(None if a.trainable_share is None else 100 * a.trainable_share, ".2f") + " %",
            _num(a.peak_mem_mb, ".0f"), "yes" if a.frontier else "",
        ])  # fmt: skip
    header = ["arm", "n seeds", f"test {metric} (mean ± s.e.)",
              "diff vs full (points, ± c·se [interval])",
              "verdict", "step time", "trainable", "peak MB", "frontier"]  # fmt: skip
    fig = comparison_figure(arms, delta, metric)
    return _table(header, rows, numeric={1, 2, 3, 5, 6, 7}) + _embedded(fig)


def _embedded(fig: go.Figure) -> str:
    """``fig`` as an HTML fragment, in plotly's own template: the file reads the same whether the
    dashboard (whose process sets Streamlit's template) or the command line wrote it."""
    fig = go.Figure(fig).update_layout(template="plotly")
    return fig.to_html(include_plotlyjs=False, full_html=False, config=FIGURE_CONFIG)


def write_report(rec: Recommendation, runs: pd.DataFrame, path: Path | str) -> Path:
    """Write `report_html` to ``path`` (atomically) and return it."""
    return atomic_write_text(Path(path), report_html(rec, runs))
