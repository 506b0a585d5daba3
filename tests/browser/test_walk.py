"""A person's walk through the dashboard in a real browser (Debian's chromium via Playwright)."""

from __future__ import annotations

import pytest
from browser_utils import assert_no_exception, goto_page, screenshot_for_docs

pytestmark = pytest.mark.browser


def test_home_then_data_page(page):
    assert "tunescope" in page.locator("h1").first.inner_text()
    assert_no_exception(page)
    screenshot_for_docs(page, "home")
    goto_page(page, "Data")
    assert_no_exception(page)
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 2
    assert page.locator('[data-testid="stMetric"]').count() >= 3
    screenshot_for_docs(page, "data")
