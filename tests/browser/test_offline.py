"""The dashboard makes no outside request: every page load stays on the server's own address."""

from __future__ import annotations

import pytest
from browser_utils import goto_page

pytestmark = pytest.mark.browser


def test_pages_make_no_request_beyond_the_server(browser, server):
    context = browser.new_context()
    page = context.new_page()
    outside: list[str] = []

    def note(request) -> None:
        url = request.url
        if not url.startswith((server["url"], "data:", "blob:", "about:")):
            outside.append(url)

    page.on("request", note)
    page.goto(server["url"])
    for title in ("Data", "Runs", "Home"):
        goto_page(page, title)
    page.wait_for_timeout(1500)  # the favicon and fonts are asked for after the first render
    context.close()
    assert not outside, f"requests beyond {server['url']}: {sorted(set(outside))[:5]}"
