"""Exploration a user can trust and share, in a real browser: a copied link reproduces the view,
a pinned Subspaces run stays while another run finishes, ℓ* never crosses data sets, an upload
is known by its file name. Small N; the shared server's cache is reused. (Named to run after
test_walk.py: its runs would otherwise already be "done" in the walk's fine-tuning tables.)"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

import pytest
from browser_utils import assert_no_exception, goto_page, wait_idle
from playwright.sync_api import expect
from waiting import wait_for

from analysis.config import ModelSpec
from analysis.finetune.config import FinetuneConfig
from analysis.runs.db import RunsDB
from analysis.runs.worker import ensure_workers
from analysis.workspace import Workspace

pytestmark = pytest.mark.browser
CHART = '[data-testid="stPlotlyChart"]'
SIDEBAR = '[data-testid="stSidebar"]'


def sidebar_select(page, label: str):
    return page.locator(f'{SIDEBAR} [data-testid="stSelectbox"]').filter(has_text=label).first


def dataset_box(page):
    """The sidebar's Dataset picker's input (a picker is a combo box: what it shows is the
    input's value)."""
    return sidebar_select(page, "Dataset").locator("input").first


def choose(page, label: str, option: str) -> None:
    """Pick ``option`` in the sidebar picker ``label``."""
    sidebar_select(page, label).locator("input").first.click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_idle(page)


def query(page) -> dict[str, list[str]]:
    return parse_qs(urlparse(page.evaluate("location.href")).query)


def test_a_copied_link_reproduces_the_view_in_a_new_browser(browser, server):
    def fresh(url: str):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(url)
        wait_idle(page, timeout_s=180)
        return context, page

    context, page = fresh(f"{server['url']}/layers?data=trec6&n=500")  # ≥ 5 per class
    try:
        expect(page.locator(CHART).first).to_be_visible(timeout=180_000)
        assert_no_exception(page)
        expect(dataset_box(page)).to_have_value(re.compile("trec6"))
        expect(page.get_by_role("spinbutton", name="N examples")).to_have_value("500")
        page.wait_for_url(re.compile(r"[?&]data=trec6(&|$)"))  # in the link
        copied = page.evaluate("location.href")
    finally:
        context.close()
    context, page = fresh(copied)  # another browser context: nothing shared but the link
    try:
        assert "/layers" in page.evaluate("location.href")
        expect(page.locator(CHART).first).to_be_visible(timeout=60_000)
        expect(dataset_box(page)).to_have_value(re.compile("trec6"))
        expect(page.get_by_role("spinbutton", name="N examples")).to_have_value("500")
    finally:
        context.close()


def test_l_star_of_one_data_set_is_never_offered_for_another(page):
    goto_page(page, "Layers")
    expect(page.locator(CHART).first).to_be_visible(timeout=180_000)
    goto_page(page, "Fine-tune")
    expect(page.get_by_text("from the Layers analysis (lowest ν)").first).to_be_visible()
    choose(page, "Dataset", "trec6")
    assert_no_exception(page)
    expect(page.get_by_text("No ℓ* found yet for this model, data and sample")).to_be_visible()
    expect(page.get_by_text("from the Layers analysis (lowest ν)")).to_have_count(0)


def _trajectory_run(seed: int) -> FinetuneConfig:
    return FinetuneConfig(
        model=ModelSpec("minilm"), method="full", steps=2, seed=seed, batch_size=4, n_train=16,
        n_eval=8, eval_every=2, max_length=32, trajectory_every=1, trajectory_dtype="float16",
    )  # fmt: skip


def test_a_pinned_subspace_run_stays_while_another_run_finishes(page, server):
    db = RunsDB(Workspace(server["cache"]))
    first = db.enqueue(_trajectory_run(seed=0))
    ensure_workers(server["cache"], idle_timeout=30)
    wait_for(lambda: db.get_run(first)["status"] in ("done", "failed"), 240, "the first run")
    assert db.get_run(first)["status"] == "done", db.get_run(first)["error"]
    goto_page(page, "Subspaces")
    picker = page.get_by_role("combobox", name="Trajectory run")
    expect(picker).to_have_value(re.compile(first), timeout=120_000)
    page.wait_for_url(re.compile(rf"[?&]run={re.escape(first)}(&|$)"))  # in the link

    second = db.enqueue(_trajectory_run(seed=1))
    ensure_workers(server["cache"], idle_timeout=30)
    wait_for(lambda: db.get_run(second)["status"] in ("done", "failed"), 240, "the second run")
    assert db.get_run(second)["status"] == "done", db.get_run(second)["error"]
    page.get_by_text("Centre the snapshots instead of subtracting θ₀").click()  # a rerun
    wait_idle(page, timeout_s=120)
    assert_no_exception(page)
    expect(picker).to_have_value(re.compile(first))
    goto_page(page, "Runs")
    goto_page(page, "Subspaces")
    expect(picker).to_have_value(re.compile(first))  # the newer run joined, it did not take over


def test_an_upload_is_known_by_its_file_name(page, tmp_path):
    words = ["good", "bad", "film", "plot", "great", "dull", "actor", "music"]
    lines = ["text,label"] + [
        f"{words[i % 8]} {words[(3 * i) % 8]} {words[(5 * i + 1) % 8]},{'pos' if i % 2 else 'neg'}"
        for i in range(400)
    ]
    upload = tmp_path / "my reviews.csv"
    upload.write_text("\n".join(lines) + "\n")
    goto_page(page, "Data")
    box = dataset_box(page)  # the entry's words typed (not picked) choose the entry too
    box.click()
    box.fill("upload a file")
    box.press("Enter")
    wait_idle(page)
    expect(page.get_by_text("Upload a CSV, TSV, JSON lines or Parquet file").first).to_be_visible()
    expect(box).to_have_value("upload a file…")
    expect(page.get_by_text("Unknown data set")).to_have_count(0)
    page.locator(f'{SIDEBAR} input[type="file"]').set_input_files(str(upload))
    wait_idle(page, timeout_s=120)
    assert_no_exception(page)
    expect(page.locator("h3", has_text="my reviews.csv").first).to_be_visible(timeout=60_000)
    expect(dataset_box(page)).to_have_value(re.compile(re.escape("my reviews.csv (uploaded)")))
    page.wait_for_url(re.compile(r"[?&]data=upload"))
    data = query(page)["data"][0]
    assert data.startswith("upload:") and data.endswith("/my reviews.csv")
    goto_page(page, "Runs")
    goto_page(page, "Data")
    expect(page.locator("h3", has_text="my reviews.csv").first).to_be_visible()
