"""Helpers for the browser tests: waiting for Streamlit, navigating, asserting, screenshots."""

from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wait_idle(pg, timeout_s: float = 120) -> None:
    """Wait until the app is rendered and no script run is in progress."""
    pg.wait_for_selector('[data-testid="stApp"]')
    deadline = time.time() + timeout_s
    quiet = 0
    while time.time() < deadline:
        running = pg.locator('[data-testid="stStatusWidget"]').count() > 0
        quiet = 0 if running else quiet + 1
        if quiet >= 3:
            return
        time.sleep(0.4)
    raise AssertionError("the app kept running past the timeout")


def goto_page(pg, title: str) -> None:
    pg.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    wait_idle(pg)


def assert_no_exception(pg) -> None:
    boxes = pg.locator('[data-testid="stException"]')
    assert boxes.count() == 0, boxes.first.inner_text()


def screenshot_for_docs(pg, name: str) -> None:
    """With TUNESCOPE_SCREENSHOTS=1, keep a screenshot of this page for the README."""
    if os.environ.get("TUNESCOPE_SCREENSHOTS") == "1":
        folder = ROOT / "docs" / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(folder / f"{name}.png"), full_page=False)
