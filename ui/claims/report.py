"""The ``claims`` report: Markdown with each claim's figure as an HTML file beside it.

The figures are the Paper check page's (`ui.figures.claims`); each is a small HTML file that loads
``plotly.min.js`` from the same folder (written once), so the report opens offline without a
copy of plotly.js (several MB) in every figure. Nothing here imports streamlit: the CLI uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from analysis.claims import PAPERS, ClaimResult, ClaimsConfig, claims_table
from analysis.io import atomic_write_text
from ui.figures.claims import claim_figure


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def write_report(
    cfg: ClaimsConfig, results: Sequence[ClaimResult], path: Path | str, metric: str = "score"
) -> list[Path]:
    """Write the Markdown report at ``path`` and its figures beside it (``<stem>-X1.html``…,
    plus ``plotly.min.js``); returns every file written."""
    import plotly.offline

    path = Path(path)
    folder = path.parent
    written = []
    figures: dict[str, str] = {}
    for result in results:
        fig = claim_figure(result, metric)
        if fig is None:
            continue
        name = f"{path.stem}-{result.id}.html"
        html = fig.to_html(include_plotlyjs="directory", full_html=True)
        written.append(atomic_write_text(folder / name, html))
        figures[result.id] = name
    if figures:
        written.append(atomic_write_text(folder / "plotly.min.js", plotly.offline.get_plotlyjs()))
    table = claims_table(results)
    lines = [
        f"# The papers' claims on {cfg.model.name} × {cfg.data.name}",
        "",
        f"Layer claims: N = {cfg.n} examples, R = {cfg.repeats} bootstrap repeats on each of "
        f"S = {cfg.samples} samples (90 % BCa intervals around the full-sample values; samples "
        "that disagree: unstable). Run claims: "
        f"{len(cfg.seeds)} seeds ({', '.join(map(str, cfg.seeds))}) × {cfg.steps} steps, batch "
        f"{cfg.batch_size}, test part ≤ {cfg.n_eval} examples; heads: k = {cfg.k} per layer. "
        "Verdict rule of every comparison: A better when |diff| > t·s.e. (t at 97.5 %, Welch df) of the difference of "
        "mean test scores over seeds, else no difference shown.",
        "",
        "| id | claim | paper | ours | interval | verdict | n |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        cells = [row.id, row.claim, row.paper, row.ours, row.interval, f"**{row.verdict}**", row.n]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for result in results:
        info = result.info
        lines += ["", f"## {result.id}: {info.claim}", "", f"- paper: {info.paper}",
                  f"- measured as: {info.measured_as}", f"- rule: {info.rule}",
                  f"- ours: {result.detail} → **{result.verdict}**"]  # fmt: skip
        for c in result.comparisons:
            paired = "" if c.paired_p is None else f", paired bootstrap p = {c.paired_p:.3f}"
            lines.append(
                f"- {c.name_a} ({c.mean_a:.4f}, n = {c.n_seeds_a}) − {c.name_b} ({c.mean_b:.4f}, "
                f"n = {c.n_seeds_b}) = {c.diff:+.4f} ± {c.se:.4f}: {c.verdict}{paired}"
            )
        if result.runs:
            lines.append(f"- runs: {', '.join(result.runs)}")
        if result.id in figures:
            lines.append(f"- figure: [{figures[result.id]}]({figures[result.id]})")
    lines += ["", "## The papers", ""]
    lines += [f"- **{p.short}**: {p.reference()} {p.url}" for p in PAPERS.values()]
    written.insert(0, atomic_write_text(path, "\n".join(lines) + "\n"))
    return written
