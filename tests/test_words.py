"""Words a user reads mean one thing: "head" is an attention head, except Ray's head node.

- The classifier's layer is ℓ_cls (paper 000 writes ℓ_head): no "ℓ_head" in the library, the
  command line, the dashboard or the docs, but for the one line of the strategies page that names
  the paper's notation.
- In the Ray modules, every "head" in a string literal or comment is the head node ("head node",
  ``head_node``); Ray's own ``--head`` flag is the one exception.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("analysis", "tunescope", "ui", "docs")
# path → the ℓ_head it may hold. strategies.md: where the docs say the paper writes it so.
ALLOWED = {"docs/explanation/strategies.md": 1}
RAY_MODULES = ("ray_cluster.py", "ray_executor.py", "ray_task.py")
BARE_HEAD = re.compile(r"\bhead\b(?![ _-]node)", re.IGNORECASE)


def test_the_classifiers_layer_is_never_l_head():
    found = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".toml", ".json", ".yml") and path.is_file():
                count = path.read_text(encoding="utf-8").count("ℓ_head")
                name = path.relative_to(ROOT).as_posix()
                if count != ALLOWED.get(name, 0):
                    found[name] = count
    assert found == {}  # path → how many ℓ_head it holds (ℓ_cls, or "the classifier's layer")


def ray_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal (docstrings and f-strings' parts too) and comment."""
    source = path.read_text(encoding="utf-8")
    texts = [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    texts += [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    return texts


def bare_heads(text: str) -> list[str]:
    return BARE_HEAD.findall(text.replace("--head", ""))


def test_the_check_finds_a_bare_head_and_passes_the_head_node():
    assert bare_heads("lost the Ray cluster head at ADDR") == ["head"]
    assert bare_heads("is the HEAD healthy? the head-node loss") == ["HEAD"]
    assert not bare_heads("the head node's GCS, `ray start --head`, HEAD_NODE:6379, head_node_up")


def test_ray_modules_call_their_head_the_head_node():
    found = [
        f"{name}:{line}: {text.strip()[:80]}"
        for name in RAY_MODULES
        for line, text in ray_texts(ROOT / "analysis" / "runs" / name)
        if bare_heads(text)
    ]
    assert found == []
