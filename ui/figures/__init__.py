"""Figure builders: data in, plotly Figure out (one module per page)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from plotly.colors import qualitative

PALETTE = qualitative.Plotly


def class_colour(code: int) -> str:
    """The colour of class ``code`` (its index in the data set's label names) on every page."""
    return PALETTE[int(code) % len(PALETTE)]


def class_colours(label_names: Sequence[str]) -> dict[str, str]:
    """Class name → colour, by the class's index in the label names: the Data page's and the
    Layers page's figures colour a class alike."""
    return {str(name): class_colour(code) for code, name in enumerate(label_names)}


def si(value: float) -> str:
    """A count as people say it: 900, 20k, 1.5M, 22.7M."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def log_ticks(values: Iterable[float], most: int = 8) -> dict:
    """Tick values and labels of a log axis over ``values``: 1-2-5 steps (only the powers of ten
    when those are too many), each labelled in full ("200k", "1M", "2M"), never plotly's bare
    minor digits ("2 3 4 … 9 10M 2"). Keyword arguments for ``update_xaxes`` / ``update_yaxes``."""
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    if not finite:
        return {}
    low, high = math.floor(math.log10(min(finite))), math.ceil(math.log10(max(finite)))
    for steps in ((1, 2, 5), (1,)):
        ticks = [m * 10**e for e in range(low, high + 1) for m in steps]
        ticks = [t for t in ticks if min(finite) / 2.5 <= t <= max(finite) * 2.5]
        if len(ticks) <= most:
            break
    return {"tickmode": "array", "tickvals": ticks, "ticktext": [si(t) for t in ticks]}
