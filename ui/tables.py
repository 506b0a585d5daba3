"""Tables as every page shows them: a missing value reads "–", never a raw "None" or "nan"."""

from __future__ import annotations

import numbers

import pandas as pd

MISSING = "–"


def _missing(value: object) -> bool:
    return (
        value is None
        or value is pd.NA
        or value is pd.NaT
        or (isinstance(value, float) and value != value)
    )


def _cell(value: object) -> object:
    if _missing(value):
        return MISSING
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        return f"{float(value):.4g}"
    return str(value)


def dashes(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose columns with a missing value (None, NaN, NA) show "–" there and
    the rest as text (numbers to 4 significant digits, timestamps as written); complete columns
    stay as they are (numbers sort)."""
    out = frame.copy()
    for column in out.columns:
        values = out[column]
        if values.isna().any():
            out[column] = [_cell(v) for v in values.astype(object)]
    return out
