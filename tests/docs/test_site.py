"""The documentation site builds with --strict and loads nothing from outside the machine: no
script, stylesheet, font, image or frame from another host, no web fonts, search bundled.

``./tasks.sh test`` builds the site before pytest and passes its folder as $TUNESCOPE_SITE_DIR;
without it (a test run on its own) the site is built here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = r"""(?:https?:)?//(?!127\.0\.0\.1|localhost)"""
# Tags whose URL the browser fetches by itself on page load.
LOADED = re.compile(
    r"<(?:script|img|iframe|source|audio|video|embed)\b[^>]*\bsrc=[\"']" + OUTSIDE
    + r"|<link\b[^>]*\bhref=[\"']" + OUTSIDE,
    re.I,
)  # fmt: skip
CSS_URL = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"']?)" + OUTSIDE, re.I)


def build(site: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    given = os.environ.get("TUNESCOPE_SITE_DIR")
    if given:
        return Path(given)
    folder = tmp_path_factory.mktemp("site")
    build(folder)
    return folder


def test_the_config_asks_for_nothing_outside():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["font"] is False  # no Google Fonts
    assert "repo_url" not in config  # Material would ask the GitHub API for the repository's stars
    assert "extra_javascript" not in config and "extra_css" not in config
    assert not any(
        "arithmatex" in str(ext) or "mermaid" in str(ext) for ext in config["markdown_extensions"]
    )  # formulas are plain Unicode: no MathJax, no mermaid from a CDN


def test_every_page_is_built_and_linked(site):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    nav = list(pages(config["nav"]))
    assert len(nav) >= 30
    for page in nav:
        built = site / (page[: -len(".md")] + "/index.html")
        if page.endswith("index.md"):
            built = site / page.replace(".md", ".html")
        assert built.exists(), page
    for name in ("layer-metrics", "heads", "subspaces", "statistics", "strategies", "claims",
                 "bad-input"):  # fmt: skip
        assert f"explanation/{name}.md" in nav  # the pages code cites


def test_the_built_site_loads_nothing_from_outside(site):
    html = list(site.rglob("*.html"))
    css = list(site.rglob("*.css"))
    assert html and css
    for path in html:
        text = path.read_text(encoding="utf-8")
        assert not LOADED.search(text), (path, LOADED.search(text).group(0))
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, path
        assert 'class="mermaid"' not in text, path  # Material would fetch mermaid from a CDN
    for path in css:
        text = path.read_text(encoding="utf-8")
        assert not CSS_URL.search(text), (path, CSS_URL.search(text).group(0))
        assert "@font-face" not in text or "//" not in re.sub(r"data:[^)]*", "", text), path


def test_search_is_bundled(site):
    assert (site / "search" / "search_index.json").exists()
    assert list((site / "assets" / "javascripts" / "workers").glob("search.*.js"))
    index = (site / "search" / "search_index.json").read_text(encoding="utf-8")
    assert "task-specialty" in index.lower()


def test_a_checker_that_can_fail():
    assert LOADED.search('<script src="https://cdn.example.org/x.js"></script>')
    assert LOADED.search("<link rel=stylesheet href='//fonts.googleapis.com/css'>")
    assert not LOADED.search('<script src="../assets/javascripts/bundle.js"></script>')
    assert not LOADED.search('<a href="https://example.org">a link, not a load</a>')
    assert CSS_URL.search("src: url(https://fonts.gstatic.com/x.woff2)")
    assert not CSS_URL.search(
        "mask: url(\"data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org'\")"
    )
