"""Figure builders: data in, plotly Figure out (one module per page)."""

from __future__ import annotations

from collections.abc import Sequence

from plotly.colors import qualitative

PALETTE = qualitative.Plotly


def class_colour(code: int) -> str:
    """The colour of class ``code`` (its index in the data set's label names) on every page."""
    return PALETTE[int(code) % len(PALETTE)]


def class_colours(label_names: Sequence[str]) -> dict[str, str]:
    """Class name → colour, by the class's index in the label names: the Data page's and the
    Layers page's figures colour a class alike."""
    return {str(name): class_colour(code) for code, name in enumerate(label_names)}
