"""Counts read as a person writes them: "1 run", "3 runs" — and no message of the code writes a
count's noun as "run(s)"."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from analysis.words import counted

ROOT = Path(__file__).resolve().parents[1]
BRACKETED = re.compile(r"[A-Za-z]\(s\)")  # run(s), step(s), CPU(s)


def test_counted_is_singular_for_one_only():
    assert counted(1, "run") == "1 run"
    assert counted(0, "run") == "0 runs"
    assert counted(3, ["run", "to", "queue"][0]) == "3 runs"
    assert counted(1_200, "example") == "1,200 examples"
    assert counted(2, "strategy", "strategies") == "2 strategies"
    assert counted(1.0, "CPU") == "1 CPU" and counted(0.5, "GPU") == "0.5 GPUs"


def test_no_message_writes_a_plural_in_brackets():
    found = []
    for folder in ("analysis", "tunescope", "ui", "docs/tools"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree) if _documented(node)}
            for node in ast.walk(tree):
                text = node.value if isinstance(node, ast.Constant) else None
                if isinstance(text, str) and BRACKETED.search(text) and id(node) not in docstrings:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    assert not found, "\n".join(found)


def _documented(node: ast.AST) -> bool:
    """Whether ``node`` opens with a docstring (which may write diag(s) or median(s))."""
    body = getattr(node, "body", None)
    return (
        isinstance(body, list)
        and bool(body)
        and isinstance(body[0], ast.Expr)
        and (isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str))
    )
