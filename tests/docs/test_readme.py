"""The README is the front door: short, the tutorials on its first screen, every link alive, and
its quickstart runs as written on the built-in data and prints what the README shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def console_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of every ``$ `` line of the ```console blocks."""
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
    return steps


def normalise(line: str) -> str:
    line = re.sub(r"(?:\S*/)?(my-recipe/)", r"\1", line)  # where the reader's checkout is
    return re.sub(r"metrics (?:computed in [\d.]+ s|served from the cache)", "metrics <done>", line)


def same_line(printed: str, shown: str) -> bool:
    """Equal text; equal whole numbers; decimals within rounding of a BLAS or platform."""
    printed, shown = normalise(printed), normalise(shown)
    if NUMBER.sub("#", printed) != NUMBER.sub("#", shown):
        return False
    for a, b in zip(NUMBER.findall(printed), NUMBER.findall(shown), strict=True):
        if "." not in a and "." not in b:
            if a != b:
                return False
        elif abs(float(a.replace(",", "")) - float(b.replace(",", ""))) > 0.02 + 0.02 * abs(
            float(b.replace(",", ""))
        ):
            return False
    return True


def test_the_readme_is_the_front_door():
    assert len(README.splitlines()) <= 300
    first_screen = "\n".join(README.splitlines()[:40])
    for tutorial in ("first-session", "own-data-and-model", "your-trainer"):
        assert f"(docs/tutorials/{tutorial}.md)" in first_screen, tutorial
    for heading in ("Two commands", "Quickstart", "What each page answers", "How to cite",
                    "License"):  # fmt: skip
        assert f"\n## {heading}\n" in README
    assert "./tasks.sh app" in README and "./tasks.sh test" in README


def test_every_link_of_the_readme_resolves():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    targets += re.findall(r'<img src="([^"]+)"', README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert len(local) > 20
    for target in local:
        assert (ROOT / target).exists(), target


def test_the_comparison_can_fail():
    shown = "    4       1.375   0.527    52.32 0.710 ± 0.021"
    assert same_line("    4       1.376   0.527    52.32 0.712 ± 0.021", shown)
    assert not same_line("    4       1.375   0.527    52.32 0.810 ± 0.021", shown)
    assert not same_line("    5       1.375   0.527    52.32 0.710 ± 0.021", shown)
    assert not same_line("ℓ* = 5 (lowest ν over layers 1..6)", "ℓ* = 6 (lowest ν over layers 1..6)")
    assert same_line(
        "  wrote /tmp/x/my-recipe/README.md", "  wrote /home/you/t/my-recipe/README.md"
    )


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path):
    steps = console_blocks(section(README, "Quickstart"))
    commands = [(c, out) for c, out in steps if c.startswith("tunescope ")]
    assert len(commands) >= 2
    env = {
        **os.environ,
        "TUNESCOPE_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    for command, shown in commands:
        argv = [sys.executable, "-m", "tunescope", *command.split()[1:]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        assert done.returncode == 0, (command, done.stderr[-2000:])
        printed = done.stdout.rstrip("\n").splitlines()
        assert len(printed) == len(shown), (command, printed)
        for got, want in zip(printed, shown, strict=True):
            assert same_line(got, want), (command, got, want)

    # The JSON of the same table: every key it writes is on the JSON reference page.
    out = tmp_path / "layers.json"
    done = subprocess.run(
        [sys.executable, "-m", "tunescope", "layers", "--n", "500", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    page = section((ROOT / "docs/reference/json.md").read_text(encoding="utf-8"), "`layers`")
    for key in [*result, *result["layers"][0], *result["sample"], *result["strategies"]]:
        assert f"`{key}`" in page or f'"{key}"' in page, key
