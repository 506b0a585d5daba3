"""Comparing two settings A and B with a verdict
(docs/explanation/statistics.md, "Comparing two settings").

One function, `compare`, serves every comparison in tunescope: the Fine-tune results, the Heads
page (PageRank vs random heads, the ablation selectors), the Subspaces page (intrinsic vs full vs
random subspace, the disable experiment), the papers' claims and ``python -m tunescope runs
compare``.

An *arm* is one setting's finished runs, one per seed (`Arm`). Two tests, named in every
`Comparison` (``test``):

- ``"welch"`` (the default; independent arms):

      diff = mean(s_A) − mean(s_B),   se_X = sd(s_X, ddof=1) / √n_X,   se = √(se_A² + se_B²)

  with t the 97.5 % quantile of Student's t at the Welch–Satterthwaite degrees of freedom
  df = se⁴ / (se_A⁴/(n_A − 1) + se_B⁴/(n_B − 1)) (with 3 seeds a side t ≈ 2.8–4.3, not 2: "2 se"
  would be about an 86 % test there).
- ``"paired"`` (common random numbers: seed s trains both arms alike), over the n seeds both arms
  have:

      d_s = s_A(s) − s_B(s),   diff = mean(d),   se = sd(d, ddof=1) / √n,   df = n − 1

Verdict "A better" / "B better" when |diff| > t · se, else "no difference shown (n seeds = n_A,
n_B)"; a paired verdict starts with "paired t (n pairs): ". With a single seed (or pair) the s.e.
is undefined, so no verdict is possible.

Paired bootstrap over test examples: when every run of both arms was scored on the same test
part (the engine scores one fixed test subset, `analysis.finetune.engine.EVAL_SUBSET_SEED`, and
records its fingerprint), the test examples are resampled B times with replacement; each
resample re-scores every run, averages each arm over its seeds and takes the difference δ*.
``paired_p`` = 2 · min(P(δ* ≤ 0), P(δ* ≥ 0)), capped at 1: the two-sided percentile-bootstrap
p-value of "no difference". It measures how much the test sample alone could move the
difference (not the seed-to-seed variation the verdict rests on), so it is reported beside the
verdict, never instead of it.

Per-example test predictions travel in a run's result as a compact record
(`analysis.predictions`): base64 of little-endian int16 class ids (float32 for regression) and
the gold labels, with the test part's fingerprint.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.io import json_ready
from analysis.predictions import decode_predictions
from analysis.scores import METRICS, task_score

T_LEVEL = 0.975  # a verdict needs |diff| > t_{0.975, df} · se
TESTS = ("welch", "paired")
N_BOOTSTRAP = 10_000  # seeded: every page and ``runs compare`` give the same p


# -- arms and the verdict -------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One setting's finished runs: a test score per seed, the seed of each score and, when
    recorded, each run's test predictions (N,) with the gold labels (N,) and the test part's
    fingerprint.

    ``seeds`` is empty when any seed is unknown (then no paired t); ``predictions`` is empty when
    any run lacks them (then no paired bootstrap).
    """

    name: str
    scores: tuple[float, ...]
    metric: str | None = None
    predictions: tuple[np.ndarray, ...] = field(default=(), compare=False)
    labels: np.ndarray | None = field(default=None, compare=False)
    fingerprint: str | None = None
    seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.seeds and len(self.seeds) != len(self.scores):
            raise ValueError(
                f"Arm {self.name!r}: {len(self.seeds)} seeds for {len(self.scores)} scores."
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"Arm {self.name!r}: a seed appears twice in {self.seeds}.")

    @property
    def n_seeds(self) -> int:
        return len(self.scores)

    def by_seed(self) -> dict[int, float]:
        """seed → score (empty when the seeds are unknown)."""
        return dict(zip(self.seeds, self.scores, strict=True)) if self.seeds else {}

    @classmethod
    def from_results(cls, name: str, results: Iterable[dict[str, Any]]) -> Arm:
        """An arm from run results (``FinetuneResult.to_dict()`` as stored: ``score``,
        ``metric``, ``seed``, optional ``test_predictions``). Runs without a score are skipped;
        the seeds are kept when every run has one and no seed repeats."""
        scores, seeds, preds, labels, prints, metrics = [], [], [], [], set(), set()
        complete = True
        for result in results:
            score = result.get("score")
            if score is None or not math.isfinite(float(score)):
                continue
            scores.append(float(score))
            seeds.append(None if result.get("seed") is None else int(result["seed"]))
            metrics.add(result.get("metric"))
            decoded = decode_predictions(result.get("test_predictions"))
            if decoded is None:
                complete = False
                continue
            preds.append(decoded[0])
            labels.append(decoded[1])
            prints.add(decoded[2])
        same_part = complete and len(prints) == 1 and preds
        known = None not in seeds and len(set(seeds)) == len(seeds)
        return cls(
            name=name,
            scores=tuple(scores),
            metric=metrics.pop() if len(metrics) == 1 else None,
            predictions=tuple(preds) if same_part else (),
            labels=labels[0] if same_part else None,
            fingerprint=prints.pop() if same_part else None,
            seeds=tuple(seeds) if known else (),
        )


