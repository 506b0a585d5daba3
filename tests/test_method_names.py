"""A method's knowledge lives in its module: outside ``analysis/finetune/methods/`` and the
registry, no code of the library, the command line or the dashboard compares a method's name
(``method == "full"``, ``method in ("subspace", "subspace-random")``, a table keyed by method
names, ``match method: case "heads"``, ``runs["method"].str.startswith("subspace")``); it asks the
method's spec (`analysis.finetune.spec.MethodSpec`). Read from the source with `ast`."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from analysis.finetune.registry import method_names

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("analysis", "tunescope", "ui")
# The methods and the registry; and the runs database's migration, whose frozen copy of schema
# version 2's group formula must keep reading that version's names as they were.
ALLOWED = (
    "analysis/finetune/methods/",
    "analysis/finetune/registry.py",
    "analysis/runs/migration.py",
)
# Method names that are words of the project's vocabulary too (option kinds, config keys, page
# names): compared with anything else ("field.kind == 'layers'", "page == 'subspace'") they are
# not a method's name, so they count only where the other side is a method.
VOCABULARY = {"layers", "heads", "subspace"}
STRING_TESTS = ("startswith", "endswith", "isin")


def strings(node: ast.AST) -> set[str]:
    """The string constants of a constant, or of a tuple / list / set of them."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def about_a_method(node: ast.AST) -> bool:
    """Whether an expression reads a method: a name or attribute called ``…method…``, a
    ``["method"]`` / ``.get("method")`` lookup, or a spec's ``.name``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and "method" in sub.id.lower():
            return True
        if isinstance(sub, ast.Attribute) and (
            "method" in sub.attr.lower()
            or (sub.attr == "name" and "spec" in ast.unparse(sub.value).lower())
        ):
            return True
        if isinstance(sub, ast.Constant) and sub.value == "method":
            return True
    return False


def named(found: set[str], other: ast.AST, names: set[str]) -> set[str]:
    """The method names among ``found`` that compare as a method's name against ``other``."""
    hits = found & names
    return hits if about_a_method(other) else hits - VOCABULARY


def violations(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        hits: set[str] = set()
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for a, b in itertools.pairwise(operands):
                hits |= named(strings(b), a, names) | named(strings(a), b, names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STRING_TESTS
            and node.args
            and about_a_method(node.func.value)
        ):
            given = strings(node.args[0])
            hits = {n for n in names if any(n.startswith(g) for g in given if g)}
        elif isinstance(node, ast.Match) and about_a_method(node.subject):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue):
                        hits |= strings(sub.value) & names
        elif isinstance(node, ast.Dict):
            keys = [strings(k) if k is not None else set() for k in node.keys]
            if len(keys) >= 2 and all(len(k) == 1 and k <= names for k in keys):
                hits = set().union(*keys)
        if hits:
            out.append((node.lineno, ", ".join(sorted(hits))))
    return sorted(out)


def scan() -> list[str]:
    names = set(method_names())
    found = []
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += [f"{rel}:{line}: {hits}" for line, hits in violations(tree, names)]
    return found


def test_no_code_outside_the_methods_compares_a_method_name():
    found = scan()
    assert not found, "compares a method's name (ask its MethodSpec):\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_comparison():
    names = {"full", "layers", "subspace", "subspace-random", "heads"}
    code = """
method == "full"
run.method != "heads"
cfg.method in ("subspace", "subspace-random")
config.get("method") == "layers"
summary["method"] == "full"
runs["method"].str.startswith("subspace")
spec.name == "layers"
match cfg.method:
    case "heads":
        pass
COLOURS = {"full": 1, "layers": 2}
"""
    assert [line for line, _ in violations(ast.parse(code), names)] == [
        2, 3, 4, 5, 6, 7, 8, 9, 12,
    ]  # fmt: skip
    fine = """
field.kind == "layers"
page == "subspace"
k not in ("heads", "heads_settings")
{"layers": 1, "lora_r": 2}
FinetuneConfig(method="full")
"""
    assert violations(ast.parse(fine), names) == []
