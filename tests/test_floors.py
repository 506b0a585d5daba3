"""Imports run down the floors: the library's import graph, read from the source (every import,
lazy and TYPE_CHECKING ones too), has its lowest floor importing nothing above it and no circle
through the modules below."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The lowest floor: names every other floor needs (configs, errors, the workspace's layout, the
# atomic writer). It imports no module of the project.
LOWEST = ("analysis.io", "analysis.config", "analysis.workspace")
# No circle may pass through these (the models and their packaged built-ins, the disk cache, the
# runs database and the claims).
GUARDED = (
    "analysis.models",
    "analysis.packaged",
    "analysis.cache",
    "analysis.runs",
    "analysis.claims",
)


def import_graph() -> dict[str, set[str]]:
    """module → the project's modules it imports (a package's ``__init__`` is the package)."""
    modules = {}
    for path in (ROOT / "analysis").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path

    def target(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                found = target(name)
                # a module importing its own package (``from analysis.claims.papers import …``
                # inside ``analysis.claims``) runs that package's __init__ first: not an edge
                if found and found != module and not module.startswith(found + "."):
                    graph[module].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]


def test_the_lowest_floor_imports_nothing_of_the_project():
    graph = import_graph()
    for module in LOWEST:
        assert graph[module] == set(), f"{module} imports {sorted(graph[module])}"
    # The packaged built-ins sit just above it: the loader (analysis.models) imports them.
    assert graph["analysis.packaged"] <= set(LOWEST), sorted(graph["analysis.packaged"])


def test_no_circle_passes_through_the_models_cache_runs_or_claims():
    found = [
        sorted(c)
        for c in circles(import_graph())
        if any(m == g or m.startswith(g + ".") for m in c for g in GUARDED)
    ]
    assert found == []


def test_the_library_imports_neither_front_end():
    """`analysis` is the library under both front ends: it never imports the dashboard (`ui`) or
    the command line (`tunescope`), lazily or not."""
    upward = set()
    for path in (ROOT / "analysis").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("ui", "tunescope"):
                    upward.add(f"{path.relative_to(ROOT)} imports {name}")
    assert sorted(upward) == []
