"""The Recommend flow in a real browser: the page proposes candidates, "Test these" trains every
arm × 3 seeds, the comparison table fills in, and the HTML report, downloaded, opens offline with
its figures and no outside request. On a server of its own, serving a tiny in-process BERT (two
layers) and its own cache, so that the analyses, the timed steps and the 27 runs take a few
minutes and the shared server's pages never see these runs."""

from __future__ import annotations

import re

import pytest
from browser_utils import assert_no_exception, screenshot_for_docs, serve, wait_idle
from playwright.sync_api import expect
from tiny import make_tiny_model_dir

pytestmark = pytest.mark.browser
TABLE = '[data-testid="stTable"]'
# What a table cuts: the table wider than its box (sideways scrolling), or a cell's text.
CUT = """[...document.querySelectorAll('[data-testid="stTable"]')].flatMap(box => [
  ...(box.scrollWidth > box.clientWidth ? ['the table scrolls sideways'] : []),
  ...[...box.querySelectorAll('td, th')].filter(c => c.scrollWidth > c.clientWidth)
       .map(c => c.textContent)])"""
SMALL = {"steps per run": "2"}  # and the default 3 seeds per arm
MORE = {"batch size": "8", "train examples (0: all)": "32", "dev / test examples": "24",
        "dev score every k steps": "2", "bootstrap repeats (ℓ* counts)": "2",
        "head statistics: n examples": "40", "timed steps per choice": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    model = make_tiny_model_dir("bert", tmp_path_factory.mktemp("recommend-model"))
    cache = tmp_path_factory.mktemp("recommend-cache")
    with serve(cache, TUNESCOPE_MODEL=str(model), TUNESCOPE_N="60") as served:
        yield served


@pytest.fixture
def page(browser, tiny_server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(tiny_server["url"])
    wait_idle(pg)
    yield pg
    context.close()


def _fill(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Tab")


def test_recommend_test_these_fills_the_table_and_the_report_opens_offline(page, browser, tmp_path):
    # The page starts its analyses at once, with the default sizes: set small ones meanwhile
    # (the form is drawn first) and apply them, which restarts the computation.
    page.locator('[data-testid="stSidebarNav"] a', has_text="Recommend").first.click()
    expect(page.get_by_label("steps per run", exact=True)).to_be_visible(timeout=60_000)
    for label, value in SMALL.items():
        _fill(page, label, value)
    page.get_by_text("More settings").click()
    for label, value in MORE.items():
        _fill(page, label, value)
    page.get_by_role("button", name="Apply").click()
    test_these = page.get_by_role("button", name=re.compile(r"Test these: \d+ runs? to queue"))
    expect(test_these).to_be_visible(timeout=300_000)  # analyses and timed steps first
    assert_no_exception(page)
    candidates = page.locator(TABLE).first
    expect(candidates).to_contain_text("PageRank heads")
    expect(candidates).to_contain_text("BitFit")
    assert page.evaluate(CUT) == []  # "trains" and "evidence" wrap
    test_these.click()
    expect(page.get_by_text(re.compile(r"Queued \d+ run"))).to_be_visible(timeout=60_000)
    expect(page.get_by_text(re.compile(r"(\d+) of \1 runs done"))).to_be_visible(timeout=600_000)
    wait_idle(page)
    comparison = page.locator(TABLE, has_text="reference")
    expect(comparison.first).to_contain_text("full fine-tuning")
    expect(comparison.first).to_contain_text("EVA LoRA")
    expect(comparison.first).to_contain_text("3")  # n_seeds: the default 3 per arm
    assert page.evaluate(CUT) == []
    assert_no_exception(page)
    screenshot_for_docs(page, "recommend")
    with page.expect_download(timeout=120_000) as download:
        page.get_by_role("button", name="Report (one HTML file)").click()
    report = tmp_path / "report.html"
    download.value.save_as(report)
    assert report.stat().st_size > 1_000_000  # plotly.js inside

    offline = browser.new_context(offline=True)
    try:
        view = offline.new_page()
        asked: list[str] = []
        view.on("request", lambda request: asked.append(request.url))
        view.goto(report.as_uri())
        expect(view.locator(".js-plotly-plot").nth(1)).to_be_attached(timeout=60_000)
        expect(view.get_by_text("The comparison at equal budget")).to_be_visible()
        expect(view.locator("table").nth(2)).to_contain_text("full fine-tuning")
        view.wait_for_timeout(1000)
        outside = [u for u in asked if not u.startswith(("file:", "data:", "blob:", "about:"))]
        assert not outside, outside[:5]
    finally:
        offline.close()
