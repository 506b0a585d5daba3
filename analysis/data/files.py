"""Local CSV / TSV / JSONL / JSON / Parquet files as tasks: reading, columns, labels, checks."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.config import DataSpec
from analysis.data.builtin import BUILTIN_DATA, GLUE_DATA
from analysis.data.parts import (
    DataError,
    TaskData,
    clean_texts,
    fingerprint,
    small_part_warnings,
    split_rows,
)

MAX_FILE_BYTES = 200 * 1_000_000
MAX_FILE_ENV = "TUNESCOPE_MAX_FILE_MB"

# Whole-number labels with at most this many distinct values are classes; more make a regression.
MAX_CLASSES = 30

# The fewest usable rows a data set may have (each part needs at least one).
MIN_ROWS = 10

SUPPORTED_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
TEXT_COLUMN_GUESSES = ("text", "sentence")
LABEL_COLUMN_GUESSES = ("label", "labels")


def load_file(spec: DataSpec) -> TaskData:
    """The task in the local file ``spec.name`` (see `analysis.data.load_data` for the rules)."""
    path, stat = checked_file(spec)
    return read_file_task(spec, str(path), stat.st_mtime_ns, stat.st_size)


def checked_file(spec: DataSpec) -> tuple[Path, os.stat_result]:
    """The resolved path of the local file ``spec.name`` and its stat, within the size limit."""
    path = resolve_file(spec.name.strip())
    stat = path.stat()
    limit = max_file_bytes()
    if stat.st_size > limit:
        raise DataError(
            f"{path.name} is {stat.st_size / 1e6:.1f} MB, over the {limit / 1e6:g} MB limit for "
            f"data files: use a smaller file or raise the limit with {MAX_FILE_ENV}."
        )
    return path, stat


def max_file_bytes() -> int:
    """The largest local file accepted: ``$TUNESCOPE_MAX_FILE_MB`` megabytes, else 200 MB."""
    raw = os.environ.get(MAX_FILE_ENV)
    if raw is None or not raw.strip():
        return MAX_FILE_BYTES
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = float("nan")
    if not megabytes > 0:
        raise DataError(f"{MAX_FILE_ENV} must be a positive number of megabytes (got {raw!r}).")
    return int(megabytes * 1_000_000)


# --- local files --------------------------------------------------------------------------------


def resolve_file(name: str) -> Path:
    path = Path(name).expanduser()
    suffix = path.suffix.lower()
    if not suffix:
        if path.exists():
            raise DataError(
                f"{name} has no file extension: name it .csv, .tsv, .jsonl, .json or .parquet."
            )
        raise DataError(
            f"Unknown data set {name!r}: choose a built-in ({', '.join(BUILTIN_DATA)}), a GLUE "
            f"task ({', '.join(GLUE_DATA)}) or the path of a "
            f"{' / '.join(SUPPORTED_EXTENSIONS)} file."
        )
    if suffix not in SUPPORTED_EXTENSIONS:
        raise DataError(
            f"Unsupported file type {suffix!r} ({path.name}): use one of "
            f"{', '.join(SUPPORTED_EXTENSIONS)}."
        )
    if not path.exists():
        raise DataError(f"Data file not found: {path}.")
    if not path.is_file():
        raise DataError(f"Cannot read {path}: it is not a regular file.")
    return path.resolve()


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path.name} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} on line {line}): "
            "re-save it as UTF-8 (e.g. 'CSV UTF-8' in a spreadsheet program)."
        ) from None


def _read_table(raw: bytes, path: Path) -> pd.DataFrame:
    """The file's table, its column names as text (JSON lines of arrays have the column names
    0, 1…: ``--text-col 0`` names the first)."""
    table = _read_raw_table(raw, path)
    table.columns = [str(c) for c in table.columns]
    return table


def _read_raw_table(raw: bytes, path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    if not raw.strip():
        raise DataError(f"{path.name} is empty.")
    try:
        if suffix == ".parquet":
            return pd.read_parquet(io.BytesIO(raw))
        text = _decode(raw, path)
        if suffix in (".csv", ".tsv"):
            # Everything as strings, and only empty cells missing: a text "NA" or "null" stays.
            return pd.read_csv(
                io.StringIO(text),
                sep="\t" if suffix == ".tsv" else ",",
                dtype=str,
                keep_default_na=False,
                na_values=[""],
            )
        if suffix == ".json" and text.lstrip().startswith("["):
            return pd.DataFrame.from_records(json.loads(text))
        return pd.read_json(io.StringIO(text), lines=True, dtype=False)
    except DataError:
        raise
    except pd.errors.EmptyDataError:
        raise DataError(f"{path.name} is empty.") from None
    except Exception as exc:
        kind = {".csv": "CSV", ".tsv": "TSV", ".parquet": "Parquet"}.get(suffix, "JSON lines")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"Could not read {path.name} as {kind}: {message}") from None


def _pick_column(
    frame: pd.DataFrame, chosen: str | None, guesses: Sequence[str], role: str, path: Path
) -> str:
    columns = list(frame.columns)  # text: `_read_table`
    listing = ", ".join(repr(c) for c in columns)
    hint = ""
    if len(columns) == 1:
        hint = (
            " (only one column: is the delimiter right? .csv files must be comma-separated, "
            ".tsv files tab-separated)"
        )
    if chosen is not None:
        if chosen not in columns:
            raise DataError(
                f"{role.capitalize()} column {chosen!r} not found in {path.name}; "
                f"columns are: {listing}{hint}."
            )
        return chosen
    for guess in guesses:
        if guess in columns:
            return guess
    raise DataError(
        f"No {role} column chosen and none named {' or '.join(repr(g) for g in guesses)} in "
        f"{path.name}; columns are: {listing}{hint}. Choose the {role} column."
    )


def _as_text(series: pd.Series, column: str) -> pd.Series:
    """Strings (missing stays missing); numbers become their text; nested values are refused."""
    values = series.astype(object)
    present = values[values.notna()]
    nested = present.map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray)))
    if nested.any():
        example = present[nested].iloc[0]
        raise DataError(
            f"Column {column!r} holds nested values (lists or structs, e.g. {str(example)[:60]}), "
            "not text: choose a column of plain strings."
        )
    return values.map(lambda v: v if isinstance(v, str) else (None if pd.isna(v) else str(v)))


def _numbers_as_text(series: pd.Series, column: str) -> str:
    """A warning when every text of ``column`` is a number (the text and label columns swapped,
    or an id column chosen), else ''."""
    present = series[series.notna()].astype(object)
    present = present.map(lambda v: v.strip() if isinstance(v, str) else v)
    present = present[present.map(lambda v: v != "")]
    if present.empty or pd.to_numeric(present, errors="coerce").isna().any():
        return ""
    examples = ", ".join(str(v) for v in present.unique()[:3])
    return (
        f"Column {column!r}, used as a text, holds only numbers (e.g. {examples}): are the text "
        "and label columns swapped? If so, choose the text column."
    )


def _labels(series: pd.Series, column: str) -> tuple[np.ndarray, tuple[str, ...], str]:
    """(labels (N,), label_names, task_type) from a label column without missing values.

    See ``load_data`` for the rules.
    """
    if pd.api.types.is_bool_dtype(series):
        return _class_ids(series.map(str))
    values = series.astype(object)
    nested = values.map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray)))
    if nested.any():
        raise DataError(f"Label column {column!r} holds nested values (lists or structs).")
    if any(isinstance(v, bool) for v in values):
        return _class_ids(values.map(str))
    as_text = values.map(lambda v: v.strip() if isinstance(v, str) else v)
    numbers = pd.to_numeric(as_text, errors="coerce").astype(np.float64)
    parsed = numbers.notna().to_numpy()
    if parsed.all():
        numbers_np = numbers.to_numpy()
        if not np.isfinite(numbers_np).all():
            raise DataError(f"Label column {column!r} holds infinite values.")
        distinct = np.unique(numbers_np)
        if np.all(distinct == np.round(distinct)) and len(distinct) <= MAX_CLASSES:
            names = tuple(str(int(v)) for v in distinct)
            return np.searchsorted(distinct, numbers_np).astype(np.int64), names, "classification"
        return numbers_np, (), "regression"
    names = as_text.map(str)
    fractional = parsed.any() and not np.all(numbers[parsed] == np.round(numbers[parsed]))
    if parsed.any() and (fractional or names.nunique() > MAX_CLASSES):
        bad = names[~parsed]
        examples = ", ".join(repr(v) for v in bad.unique()[:3])
        raise DataError(
            f"Label column {column!r} looks like a numeric (regression) target, but {len(bad)} "
            f"values are not numbers (e.g. {examples}): fix or remove those rows."
        )
    if names.nunique() > MAX_CLASSES:
        raise DataError(
            f"Label column {column!r} has {names.nunique()} distinct values, more than the "
            f"{MAX_CLASSES} classes allowed: is it really the label column?"
        )
    return _class_ids(names)


def _class_ids(names: pd.Series) -> tuple[np.ndarray, tuple[str, ...], str]:
    classes = sorted(names.unique())
    index = {name: i for i, name in enumerate(classes)}
    return names.map(index).to_numpy(dtype=np.int64), tuple(classes), "classification"


@functools.lru_cache(maxsize=4)
def read_file_task(spec: DataSpec, resolved: str, mtime_ns: int, size: int) -> TaskData:
    """The task in one local file (cached by path, modification time and size)."""
    del mtime_ns, size  # part of the cache key only
    path = Path(resolved)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    return task_from_bytes(spec, raw, path)


def read_columns(path: Path) -> list[str]:
    """The column names of a local data file, as `task_from_bytes` reads it (for a picker of
    the text and label columns); a DataError when it cannot be read."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    return list(_read_table(raw, Path(path)).columns)


