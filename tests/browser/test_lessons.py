"""Lessons in a real browser: a teacher builds a three-step lesson from the pages, prepares it,
presents it; a second browser follows and sees the same steps, each served from the cache (no
computation in the server's compute log) — and links restore each page's whole view in a fresh
browser context."""

from __future__ import annotations

import json
import re
import time

import pytest
from browser_utils import assert_no_exception, screenshot_for_docs, wait_idle
from playwright.sync_api import expect
from waiting import wait_for

pytestmark = pytest.mark.browser
# This machine's browsers share two cores with the server: a page's parts can take seconds.
expect.set_options(timeout=60_000)
CHART = '[data-testid="stPlotlyChart"]'
SIDEBAR = '[data-testid="stSidebar"]'
SHOWN = f"{CHART}:visible"  # a figure of the open tab (the others' are hidden)


def fresh(browser, url: str):
    """A new browser context (nothing shared but the link) on ``url``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    wait_idle(page, timeout_s=300)
    return context, page


def log_lines(server) -> list[list[str]]:
    path = server["cache"] / "compute.log"
    text = path.read_text() if path.exists() else ""
    return [line.split("\t") for line in text.splitlines() if line.count("\t") >= 4]


def add_view(page, server, lesson: str | None, title: str, note: str, steps: int) -> None:
    """Press the sidebar's "Add this view to a lesson", fill it in, add."""
    page.locator(SIDEBAR).get_by_text("Add this view to a lesson").click()
    pop = page.locator('[data-testid="stPopoverBody"]')
    expect(pop).to_be_visible()
    if lesson is None:
        pop.get_by_label("New lesson's title").fill("Browser lesson")
    else:
        pop.locator('[data-testid="stSelectbox"]').locator("input").first.click()
        page.get_by_role("option", name=lesson, exact=True).click()
    pop.get_by_label(re.compile("Step title")).fill(title)
    pop.get_by_label(re.compile("Teacher's note")).fill(note)
    pop.get_by_label(re.compile("Teacher's note")).press("Tab")
    pop.get_by_role("button", name="Add this view").click()
    wait_idle(page)
    saved = server["cache"] / "lessons" / "browser-lesson.json"
    wait_for(lambda: saved.exists() and len(json.loads(saved.read_text())["steps"]) == steps, 60,
             f"step {steps} in the lesson file")  # fmt: skip


def expect_tab_open(page, name: str) -> None:
    expect(page.get_by_role("tab", name=name)).to_have_attribute("aria-selected", "true")


