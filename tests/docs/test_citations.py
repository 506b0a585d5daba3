"""The code cites its science by page and heading, and every citation leads somewhere.

A tracked source or doc file may cite a page of the project's own docs as ``docs/<page>.md`` or
``docs/<page>.md, "Heading"`` (docs/how-to/develop.md, "The documentation site"): the page
must exist and the heading must be one of its Markdown headings. No file cites the
specification the project was built from, which is not part of the repository.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = (".py", ".md", ".sh", ".toml", ".yml")

# The specification outside the repository, in the forms it was cited by: its file name, a
# section sign, a possessive, a quoted section or "see". ``SPEC`` alone is a Python name (every
# method module declares one) and is not a citation.
OUTSIDE_SPEC = re.compile(
    r"(?i:SPEC\.md)|\bSPEC\s*§|\bSPEC's|(?<!\w)\(SPEC[\s)]|\bsee SPEC\b|\bSPEC\s+[\"'“]"
)
DOCS_PATH = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)(?![\w/-])")
FIRST_HEADING = re.compile(r",\s*([\"'])(.{1,150}?)\1", re.S)
MORE_HEADINGS = re.compile(r"\s*(?:,|and|or)\s*([\"'])(.{1,150}?)\1", re.S)
HEADING_LINE = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def plain(text: str) -> str:
    """A heading as a reader types it: escapes, backticks, comment marks and line breaks gone."""
    text = re.sub(r"\n\s*#?\s*", " ", text)
    text = re.sub(r"\\(.)", r"\1", text).replace("`", "")
    return re.sub(r"\s+", " ", text).strip()


@cache
def headings(page: str) -> frozenset[str]:
    """The Markdown headings of ``page`` (a path from the repository root), code blocks skipped."""
    found, fenced = set(), False
    for line in (ROOT / page).read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := HEADING_LINE.match(line)):
            found.add(plain(re.sub(r"\s*\{[^}]*\}$", "", match.group(1))))
    return frozenset(found)


def cited_headings(text: str, end: int) -> list[str]:
    """The quoted headings right after a page path that ends at ``end``: ``, "A"`` or
    ``, "A" and "B"``."""
    match = FIRST_HEADING.match(text, end)
    cited = []
    while match:
        cited.append(plain(match.group(2)))
        match = MORE_HEADINGS.match(text, match.end())
    return cited


def problems(text: str, name: str) -> list[str]:
    """What is wrong with the citations in ``text`` (the file ``name``), one line each."""

    def where(at: int) -> str:
        line = text.count("\n", 0, at) + 1
        return f"{name}:{line}"

    found = []
    for match in OUTSIDE_SPEC.finditer(text):
        cited = match.group(0).strip()
        found.append(
            f"{where(match.start())}: cites the specification ({cited!r}); cite "
            'docs/explanation/<page>.md, "<heading>" instead'
        )
    for match in DOCS_PATH.finditer(text):
        page = match.group(1)
        if not (ROOT / page).is_file():
            found.append(f"{where(match.start())}: {page} does not exist")
        else:
            for heading in cited_headings(text, match.end()):
                if heading not in headings(page):
                    found.append(f"{where(match.start())}: {page} has no heading {heading!r}")
    return found


THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()


def tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [
        name
        for name in listed.split("\0")
        if name.endswith(SUFFIXES) and (ROOT / name).is_file() and name != THIS_FILE
    ]


def test_every_citation_names_a_page_and_heading_that_exist():
    names = tracked_files()
    assert any(name.startswith("analysis/") for name in names), "git ls-files found no sources"
    found = []
    for name in names:
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        found += problems(text, name)
    assert found == [], "\n".join(found)


def test_the_check_finds_each_kind_of_bad_citation():
    good = (
        '"""Comparing (docs/explanation/statistics.md, "Comparing two\n'
        '    settings"); ℓ* (docs/explanation/layer-metrics.md, "The best layer ℓ*"); heads\n'
        '(docs/explanation/heads.md, "PageRank" and "Selecting heads").\n'
        "SPEC = MethodSpec(...); register(SPEC); module.SPEC\n"
    )
    assert problems(good, "good.py") == []
    bad = (
        'x = 1  # the probe (SPEC.md, "Probe score")\n'
        '"""See docs/explanation/no-such-page.md."""\n'
        '# docs/explanation/heads.md, "PageRank" and "No such heading"\n'
        'y = 2  # (SPEC "Heads")\n'
    )
    found = problems(bad, "bad.py")
    assert len(found) == 4, found
    assert "bad.py:1: cites the specification" in found[0]
    assert "bad.py:4: cites the specification" in found[1]
    assert "no-such-page.md does not exist" in found[2]
    assert "has no heading 'No such heading'" in found[3]
