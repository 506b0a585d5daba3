"""The installed package works outside the checkout: the wheel, built offline and installed
(without its dependencies, which come from this environment) into a folder of its own, gives a
`tunescope` command whose `info` lists the built-ins and whose `app` serves the whole dashboard,
run from a temporary working folder with the checkout nowhere on the path.

The served app is driven the way a browser drives it, over its websocket (loopback only): the
home page and the Data page run to the end in the server, without an exception.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (
    "pyproject.toml",
    "README.md",
    "analysis",
    "tunescope",
    "ui",
)  # what the wheel is built from


def _pip(*args: str, cwd: Path) -> None:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # offline
    subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, check=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel installed into a folder of its own: that folder (its bin/tunescope too)."""
    work = tmp_path_factory.mktemp("package")
    source = work / "source"  # a copy: the build writes build/ and *.egg-info beside its sources
    source.mkdir()
    skip = shutil.ignore_patterns("__pycache__")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = work / "dist"
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), ".", cwd=source)
    (wheel,) = dist.glob("tunescope-*.whl")
    target = work / "target"
    _pip(
        "install", "-q", "--no-deps", "--no-compile", "--target", str(target), str(wheel), cwd=work
    )
    return target


@pytest.fixture
def outside(installed, tmp_path, tiny_bert_dir) -> tuple[Path, dict[str, str]]:
    """A working folder away from the checkout, and an environment in which only the installed
    package provides `analysis` and `ui`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESCOPE_")}
    env.update(
        PYTHONPATH=str(installed),
        TUNESCOPE_MODEL=str(tiny_bert_dir),
        TUNESCOPE_N="40",
        TUNESCOPE_PROCESSES="1",  # computations in the server's threads
        TUNESCOPE_PREPARE_LESSONS="0",
    )
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder, env


def test_the_wheel_ships_the_dashboard_and_imports_from_where_it_is_installed(installed, outside):
    folder, env = outside
    views = sorted(p.name for p in (ROOT / "ui" / "dashboard" / "views").glob("*.py"))
    assert sorted(p.name for p in (installed / "ui" / "dashboard" / "views").glob("*.py")) == views
    for shipped in ("ui/dashboard/app.py", "ui/dashboard/.streamlit/config.toml", "ui/icon.png"):
        assert (installed / shipped).is_file(), shipped
    assert list((installed / "analysis" / "lessons" / "builtin").glob("*.json"))
    where = subprocess.run(
        [sys.executable, "-c", "import analysis, tunescope, ui; print(analysis.__file__, tunescope.__file__, ui.__file__)"],
        cwd=folder, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert all(Path(p).is_relative_to(installed) for p in where), where


def test_tunescope_info_lists_the_built_ins_from_any_folder(installed, outside):
    folder, env = outside
    done = subprocess.run(
        [str(installed / "bin" / "tunescope"), "info"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("minilm", "mpnet", "movie-snippets", "trec6", "glue/sst2"):
        assert f"  {name} " in done.stdout, name
    # Installed, the default cache is cache/ in the working folder (nothing created by `info`).
    assert f"Cache: {folder / 'cache'} — 0 entries" in done.stdout
    assert not (folder / "cache").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the dashboard did not start; its log:\n{log.read_text()[-3000:]}")


def _run_page(ws, page_script_hash: str = "") -> dict:
    """Ask the server to run a page, as the browser does; what it sent until the run ended."""
    from streamlit.proto.Alert_pb2 import Alert
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    back = BackMsg()
    back.rerun_script.page_script_hash = page_script_hash
    back.rerun_script.query_string = ""
    ws.send(back.SerializeToString())
    seen: dict = {"elements": [], "problems": []}
    while True:
        msg = ForwardMsg()
        msg.ParseFromString(ws.recv(timeout=300))
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            seen["config"] = msg.new_session.config
        elif kind == "navigation":
            seen["pages"] = {p.page_name: p.page_script_hash for p in msg.navigation.app_pages}
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            element = msg.delta.new_element
            seen["elements"].append(element.WhichOneof("type"))
            if element.WhichOneof("type") == "exception":
                seen["problems"].append(f"{element.exception.type}: {element.exception.message}")
            elif element.WhichOneof("type") == "alert" and element.alert.format == Alert.ERROR:
                seen["problems"].append(element.alert.body)
        elif kind == "script_finished":
            assert msg.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY, msg.script_finished
            return seen


def test_tunescope_app_serves_the_whole_dashboard_from_any_folder(installed, outside):
    folder, env = outside
    command = [str(installed / "bin" / "tunescope"), "app"]
    # The packaged settings, read from beside the installed script, not from this folder.
    _check_served(command, folder, env, folder.parent / "server.log")


def test_streamlit_run_app_py_in_the_checkout_serves_the_same_dashboard(tmp_path, tiny_bert_dir):
    """The first thing a Streamlit user types, in the checkout: the top-level app.py runs the
    packaged app, and the settings beside it (the link to the app's own) keep it on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESCOPE_")}
    env.update(
        TUNESCOPE_CACHE=str(tmp_path / "cache"),
        TUNESCOPE_MODEL=str(tiny_bert_dir),
        TUNESCOPE_N="40",
        TUNESCOPE_PROCESSES="1",
        TUNESCOPE_PREPARE_LESSONS="0",
    )
    command = [sys.executable, "-m", "streamlit", "run", "app.py"]
    _check_served(command, ROOT, env, tmp_path / "server.log")


def _check_served(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
    """Start the dashboard with ``command`` (plus a free port and nothing else: the address and
    the usage statistics come from its settings), run Home and Data as a browser would, and
    check that it served only loopback, without an exception."""
    connect = pytest.importorskip("websockets.sync.client").connect
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*command, "--server.port", str(port)],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_healthy(url, proc, log)
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200 and b"<noscript>" in answer.read()
        stream = f"ws://127.0.0.1:{port}/_stcore/stream"
        with connect(stream, subprotocols=["streamlit"], max_size=None) as ws:
            home = _run_page(ws)
            assert home["config"].gather_usage_stats is False
            assert {"Home", "Data", "Layers", "Recommend", "Lessons"} <= set(home["pages"])
            assert "page_link" in home["elements"] and home["problems"] == []
            data = _run_page(ws, home["pages"]["Data"])
            assert "dataframe" in data["elements"] or "arrow_data_frame" in data["elements"]
            assert data["problems"] == []
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    text = log.read_text()
    assert f"URL: http://localhost:{port}" in text and "Network URL" not in text  # loopback only
    assert "Traceback" not in text, text[-3000:]
