"""Seeded samples of one part of a task: uniform, label-balanced, or with a set class share."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from analysis.config import SampleSpec
from analysis.data.parts import DataError, TaskData


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
        quotas = class_quotas(spec, spec.n, data.n_classes)
        short = np.flatnonzero(quotas > counts)
        if short.size:
            best = largest_feasible_n(spec, counts)
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


def fit_to_part(data: TaskData, spec: SampleSpec) -> tuple[SampleSpec, str]:
    """``spec``, or — when its part holds fewer than ``spec.n`` examples — a uniform sample of the
    whole part, with a note that says so ('' when ``spec`` stands). For a small file the
    dashboard's N was chosen for larger data: refusing it would only make the user type the
    part's size. Other schemes are left as asked (`sample` says which N they can reach)."""
    size = len(data.parts[spec.part])
    if spec.n <= size or spec.scheme != "random" or size < 2:
        return spec, ""
    note = (
        f"{data.title}'s {spec.part} part holds {size:,} examples, fewer than N = {spec.n:,}: "
        f"all {size:,} are used."
    )
    return dataclasses.replace(spec, n=size), note


# --- sampling helpers ---------------------------------------------------------------------------


def even_split(n: int, k: int) -> np.ndarray:
    """n split over k slots as evenly as possible, the first n mod k slots one larger."""
    return np.array([n // k + (i < n % k) for i in range(k)], dtype=np.int64)


def class_quotas(spec: SampleSpec, n: int, n_classes: int) -> np.ndarray:
    """Examples per class (C,) that the scheme asks for in a sample of n."""
    if spec.scheme == "balanced":
        if n < n_classes:
            raise DataError(
                f"A balanced sample needs N ≥ the number of classes ({n_classes}); got N = {n}."
            )
        return even_split(n, n_classes)
    assert spec.share is not None
    first = int(np.floor(spec.share * n + 0.5))
    if first < 1 or n - first < n_classes - 1:
        raise DataError(
            f"A share p = {spec.share:g} of N = {n} leaves no example of some class: "
            "choose a larger N or a p closer to 0.5."
        )
    return np.concatenate([[first], even_split(n - first, n_classes - 1)])


def largest_feasible_n(spec: SampleSpec, counts: np.ndarray) -> int:
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
            quotas = class_quotas(spec, n, len(counts))
        except DataError:
            continue
        if np.all(quotas <= counts):
            return n
    return 0