@dataclass(frozen=True)
class Comparison:
    """A − B by ``test`` ("welch" or "paired"): means, standard errors, the difference, its
    s.e., the verdict and the paired bootstrap p-value (None when the two arms were not scored on
    one test part). A paired comparison's means and s.e.'s are over the ``n_pairs`` seeds both
    arms have; ``n_seeds_a`` / ``n_seeds_b`` count every seed of each arm."""

    name_a: str
    name_b: str
    mean_a: float
    mean_b: float
    se_a: float
    se_b: float
    n_seeds_a: int
    n_seeds_b: int
    diff: float
    se: float
    verdict: str
    paired_p: float | None
    df: float = math.nan  # Welch's, or n_pairs − 1
    test: str = "welch"
    n_pairs: int | None = None  # paired only

    @property
    def decided(self) -> bool:
        """Whether the data call a winner (|diff| > t · se)."""
        return self.verdict.endswith(" better")

    @property
    def winner(self) -> str | None:
        """ "A", "B" or None (no difference shown)."""
        if not self.decided:
            return None
        return "A" if self.diff > 0 else "B"

    @property
    def margin(self) -> float:
        """t · se, t at 97.5 % with ``df`` degrees of freedom (NaN when undefined)."""
        return welch_t(self.df) * self.se

    def interval(self) -> tuple[float, float]:
        """diff ± t · se (NaN when se is undefined)."""
        return self.diff - self.margin, self.diff + self.margin

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; NaN becomes None. The keys of ``runs compare --json`` come first."""
        clean = json_ready
        return {
            "diff": clean(self.diff),
            "se": clean(self.se),
            "verdict": self.verdict,
            "n_seeds_a": self.n_seeds_a,
            "n_seeds_b": self.n_seeds_b,
            "paired_p": clean(self.paired_p),
            "a": self.name_a,
            "b": self.name_b,
            "mean_a": clean(self.mean_a),
            "mean_b": clean(self.mean_b),
            "se_a": clean(self.se_a),
            "se_b": clean(self.se_b),
            "df": clean(self.df),
            "margin": clean(self.margin),
            "test": self.test,
            "n_pairs": self.n_pairs,
        }


def mean_se(scores: Sequence[float]) -> tuple[float, float, int]:
    """(mean, standard error sd(ddof=1)/√n, n) of finite scores; s.e. NaN for n < 2."""
    values = np.asarray([s for s in scores if s is not None and math.isfinite(s)], dtype=float)
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    se = float(values.std(ddof=1) / math.sqrt(n)) if n >= 2 else math.nan
    return float(values.mean()), se, n


def welch_df(se_a: float, se_b: float, n_a: int, n_b: int) -> float:
    """Welch–Satterthwaite degrees of freedom of diff's s.e. (NaN when undefined)."""
    if n_a < 2 or n_b < 2 or not (math.isfinite(se_a) and math.isfinite(se_b)):
        return math.nan
    num = (se_a**2 + se_b**2) ** 2
    den = se_a**4 / (n_a - 1) + se_b**4 / (n_b - 1)
    return num / den if den > 0 else float(n_a + n_b - 2)


