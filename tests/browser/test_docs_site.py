"""The documentation site, opened in a real browser, asks for nothing beyond the machine it is
served from: pages, search, fonts and scripts all come from the site itself."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
    given = os.environ.get("TUNESCOPE_SITE_DIR")
    folder = Path(given) if given else tmp_path_factory.mktemp("site")
    if not given:
        spec = importlib.util.spec_from_file_location("site", ROOT / "tests/docs/test_site.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.build(folder)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_site_asks_for_nothing_outside(browser, site_url):
    context = browser.new_context()
    page = context.new_page()
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    for path in ("/", "/explanation/statistics/", "/reference/python-api/", "/reference/cli/"):
        page.goto(site_url + path)
        page.wait_for_load_state("networkidle")
    page.keyboard.press("/")  # Material's search shortcut
    page.fill("input.md-search__input", "bootstrap")
    page.wait_for_selector(".md-search-result__item", timeout=30_000)
    found = page.inner_text(".md-search-result")
    context.close()
    outside = [u for u in asked if not u.startswith((site_url, "data:", "blob:", "about:"))]
    assert not outside, f"requests beyond {site_url}: {sorted(set(outside))[:5]}"
    assert any(u.endswith("search_index.json") for u in asked)  # the bundled index, served here
    assert "Statistics" in found or "statistics" in found.lower()
