"""A person's walk through the dashboard in a real browser (Debian's chromium via Playwright),
on the embedded default model (MiniLM) and data (movie snippets)."""

from __future__ import annotations

import re

import pytest
from browser_utils import (
    FALLBACK_FONT,
    assert_no_exception,
    cut_texts,
    goto_page,
    screenshot_for_docs,
    wait_idle,
)
from playwright.sync_api import expect

pytestmark = pytest.mark.browser
CHART = '[data-testid="stPlotlyChart"]'


def test_home_then_data_page(page):
    expect(page.locator("h1").first).to_contain_text("tunescope")
    assert_no_exception(page)
    screenshot_for_docs(page, "home")
    goto_page(page, "Data")
    assert_no_exception(page)
    expect(page.locator(CHART).nth(1)).to_be_visible(timeout=60_000)  # at least two figures
    expect(page.locator('[data-testid="stMetric"]').nth(2)).to_be_visible()  # at least three
    screenshot_for_docs(page, "data")


def test_layers_metrics_and_layer_slider(page):
    goto_page(page, "Layers")
    expect(page.locator(CHART).first).to_be_visible(timeout=180_000)
    assert_no_exception(page)
    expect(page.get_by_text("ℓ*").first).to_be_visible()
    screenshot_for_docs(page, "layers")
    page.get_by_role("tab", name="Layer picture").click()
    slider = page.get_by_role("slider").first
    expect(slider).to_be_visible(timeout=60_000)  # at once: only the chosen tab runs
    before = slider.get_attribute("aria-valuenow")
    slider.focus()
    page.keyboard.press("ArrowLeft")
    wait_idle(page)
    expect(page.get_by_role("slider").first).not_to_have_attribute("aria-valuenow", before or "")
    assert_no_exception(page)
    expect(page.locator(CHART).first).to_be_visible(timeout=60_000)  # the layer picture


def test_heads_heatmap(page):
    goto_page(page, "Heads")
    expect(page.locator(CHART).first).to_be_visible(timeout=300_000)
    wait_idle(page, timeout_s=300)
    assert_no_exception(page)
    heatmaps = page.locator(f"{CHART} .heatmaplayer")
    expect(heatmaps.first).to_be_attached(timeout=30_000)

    screenshot_for_docs(page, "heads")


def test_heads_form_and_figures_read_whole_at_1400_px(page):
    """Every label and choice of the Heads form and its numbers reads whole at 1,400 px, in the
    app's font and in a wider fallback one, with the longest selector chosen."""
    goto_page(page, "Heads")
    shown = '[data-testid="stForm"], [data-testid="stMetric"]'
    expect(page.locator('[data-testid="stMetric"]').nth(3)).to_be_visible(timeout=300_000)
    selector = page.locator('[data-testid="stSelectbox"]').filter(has_text="selector").first
    selector.locator("input").first.click()
    page.get_by_role("option", name="w/o info: top-k total correlation", exact=True).click()
    expect(selector.locator("input").first).to_have_value("w/o info: top-k total correlation")
    assert cut_texts(page, shown) == []
    page.add_style_tag(content=FALLBACK_FONT)
    expect(page.locator("label", has_text="selector").first).to_have_css(
        "font-family", re.compile("DejaVu Sans")
    )
    assert cut_texts(page, shown) == []


def _fill(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Tab")


def _queue_run(page, steps: int) -> None:
    _fill(page, "Steps", str(steps))
    _fill(page, "Train examples (0 = all)", "200")
    _fill(page, "Dev/test examples scored", "64")
    _fill(page, "Dev score every k steps", "5")
    _fill(page, "Batch size", "8")
    _fill(page, "Seeds", "0")  # one run (the page's default is 3 seeds)
    page.get_by_role("button", name="Queue").click()
    wait_idle(page)


def test_finetune_run_progress_pages_and_cancel(page):
    goto_page(page, "Fine-tune")
    assert_no_exception(page)
    _queue_run(page, steps=30)
    # Live progress: the running card shows "step k/30" and k moves.
    progress = page.get_by_text(re.compile(r"step \d+/30"))
    expect(progress.first).to_be_visible(timeout=180_000)
    first_text = progress.first.inner_text()
    # Switch pages mid-run and come back: the run goes on in the worker.
    goto_page(page, "Home")
    goto_page(page, "Fine-tune")
    finished = page.locator('[data-testid="stDataFrame"]', has_text="done")
    expect(finished.first).to_be_attached(timeout=300_000)
    assert first_text  # progress was shown before the run finished
    # The finished run appears in the results figures (refreshed by their fragment).
    expect(page.get_by_text("Score vs trainable parameters")).to_be_visible(timeout=60_000)
    # Its chart is drawn just after its heading: wait for it rather than count at once.
    expect(page.locator(CHART).nth(1)).to_be_visible(timeout=60_000)
    screenshot_for_docs(page, "finetune")
    # A second, long run: cancel it while it runs; it is recorded as cancelled.
    _queue_run(page, steps=5000)
    cancel = page.get_by_role("button", name="Cancel", exact=True)
    expect(cancel.first).to_be_visible(timeout=180_000)
    cancel.first.click()
    cancelled = page.locator('[data-testid="stDataFrame"]', has_text="cancelled")
    expect(cancelled.first).to_be_attached(timeout=120_000)
    assert_no_exception(page)


def test_subspace_page_renders(page):
    goto_page(page, "Subspace")
    assert_no_exception(page)
    screenshot_for_docs(page, "subspace")


def test_runs_and_paper_check_pages(page):
    """The walk's last two pages: the runs trained above are listed (method and score first),
    and the Paper check names its papers."""
    goto_page(page, "Runs")
    assert_no_exception(page)
    expect(page.locator('[data-testid="stDataFrame"]').first).to_be_visible(timeout=60_000)
    screenshot_for_docs(page, "runs")
    # The layer claims are computed on opening the page (S = 3 samples × R = 50 repeats): wait.
    page.locator('[data-testid="stSidebarNav"] a', has_text="Paper check").first.click()
    expect(page.get_by_text("Hidden State Variability").first).to_be_attached(timeout=400_000)
    wait_idle(page, timeout_s=400)
    assert_no_exception(page)
    screenshot_for_docs(page, "claims")