def task_from_bytes(spec: DataSpec, raw: bytes, path: Path) -> TaskData:
    """The task in a file's content ``raw``; ``path`` names it (its suffix picks the reader).

    The same TaskData as reading the file itself: the fingerprint hashes the content, not the
    path. The Ray executor uses it on machines that receive the file through Ray's object store.
    """
    table = _read_table(raw, path)
    text_col = _pick_column(table, spec.text_col, TEXT_COLUMN_GUESSES, "text", path)
    label_col = _pick_column(table, spec.label_col, LABEL_COLUMN_GUESSES, "label", path)
    pair_col = None
    if spec.text_pair_col is not None:
        pair_col = _pick_column(table, spec.text_pair_col, (), "second-text", path)
    if label_col in (text_col, pair_col):
        raise DataError(f"Column {label_col!r} cannot be both a text and the label.")
    if table.empty:
        raise DataError(f"{path.name} has a header but no rows.")

    frame = pd.DataFrame({"text": _as_text(table[text_col], text_col)})
    if pair_col is not None:
        frame["text_pair"] = _as_text(table[pair_col], pair_col)
    column_warnings = [
        message
        for column in (text_col, pair_col)
        if column is not None and (message := _numbers_as_text(table[column], column))
    ]
    frame["label"] = table[label_col]
    notes: list[str] = []
    total = len(frame)
    frame, dropped = clean_texts(frame)
    if dropped:
        notes.append(f"Dropped {dropped} of {total} rows with an empty or missing text.")
    missing = frame["label"].isna()
    if missing.any():
        notes.append(f"Dropped {int(missing.sum())} of {total} rows with a missing label.")
        frame = frame[~missing]
    if len(frame) < MIN_ROWS:
        raise DataError(
            f"{path.name} has only {len(frame)} usable rows (of {total}; rows with an empty text "
            f"or label are dropped): at least {MIN_ROWS} are needed."
        )
    labels, label_names, task_type = _labels(frame["label"].reset_index(drop=True), label_col)
    frame = frame.reset_index(drop=True).assign(label=labels)
    if task_type == "classification":
        counts = np.bincount(labels, minlength=len(label_names))
        if len(label_names) < 2:
            raise DataError(
                f"Label column {label_col!r} has a single class ({label_names[0]!r}): "
                "a task needs at least 2."
            )
        rare = [label_names[i] for i in np.flatnonzero(counts < 2)]
        if rare:
            raise DataError(
                f"Class {rare[0]!r} has a single example"
                + (f" (as do {len(rare) - 1} more)" if len(rare) > 1 else "")
                + ": every class needs at least 2. Remove such rows or add examples."
            )
    elif np.all(labels == labels[0]):
        raise DataError(f"Label column {label_col!r} has the same value on every row.")

    parts = split_rows(frame, stratify=task_type == "classification", seed=spec.split_seed)
    metric = "accuracy" if task_type == "classification" else "spearman"
    return TaskData(
        spec=spec,
        title=path.name,
        parts=parts,
        label_names=label_names,
        task_type=task_type,
        metric=metric,
        fingerprint=fingerprint(
            hashlib.sha256(raw).hexdigest(),
            path.suffix.lower(),
            text_col,
            pair_col,
            label_col,
            spec.split_seed,
        ),
        notes=tuple(notes),
        warnings=(*column_warnings, *small_part_warnings(parts, metric)),
    )
