"""Counts in words, as a person reads them: "1 run", "3 runs", "1,200 examples" — never
"1 runs" or "run(s)"."""

from __future__ import annotations


def counted(n: int | float, noun: str, plural: str | None = None) -> str:
    """``n`` (thousands separated; a float as written by ``:g``) and ``noun``, in the plural
    unless n is 1; ``plural`` for a noun that does not take an s (``counted(2, "strategy",
    "strategies")``)."""
    number = f"{n:,}" if isinstance(n, int) else f"{n:g}"
    return f"{number} {noun if n == 1 else plural or noun + 's'}"
