"""Helpers for the browser tests: waiting for Streamlit, navigating, asserting, screenshots."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


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


CUT = """selector => [...document.querySelectorAll(selector)].flatMap(box =>
  [...box.querySelectorAll('*')].filter(e => (e.tagName === 'INPUT'
    || getComputedStyle(e).textOverflow === 'ellipsis') && e.scrollWidth > e.clientWidth + 1
  ).map(e => (e.tagName === 'INPUT' ? e.value : e.textContent).trim()).filter(text => text))"""
# Debian's default sans-serif, wider than the app's own font: what a page shows where that font
# does not apply (icons keep theirs).
FALLBACK_FONT = """[data-testid="stMain"] :is(p, div, span, label, input):not(
  [data-testid="stIconMaterial"]) { font-family: "DejaVu Sans", sans-serif !important; }"""


def cut_texts(pg, selector: str = '[data-testid="stMain"]') -> list[str]:
    """Texts inside the elements of ``selector`` that the browser cuts with an ellipsis (their
    rendered width is more than their box's)."""
    return pg.evaluate(CUT, selector)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(cache: Path, **env: str):
    """The dashboard on a free localhost port with its own cache (and ``env`` set): yields
    {"url", "cache"}; stopped on exit."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (./tasks.sh test installs it as root)")
    port = _free_port()
    env = {
        **os.environ,
        "TUNESCOPE_CACHE": str(cache),
        "TUNESCOPE_N": os.environ.get("TUNESCOPE_BROWSER_N", "300"),
        "TUNESCOPE_WORKER_IDLE_S": "30",
        "TUNESCOPE_PROCESSES": "2",  # the server's computations in its two compute workers
        "TUNESCOPE_PREPARE_LESSONS": "0",  # no background preparation of the built-in lessons
        "TUNESCOPE_COMPUTE_LOG": str(cache / "compute.log"),  # what the server computed, when
        "TUNESCOPE_MODEL": os.environ.get("TUNESCOPE_BROWSER_MODEL", "minilm"),  # small, fast
        **env,
    }
    log = open(cache / "server.log", "w")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"the app did not start; log: {(cache / 'server.log').read_text()[-2000:]}")
    try:
        yield {"url": url, "cache": cache}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
