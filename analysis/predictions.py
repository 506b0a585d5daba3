"""The stored format of a run's per-example test predictions (the paired bootstrap of
`analysis.compare` reads them back: docs/explanation/statistics.md, "Comparing two settings").

A run's result carries its test predictions as a compact JSON record (`encode_predictions` /
`decode_predictions`): base64 of little-endian int16 class ids (float32 for regression) and the
gold labels, with the test part's fingerprint (`fingerprint_of_part`), so two runs are paired
only when they were scored on the same examples.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

PREDICTIONS_FORMAT = "tunescope-predictions/1"


def fingerprint_of_part(texts: Sequence[str], labels: Sequence[float] | np.ndarray) -> str:
    """SHA-256 (first 16 hex digits) of the test part's texts and labels, in order: two runs with
    the same fingerprint were scored on the same examples."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    digest.update(np.asarray(labels, dtype=np.float64).tobytes())
    return digest.hexdigest()[:16]


def _pack(values: np.ndarray, regression: bool) -> str:
    dtype = "<f4" if regression else "<i2"
    return base64.b64encode(np.asarray(values).astype(dtype).tobytes()).decode("ascii")


def encode_predictions(
    predictions: np.ndarray, labels: np.ndarray, fingerprint: str, regression: bool
) -> dict[str, Any]:
    """A run's test predictions (N,) and gold labels (N,) as a small JSON-ready record:
    ≈ 2.7 characters per example for class ids (1,000 examples ≈ 2.7 kB each for both arrays)."""
    return {
        "format": PREDICTIONS_FORMAT,
        "fingerprint": fingerprint,
        "regression": bool(regression),
        "n": len(predictions),
        "predictions": _pack(predictions, regression),
        "labels": _pack(labels, regression),
    }


def decode_predictions(record: Any) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(predictions (N,), labels (N,), fingerprint) of `encode_predictions`' record, or None for a
    result without one (runs from before predictions were stored) or a malformed one."""
    if not isinstance(record, dict) or record.get("format") != PREDICTIONS_FORMAT:
        return None
    dtype = "<f4" if record.get("regression") else "<i2"
    try:
        preds = np.frombuffer(base64.b64decode(record["predictions"]), dtype=dtype)
        labels = np.frombuffer(base64.b64decode(record["labels"]), dtype=dtype)
    except (KeyError, TypeError, ValueError):
        return None
    if len(preds) != len(labels) or len(preds) != record.get("n"):
        return None
    return preds.astype(np.float64), labels.astype(np.float64), str(record.get("fingerprint"))


def describe_predictions(record: Any, first: int = 10) -> str:
    """One line for a person in place of the record's base64 arrays: how many predictions, on
    which test part, a checksum of them (SHA-256 of the packed array, 16 hex digits: equal
    checksums, equal predictions) and the first few."""
    decoded = decode_predictions(record)
    if decoded is None:
        return "no readable predictions"
    preds, _, fingerprint = decoded
    shown = " ".join(f"{v:.4g}" if record.get("regression") else str(int(v)) for v in preds[:first])
    checksum = hashlib.sha256(str(record["predictions"]).encode("ascii")).hexdigest()[:16]
    more = " …" if len(preds) > first else ""
    return (
        f"{len(preds)} predictions on test part {fingerprint} · sha256 {checksum} · "
        f"first {min(first, len(preds))}: {shown}{more}"
    )
