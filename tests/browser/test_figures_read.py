"""The Recommend figures as a person sees them, drawn by plotly.js in a real browser (no server):
no two point labels overlap, the log axis names only its powers of ten, and in the HTML report
(written by the dashboard's process, whose plotly template is Streamlit's) no y axis title covers
its tick labels and the tables fit the page, their long texts wrapped."""

from __future__ import annotations

import itertools
from pathlib import Path

import plotly.offline
import pytest
from recommend_examples import CROWDED, crowded_cost_figure, finished_runs, recommendation

from analysis.recommend.outcome import ArmOutcome
from ui.figures.recommend import comparison_figure

pytestmark = pytest.mark.browser
LABELS = ".annotation-text, .textpoint text"  # annotations, or text printed at the markers
BOXES = """selector => [...document.querySelectorAll(selector)].map(e => {
  const r = e.getBoundingClientRect();
  return {text: e.textContent, left: r.left, top: r.top, right: r.right, bottom: r.bottom};
})"""


def boxes(page, selector: str) -> list[dict]:
    """Every element of ``selector``: its text and its rendered box (px)."""
    return page.evaluate(BOXES, selector)


def overlap(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and (a["top"] < b["bottom"] and b["top"] < a["bottom"])
    )


def overlapping(found: list[dict]) -> list[tuple[str, str]]:
    return [(a["text"], b["text"]) for a, b in itertools.combinations(found, 2) if overlap(a, b)]


def show(browser, path: Path, width: int = 1400):
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    page.goto(path.as_uri())
    page.wait_for_selector(".js-plotly-plot .xtick", state="attached", timeout=60_000)
    return context, page


def figure_file(fig, path: Path) -> Path:
    script = f"<script>{plotly.offline.get_plotlyjs()}</script>"
    body = fig.to_html(include_plotlyjs=False, full_html=False)
    path.write_text(f"<html><head>{script}</head><body>{body}</body></html>")
    return path


@pytest.mark.parametrize("width", [1400, 900])
def test_the_cost_figures_labels_never_overlap_and_its_log_axis_names_decades(
    browser, tmp_path, width
):
    context, page = show(browser, figure_file(crowded_cost_figure(), tmp_path / "c.html"), width)
    try:
        labels = [b for b in boxes(page, LABELS) if b["text"] in CROWDED]
        assert sorted(b["text"] for b in labels) == sorted(CROWDED)
        assert not overlapping(labels), overlapping(labels)
        ticks = [b["text"] for b in boxes(page, ".xtick text")]
        assert ticks == ["0.1", "1", "10", "100"], ticks
    finally:
        context.close()


def test_the_comparisons_labels_never_overlap(browser, tmp_path):
    arms = [
        ArmOutcome(name, role, "layers", 3, mean=0.8 - 0.002 * i, se=0.01,
                   diff=-0.002 * i, margin=0.02, step_time_ratio=ratio,
                   trainable_share=share, verdict="no difference shown")
        for i, (name, (role, share, ratio)) in enumerate(CROWDED.items())
    ]  # fmt: skip
    fig = comparison_figure(arms, 1.0, "accuracy")
    context, page = show(browser, figure_file(fig, tmp_path / "comparison.html"))
    try:
        labels = [b for b in boxes(page, LABELS) if b["text"] in CROWDED]
        assert sorted(b["text"] for b in labels) == sorted(CROWDED)
        assert not overlapping(labels), overlapping(labels)
    finally:
        context.close()


@pytest.mark.parametrize("width", [1400, 800])
def test_the_reports_axis_titles_clear_their_ticks_and_its_tables_fit(browser, tmp_path, width):
    import streamlit.elements.plotly_chart  # noqa: F401 (the dashboard's process: its template)

    from ui.recommend.report import write_report

    rec = recommendation()
    report = write_report(rec, finished_runs(rec), tmp_path / "report.html")
    context, page = show(browser, report, width)
    try:
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length == 2")
        for axis in ("y", "y2"):
            titles = boxes(page, f".g-{axis}title text")
            ticks = boxes(page, f".{axis}tick text")
            clash = [(t["text"], k["text"]) for t in titles for k in ticks if overlap(t, k)]
            assert titles and ticks and not clash, (axis, clash)
        page_width = page.evaluate("document.documentElement.clientWidth")
        assert page.evaluate("document.documentElement.scrollWidth") <= page_width
        cells = page.evaluate(
            "[...document.querySelectorAll('td')].filter(c => c.scrollWidth > c.clientWidth)"
            ".map(c => c.textContent)"
        )
        assert cells == [], cells  # no cut text
    finally:
        context.close()
