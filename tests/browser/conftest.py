"""Real-browser tests: the app served on a free localhost port, driven by Playwright in Debian's
chromium (never a downloaded browser). A failing test leaves a screenshot in test-artifacts/."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # browser_utils, beside this file
from browser_utils import wait_idle

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]  # fmt: skip

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The dashboard on the embedded default model and data, with its own cache."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (./tasks.sh test installs it as root)")
    port = _free_port()
    cache = tmp_path_factory.mktemp("browser-cache")
    env = {
        **os.environ,
        "TUNESCOPE_CACHE": str(cache),
        "TUNESCOPE_N": os.environ.get("TUNESCOPE_BROWSER_N", "300"),
        "TUNESCOPE_WORKER_IDLE_S": "30",
        "TUNESCOPE_COMPUTE_PROCESSES": "1",  # the server's computations in its compute workers
        "TUNESCOPE_PREPARE_LESSONS": "0",  # no background preparation of the built-in lessons
        "TUNESCOPE_COMPUTE_LOG": str(cache / "compute.log"),  # what the server computed, when
        "TUNESCOPE_MODEL": os.environ.get("TUNESCOPE_BROWSER_MODEL", "minilm"),  # small, fast
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
    yield {"url": url, "cache": cache}
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def page(browser, server, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(server["url"])
    wait_idle(pg)
    yield pg
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