def test_a_teacher_prepares_and_presents_a_lesson_and_a_second_browser_follows(browser, server):
    url = server["url"]
    teacher_context, teacher = fresh(browser, f"{url}/data")
    try:
        expect(teacher.locator(SHOWN).first).to_be_visible(timeout=120_000)
        add_view(teacher, server, None, "The data", "Two classes: $C = 2$.", 1)
        teacher.goto(f"{url}/layers?layers_tab=Layer+picture&layer=2&layers_repeats=1")
        wait_idle(teacher, timeout_s=300)
        expect(teacher.locator(SHOWN).first).to_be_visible(timeout=300_000)
        add_view(teacher, server, "browser-lesson", "Layer 2", "The classes at layer 2.", 2)
        teacher.goto(f"{url}/heads?heads_k=2&heads_tab=Information+richness")
        wait_idle(teacher, timeout_s=300)
        expect(teacher.locator(SHOWN).first).to_be_visible(timeout=300_000)
        add_view(teacher, server, "browser-lesson", "Two heads", "PageRank picks $k = 2$.", 3)

        teacher.goto(f"{url}/lessons?edit=browser-lesson")
        wait_idle(teacher, timeout_s=120)
        assert_no_exception(teacher)
        teacher.get_by_role("button", name="Prepare", exact=True).click()
        expect(teacher.get_by_text(re.compile("Prepared in"))).to_be_visible(timeout=600_000)
        wait_idle(teacher, timeout_s=120)
        status = teacher.locator('[data-testid="stDataFrame"]').last
        expect(status).to_be_visible()
        expect(status).not_to_contain_text("not prepared")
        expect(status).not_to_contain_text("changed")
        prepared_at = len(log_lines(server))

        teacher.get_by_text("▶ Present from step 1").click()
        wait_idle(teacher)
        expect(teacher.get_by_text("step 1 of 3")).to_be_visible()
        teacher.wait_for_url(re.compile(r"[?&]mode=present(&|$)"))
        student_context, student = fresh(
            browser, f"{url}/data?lesson=browser-lesson&step=1&mode=follow"
        )
        try:
            expect(student.get_by_text("following the presenter")).to_be_visible()
            expect(student.get_by_text("Two classes:")).to_be_visible()  # the note, beside
            seconds = {}
            for number in (2, 3):
                clicked = time.perf_counter()
                teacher.get_by_text("Next ▶").click()
                expect(teacher.get_by_text(f"step {number} of 3")).to_be_visible(timeout=60_000)
                expect(teacher.locator(SHOWN).first).to_be_visible(timeout=120_000)
                seconds[number] = time.perf_counter() - clicked
                wait_idle(teacher)
                student.wait_for_url(re.compile(f"[?&]step={number}(&|$)"), timeout=60_000)
                wait_idle(student)
                expect(student.get_by_text(f"step {number} of 3")).to_be_visible()
                assert_no_exception(student)
                for page in (teacher, student):  # the same view in both browsers
                    if number == 2:
                        expect_tab_open(page, "Layer picture")
                        expect(page.get_by_role("slider").first).to_have_value("2")
                    else:
                        expect_tab_open(page, "Information richness")
                        expect(page.get_by_label("k heads per layer")).to_have_value("2")
                if number == 3:
                    screenshot_for_docs(teacher, "lessons")
            print(f"presenter's click to the step's figure (browser's time): {seconds}")
        finally:
            student_context.close()
    finally:
        teacher_context.close()
    during = log_lines(server)[prepared_at:]
    assert not [line for line in during if line[0] == "computed"], during
    # Each step's page, the server's part: its script run, in CPU seconds of its own thread (the
    # wall time, printed, is that on a machine shared with nothing — not this one).
    drawn = [(line[3], float(line[1])) for line in during if line[0] == "drawn"]
    cpu = [float(re.search(r"\(cpu ([0-9.]+) s\)", label).group(1)) for label, _ in drawn]
    print(f"each page's script run, wall and CPU: {drawn}")
    assert len(drawn) >= 6 and max(cpu) < 2.0, drawn


@pytest.mark.parametrize("path", ["layers", "heads"])
def test_a_link_restores_the_pages_whole_view_in_a_fresh_browser(browser, server, path):
    """Set the view by hand, copy the address, open it elsewhere: the same tab and controls."""
    context, page = fresh(browser, f"{server['url']}/{path}?layers_repeats=1")
    try:
        expect(page.locator(SHOWN).first).to_be_visible(timeout=300_000)
        if path == "layers":
            page.get_by_role("tab", name="Layer picture").click()
            wait_idle(page)
            slider = page.get_by_role("slider").first
            slider.focus()
            page.keyboard.press("Home")
            wait_idle(page)
            page.get_by_text("mark the probe's mistakes").click()
            wait_idle(page)
        else:
            box = page.get_by_label("k heads per layer")
            box.fill("2")
            page.get_by_role("button", name="Apply").click()
            page.wait_for_url(re.compile(r"[?&]heads_k=2(&|$)"))  # the browser writes the link
            wait_idle(page, timeout_s=300)
            page.get_by_role("tab", name="Correlation").click()
            wait_idle(page)
        copied = page.evaluate("location.href")
    finally:
        context.close()
    context, page = fresh(browser, copied)
    try:
        assert_no_exception(page)
        if path == "layers":
            expect_tab_open(page, "Layer picture")
            expect(page.get_by_role("slider").first).to_have_value("0")
            expect(page.get_by_role("switch", name="mark the probe's mistakes")).to_be_checked()
        else:
            expect(page.get_by_label("k heads per layer")).to_have_value("2")
            expect_tab_open(page, "Correlation")
    finally:
        context.close()
