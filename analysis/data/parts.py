"""A labelled task split into train / dev / test parts, and the seeded, stratified split itself."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.config import DataSpec

# Bump when a change here changes the parts that a DataSpec gives; it is part of every fingerprint.
DATA_VERSION = "1"

DEV_SHARE = 0.1
TEST_SHARE = 0.1
# Below this many examples one dev or test example moves the accuracy by more than a point.
SMALL_PART = 100


class DataError(ValueError):
    """The data cannot be used as asked; the message says why and what to do."""


class DataWarning(UserWarning):
    """The data can be used, but something about it looks like a mistake (a text column of
    numbers: swapped columns?); `analysis.data.load_data` warns with each of ``TaskData.warnings``."""


@dataclass(frozen=True, eq=False)
class TaskData:
    """One labelled task split into parts.

    parts: ``{'train', 'dev', 'test'} -> DataFrame`` with columns ``text``, optional
    ``text_pair`` and ``label``; index 0..n-1. Labels are class ids ``0..C-1`` (positions in
    ``label_names``) for classification and floats for regression (``label_names`` empty).
    fingerprint: SHA-256 over the source bytes, the column choices and the split seed: equal
    fingerprints mean equal parts. notes: what was dropped or ignored on the way, for the user;
    warnings: what looks like a mistake in the choice of data or columns (`DataWarning`).
    Shared by every caller of ``load_data``: treat the DataFrames as read-only.
    """

    spec: DataSpec
    title: str
    parts: dict[str, pd.DataFrame]
    label_names: tuple[str, ...]
    task_type: str
    metric: str
    fingerprint: str
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def n_classes(self) -> int:
        """C, the number of classes; 0 for regression."""
        return len(self.label_names)

    @property
    def has_pair(self) -> bool:
        """Whether an example is a text pair."""
        return "text_pair" in self.parts["train"].columns

    @property
    def n_rows(self) -> int:
        """Examples in all three parts together."""
        return sum(len(part) for part in self.parts.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskData) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)


# --- splitting ----------------------------------------------------------------------------------


def split_groups(groups: np.ndarray, shares: Sequence[float], seed: int) -> list[np.ndarray]:
    """Row indices (sorted) of the parts: the rest first, then one part per held-out share.

    Stratified by ``groups`` (N,): each group gives round(share · size) of its rows to every
    held-out part, so that every class keeps its share in each part and stays in train.
    """
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(shares) + 1)]
    for group in np.unique(groups):
        order = rng.permutation(np.flatnonzero(groups == group))
        start = 0
        for i, share in enumerate(shares, start=1):
            take = int(np.floor(share * len(order) + 0.5))
            parts[i].append(order[start : start + take])
            start += take
        parts[0].append(order[start:])
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def split_rows(frame: pd.DataFrame, stratify: bool, seed: int) -> dict[str, pd.DataFrame]:
    """The seeded 80/10/10 train/dev/test split of one table."""
    labels = frame["label"].to_numpy() if stratify else np.zeros(len(frame), dtype=np.int64)
    train, dev, test = split_groups(labels, (DEV_SHARE, TEST_SHARE), seed)
    parts = {"train": train, "dev": dev, "test": test}
    empty = [name for name, rows in parts.items() if len(rows) == 0]
    if empty:
        raise DataError(
            f"Too few examples to hold out a {' and '.join(empty)} part ({len(frame)} rows): "
            "the 80/10/10 split needs about 10 examples of each class."
        )
    return {name: tidy(frame.iloc[rows]) for name, rows in parts.items()}


def small_part_warnings(parts: dict[str, pd.DataFrame], metric: str) -> tuple[str, ...]:
    """A warning when the dev or test part is under `SMALL_PART` examples: its accuracy moves in
    steps of 100 / n points (one example), coarser than the differences the runs are judged by."""
    small = {name: len(parts[name]) for name in ("dev", "test") if len(parts[name]) < SMALL_PART}
    if metric != "accuracy" or not small:
        return ()
    names = " and ".join(small)
    sizes = sorted(set(small.values()))
    held = (f"{sizes[0]:,} examples" + (" each" if len(small) > 1 else "") if len(sizes) == 1
            else " and ".join(f"{n:,}" for n in small.values()) + " examples")  # fmt: skip
    steps = " and ".join(f"{100 / n:.3g}" for n in sizes)
    return (
        f"The {names} {'parts hold' if len(small) > 1 else 'part holds'} only {held}: accuracy "
        f"on {'them' if len(small) > 1 else 'it'} moves in steps of {steps} points (100 / n: one "
        "example), so a difference of a few such steps between runs is noise. A file with more "
        "rows gives finer scores.",
    )


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns text, [text_pair,] label in that order, string texts, index 0..n-1."""
    columns = [c for c in ("text", "text_pair", "label") if c in frame.columns]
    out = frame[columns].reset_index(drop=True)
    texts = {c: out[c].astype(str) for c in ("text", "text_pair") if c in out.columns}
    return out.assign(**texts)


def fingerprint(*pieces: object) -> str:
    digest = hashlib.sha256(DATA_VERSION.encode())
    for piece in pieces:
        digest.update(b"\x00")
        digest.update(piece if isinstance(piece, bytes) else json.dumps(piece).encode())
    return digest.hexdigest()


def clean_texts(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop rows whose text (or text pair) is missing or blank; return how many went."""
    keep = pd.Series(True, index=frame.index)
    for column in ("text", "text_pair"):
        if column in frame.columns:
            values = frame[column]
            keep &= values.notna() & values.astype(str).str.strip().ne("")
    return frame[keep], int((~keep).sum())
