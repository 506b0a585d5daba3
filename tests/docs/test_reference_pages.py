"""The generated reference pages agree with the code: the CLI page with the parser and with what
``--help`` prints, the settings page with the configs' fields, the environment page with every
variable the code reads."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tunescope.cli import main

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
REGENERATE = "run `.venv/bin/python docs/tools/reference_pages.py` and commit the pages"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "reference_pages", ROOT / "docs" / "tools" / "reference_pages.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["cli.md", "settings.md"])
def test_the_committed_page_is_what_the_code_generates(page):
    generated = _generator().PAGES_WRITTEN[page]()
    committed = (REFERENCE / page).read_text(encoding="utf-8")
    assert committed == generated, f"docs/reference/{page} is stale: {REGENERATE}"


def test_every_command_s_help_is_on_the_cli_page(monkeypatch, capsys):
    generator = _generator()
    page = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    names = [name for name, _ in generator.command_parsers()]  # sets the fixed width
    assert {"tunescope layers", "tunescope runs compare", "tunescope export"} <= set(names)
    for name in names:
        argv = [*name.split()[1:], "--help"]
        with pytest.raises(SystemExit) as stop:
            main(argv, prog="tunescope")
        assert stop.value.code == 0
        printed = capsys.readouterr().out.rstrip()
        assert f"$ {name} --help\n{printed}\n```" in page, f"{name}: {REGENERATE}"
        assert f"## `{name}`" in page


def test_a_stale_page_is_caught(tmp_path, monkeypatch):
    generator = _generator()
    monkeypatch.setattr(generator, "PAGES", tmp_path)
    monkeypatch.setattr(generator, "ROOT", tmp_path.parent)
    assert generator.main(["--check"]) == 1  # no pages at all
    assert generator.main([]) == 0 and (tmp_path / "cli.md").exists()
    assert generator.main(["--check"]) == 0
    (tmp_path / "cli.md").write_text("# Command line\n", encoding="utf-8")
    assert generator.main(["--check"]) == 1


def test_every_environment_variable_the_code_reads_is_documented():
    page = (REFERENCE / "environment.md").read_text(encoding="utf-8")
    name = re.compile(r"[\"'](TUNESCOPE_[A-Z_]+|RAY_[A-Z_]+)[\"']")  # as os.environ reads it
    read = set()
    for folder in ("analysis", "ui"):  # ui/dashboard/: the app and its pages
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(name.findall(path.read_text()))
    assert read, "found no variables: the scan is broken"
    documented = set(re.findall(r"^\| `([A-Z_]+)`", page, flags=re.M))
    assert read - documented == set(), "undocumented: add them to docs/reference/environment.md"