def welch_t(df: float) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (NaN when undefined)."""
    from scipy.stats import t

    return float(t.ppf(T_LEVEL, df)) if math.isfinite(df) and df > 0 else math.nan


def verdict(
    diff: float, se: float, n_a: int, n_b: int, name_a: str = "A", name_b: str = "B",
    df: float | None = None, n_pairs: int | None = None,
) -> str:  # fmt: skip
    """ "<A> better" / "<B> better" when |diff| > t · se (t at 97.5 %, ``df`` degrees of freedom;
    default n_a + n_b − 2), else "no difference shown (n seeds = …)"; prefixed with
    "paired t (n pairs): " when ``n_pairs`` is given (the verdict still ends in " better")."""
    df = float(n_a + n_b - 2) if df is None else df
    margin = welch_t(df) * se
    prefix = "" if n_pairs is None else f"paired t ({n_pairs} pairs): "
    if math.isfinite(diff) and math.isfinite(margin) and abs(diff) > margin:
        return f"{prefix}{name_a if diff > 0 else name_b} better"
    return f"{prefix}no difference shown (n seeds = {n_a}, {n_b})"


def compare(
    a: Arm | Sequence[float],
    b: Arm | Sequence[float],
    name_a: str | None = None,
    name_b: str | None = None,
    n_boot: int = N_BOOTSTRAP,
    seed: int = 0,
    test: str = "welch",
) -> Comparison:
    """Compare setting A with setting B by ``test`` (module docstring). ``a`` / ``b``: an `Arm`
    or plain test scores, one per seed (seeds 0, 1, …). Names default to the arms' names ("A" /
    "B" for plain scores) and appear in the verdict ("A better"). The paired t needs both arms'
    seeds and pairs the scores of the seeds both have."""
    if test not in TESTS:
        raise ValueError(f"Unknown test {test!r}: choose one of {', '.join(TESTS)}.")
    arm_a = a if isinstance(a, Arm) else _plain_arm("A", a)
    arm_b = b if isinstance(b, Arm) else _plain_arm("B", b)
    name_a = name_a or arm_a.name
    name_b = name_b or arm_b.name
    paired = None
    if _paired(arm_a, arm_b):
        paired = paired_bootstrap_p(
            arm_a.predictions, arm_b.predictions, arm_a.labels, arm_a.metric, n_boot, seed
        )
    if test == "paired":
        return _paired_t(arm_a, arm_b, name_a, name_b, paired)
    mean_a, se_a, n_a = mean_se(arm_a.scores)
    mean_b, se_b, n_b = mean_se(arm_b.scores)
    diff = mean_a - mean_b
    se = math.sqrt(se_a**2 + se_b**2)
    dof = welch_df(se_a, se_b, n_a, n_b)
    return Comparison(
        name_a, name_b, mean_a, mean_b, se_a, se_b, n_a, n_b, diff, se,
        verdict(diff, se, n_a, n_b, name_a, name_b, dof), paired, dof,
    )  # fmt: skip


def paired_scores(a: Arm, b: Arm) -> tuple[np.ndarray, np.ndarray]:
    """The finite scores of the seeds both arms have, in seed order: two (n,) arrays."""
    if not (a.seeds and b.seeds):
        missing = a.name if not a.seeds else b.name
        raise ValueError(f"The paired t needs each score's seed; arm {missing!r} has none.")
    by_a, by_b = a.by_seed(), b.by_seed()
    both = [s for s in sorted(set(by_a) & set(by_b)) if math.isfinite(by_a[s] + by_b[s])]
    return np.array([by_a[s] for s in both]), np.array([by_b[s] for s in both])


def _paired_t(a: Arm, b: Arm, name_a: str, name_b: str, paired_p: float | None) -> Comparison:
    score_a, score_b = paired_scores(a, b)
    n = len(score_a)
    mean_a, se_a, _ = mean_se(score_a.tolist())
    mean_b, se_b, _ = mean_se(score_b.tolist())
    diff, se, _ = mean_se((score_a - score_b).tolist())
    dof = float(n - 1) if n >= 2 else math.nan
    return Comparison(
        name_a, name_b, mean_a, mean_b, se_a, se_b, a.n_seeds, b.n_seeds, diff, se,
        verdict(diff, se, a.n_seeds, b.n_seeds, name_a, name_b, dof, n_pairs=n), paired_p, dof,
        test="paired", n_pairs=n,
    )  # fmt: skip


def _plain_arm(name: str, scores: Sequence[float]) -> Arm:
    values = tuple(float(x) for x in scores)
    return Arm(name, values, seeds=tuple(range(len(values))))


def _paired(a: Arm, b: Arm) -> bool:
    return bool(
        a.predictions
        and b.predictions
        and a.fingerprint is not None
        and a.fingerprint == b.fingerprint
        and a.metric is not None
        and a.metric == b.metric
    )


# -- paired bootstrap over test examples ----------------------------------------------------------


def paired_bootstrap_p(
    preds_a: Sequence[np.ndarray],
    preds_b: Sequence[np.ndarray],
    labels: np.ndarray,
    metric: str,
    n_boot: int = N_BOOTSTRAP,
    seed: int = 0,
) -> float:
    """Two-sided p-value of "A and B score the same" from B resamples of the test examples.

    preds_a: one (N,) array per run of A (its seeds), likewise preds_b; labels: (N,). Each
    resample draws N example indices with replacement (the same draw for every run: paired),
    scores every run with ``metric``, averages each arm and records δ* = mean_A − mean_B.
    Returns 2 · min(P(δ* ≤ 0), P(δ* ≥ 0)), at most 1.
    """
    if metric not in METRICS:
        raise ValueError(f"Unknown metric {metric!r}: choose one of {', '.join(METRICS)}.")
    labels = np.asarray(labels, dtype=np.float64)
    counts = _resample_counts(len(labels), n_boot, seed)
    a = np.mean([_resampled_scores(p, labels, metric, counts) for p in preds_a], axis=0)
    b = np.mean([_resampled_scores(p, labels, metric, counts) for p in preds_b], axis=0)
    delta = a - b  # (B,)
    delta = delta[np.isfinite(delta)]
    if delta.size == 0:
        return math.nan
    return float(min(1.0, 2 * min(np.mean(delta <= 0), np.mean(delta >= 0))))


@functools.lru_cache(maxsize=4)
def _resample_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """counts[b, i]: how often example i is drawn in resample b, (B, N) float64, read-only.
    N draws with replacement per resample, counted with one bincount (a multinomial draw is much
    slower); cached, since every comparison on one test part reuses them."""
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    flat = (np.arange(n_boot)[:, None] * n + draws).ravel()
    counts = np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)
    counts.flags.writeable = False
    return counts


def _resampled_scores(
    pred: np.ndarray, labels: np.ndarray, metric: str, counts: np.ndarray
) -> np.ndarray:
    """The score of one run on every resample, (B,). Classification metrics come from the
    resampled confusion counts in one matrix product; Spearman is scored resample by resample."""
    pred = np.asarray(pred, dtype=np.float64)
    if metric == "spearman":
        out = np.empty(len(counts))
        for i, weights in enumerate(counts):
            rows = np.repeat(np.arange(len(labels)), weights.astype(np.int64))
            out[i] = task_score("spearman", labels[rows], pred[rows])
        return out
    classes = np.union1d(labels, pred)
    y = np.searchsorted(classes, labels)
    p = np.searchsorted(classes, pred)
    n_classes = len(classes)
    pairs = np.zeros((len(labels), n_classes * n_classes))
    pairs[np.arange(len(labels)), y * n_classes + p] = 1.0
    confusion = (counts @ pairs).reshape(len(counts), n_classes, n_classes)  # (B, true, pred)
    total = confusion.sum(axis=(1, 2))
    if metric == "accuracy":
        return np.trace(confusion, axis1=1, axis2=2) / total
    if metric == "f1":
        if 1.0 not in classes:
            return np.zeros(len(counts))
        k = int(np.searchsorted(classes, 1.0))
        tp = confusion[:, k, k]
        fp = confusion[:, :, k].sum(axis=1) - tp
        fn = confusion[:, k, :].sum(axis=1) - tp
        denom = 2 * tp + fp + fn
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denom > 0, 2 * tp / denom, 0.0)
    # Matthews correlation, multiclass (Gorodkin's R_K), as sklearn computes it
    t = confusion.sum(axis=2)  # (B, C) true counts
    q = confusion.sum(axis=1)  # (B, C) predicted counts
    correct = np.trace(confusion, axis1=1, axis2=2)
    cov_ytyp = correct * total - (t * q).sum(axis=1)
    cov_ypyp = total**2 - (q * q).sum(axis=1)
    cov_ytyt = total**2 - (t * t).sum(axis=1)
    denom = np.sqrt(cov_ytyt * cov_ypyp)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, cov_ytyp / denom, 0.0)


def comparisons_frame(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """One row per comparison: a, b, mean_a, mean_b, n_seeds_a, n_seeds_b, diff, se, lo, hi
    (diff ± t · se), test ("welch" / "paired"), verdict, paired_p — for tables and downloads."""
    rows = []
    for c in comparisons:
        lo, hi = c.interval()
        rows.append(
            {"a": c.name_a, "b": c.name_b, "mean_a": c.mean_a, "mean_b": c.mean_b,
             "n_seeds_a": c.n_seeds_a, "n_seeds_b": c.n_seeds_b, "diff": c.diff, "se": c.se,
             "lo": lo, "hi": hi, "test": c.test, "verdict": c.verdict, "paired_p": c.paired_p}
        )  # fmt: skip
    columns = ["a", "b", "mean_a", "mean_b", "n_seeds_a", "n_seeds_b", "diff", "se", "lo", "hi",
               "test", "verdict", "paired_p"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)
