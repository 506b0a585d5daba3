"""One layer's row of the layer table (`layer_row`), and the rows of several layers fitted side by
side in helper processes (`layer_rows`, through `share_layers`). The same sharing serves the layer
repeats (`resampled_rows`: one layer's ν / CCA / ϱ on every bootstrap resample) and the streamed
route's probes (`fit_probe`, sent to the same helpers by `analysis.layers.streamed`).

Why processes, not threads: a layer's row is mostly its cross-validated probe, 110 small
L-BFGS fits (5 outer folds × (3 inner folds × 7 C values + 1 refit)) whose steps are short Python
calls around small matrix-vector products. Two threads hold the GIL in turn and ran the probes
at 0.62× the speed of one; BLAS threads do not help either (the products are small: `blas_threads`
keeps them at one). So the layers are shared out between this process and ``processes − 1``
helper processes (`helpers`), each fitting whole layers on one BLAS thread. The numbers are the
same bit for bit: each layer gets the same float64 rows, folds and seed in whichever process fits
it (`tests/layers/test_rows.py`).

Sharing: the helpers take layers from the front, this process from the back; before each layer
this process tries to cancel the helpers' claim on it, which succeeds while no helper has picked
it up yet. So the work balances itself (layers differ in cost: a hard layer's fits take more
L-BFGS steps) and each layer is fitted exactly once. Tables too small to gain
(`PARALLEL_MIN_WORK` numbers in all) stay in this process.

The helpers are spawned once per process and kept (a spawn and its imports cost about a second),
and each ends with the process that started it (`analysis.children.exit_with_parent`);
`start_helpers` starts them ahead of need (the dashboard's compute workers do, while their model
loads). ``$TUNESCOPE_LAYER_PROCESSES`` sets how many processes fit layers (default every usable
core, at most 8; 1: this process alone; each dashboard compute worker gets its share of the cores,
at least 2: `ui.compute_pool`). This module imports no torch, so a helper starts in the time its
numpy, scipy and scikit-learn imports take.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import multiprocessing.context
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool

import numpy as np
from threadpoolctl import threadpool_limits

from analysis.children import exit_with_parent, plain_main, usable_cores
from analysis.layers.metrics import (
    Split,
    as_float64,
    cca_score,
    nu,
    rank_metric,
    split_indices,
)
from analysis.layers.probe import ProbeCV, cv_predictions
from analysis.scores import task_score

PARALLEL_MIN_WORK = 1_000_000  # examples × d × layers below which the layers stay in this process
PROCESSES_ENV = "TUNESCOPE_LAYER_PROCESSES"
DEFAULT_MAX_PROCESSES = 8

Row = tuple[dict[str, float], "ProbeCV | None"]


def blas_threads() -> threadpool_limits:
    """Limit BLAS to TUNESCOPE_BLAS_THREADS threads (default 1) for the per-layer fits.

    Each fit is small (d ≤ ~1,024); on a shared CPU, or beside torch's own OpenMP threads,
    two spin-waiting BLAS threads ran the four metrics 13× slower than one (27 s vs 2.1 s for
    MiniLM, N = 2,000, on this project's 2-core machine).
    """
    return threadpool_limits(
        limits=int(os.environ.get("TUNESCOPE_BLAS_THREADS", "1")), user_api="blas"
    )


def layer_row(
    layer: int,
    h: np.ndarray,
    classes: np.ndarray,
    raw: np.ndarray,
    split: Split,
    metric: str,
    which: Sequence[str],
    seed: int,
    folds: np.ndarray | None = None,
) -> Row:
    """One layer's metrics and its cross-validated probe; h: (N, d) float64. Metrics not in
    ``which`` are NaN, and so are CCA (too few examples for its dev / test parts) and the probe
    (``folds`` None: some class too small for stratified folds) when the sample is tiny.
    folds: (N,) the probe's outer fold per example (`analysis.layers.probe.outer_folds`, shared
    by every layer). probe_c: the median over the folds of the C the inner CV chose; probe_se:
    the probe score's bootstrap s.e. (`analysis.layers.probe.score_se`)."""
    cca_ok = len(split.dev) >= 2 and len(split.test) >= 2
    row = {
        "layer": layer,
        "nu": nu(h, classes) if "nu" in which else np.nan,
        "cca": cca_score(h, classes, split=split) if "cca" in which and cca_ok else np.nan,
        "rank": rank_metric(h, classes) if "rank" in which else np.nan,
        "probe": np.nan,
        "probe_c": np.nan,
        "probe_se": np.nan,
    }
    probe = None
    if "probe" in which and folds is not None:
        probe = cv_predictions(h, raw, metric, folds, seed=seed)
        row.update(probe=probe.score, probe_c=probe.c, probe_se=probe.se)
    return row, probe


def _helper_row(layer: int, states: np.ndarray, *args) -> Row:
    """`layer_row` in a helper process: its states as sent (float32 or float64), made float64
    here exactly as this process would."""
    with blas_threads():
        return layer_row(layer, as_float64(states), *args)


def fit_probe(
    values: np.ndarray, labels: np.ndarray, metric: str, folds: np.ndarray, seed: int, threads: int
) -> tuple[ProbeCV, float]:
    """`cv_predictions` of one layer's probe rows on ``threads`` BLAS threads, and its seconds
    (the streamed route sends its probes here, to a helper: `analysis.layers.streamed`)."""
    start = time.perf_counter()
    with threadpool_limits(threads, user_api="blas"):
        probe = cv_predictions(as_float64(values), labels, metric, folds, seed=seed)
    return probe, time.perf_counter() - start


def _sendable(states) -> np.ndarray:
    """A layer's states as a numpy array in their own dtype (a torch tensor's numpy view)."""
    if hasattr(states, "detach"):  # a torch tensor (not imported here)
        states = states.detach().cpu().numpy()
    return np.asarray(states)


def _ready() -> int:
    return os.getpid()


def processes() -> int:
    """Processes that fit a table's layers: ``$TUNESCOPE_LAYER_PROCESSES``, else the usable
    cores up to `DEFAULT_MAX_PROCESSES` (each helper holds about 150 MB of imports; a table has
    7–25 layers, so more processes would each fit one or two)."""
    value = os.environ.get(PROCESSES_ENV, "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"{PROCESSES_ENV} must be a whole number (got {value!r}).") from None
    return min(usable_cores(), DEFAULT_MAX_PROCESSES)


# Which layers the last `layer_rows` call of this process fitted here and which in the helpers
# (for the bench's printout and the tests).
last_share: dict[str, list[int]] = {"here": [], "helpers": []}


class _DaemonProcess(multiprocessing.context.SpawnProcess):
    """A helper: spawned (no fork of a threaded process) and daemonic. At the exit of a process
    that multiprocessing started (a compute worker), multiprocessing joins that process's
    non-daemonic children *before* the threading shutdown that would stop their pool, so a
    plain pool's helpers would be waited for forever; daemonic ones are terminated instead
    (they hold nothing worth keeping)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.daemon = True


class _DaemonSpawn(multiprocessing.context.SpawnContext):
    Process = _DaemonProcess


_LOCK = threading.Lock()
_HELPERS: concurrent.futures.ProcessPoolExecutor | None = None
_SIZE = 0
_STARTED: list[concurrent.futures.Future] = []  # each helper's first job: its PID


def helpers(count: int) -> concurrent.futures.ProcessPoolExecutor:
    """This process's pool of ``count`` helper processes: all started at its creation (while
    ``__main__`` names no file: `analysis.children.plain_main`), then kept; a pool that broke,
    say a helper killed, is replaced."""
    global _HELPERS, _SIZE
    with _LOCK:
        broken = _HELPERS is not None and getattr(_HELPERS, "_broken", False)
        if _HELPERS is None or broken or count != _SIZE:
            if _HELPERS is not None:
                _HELPERS.shutdown(wait=False, cancel_futures=True)
            _HELPERS = concurrent.futures.ProcessPoolExecutor(
                count, _DaemonSpawn(), initializer=exit_with_parent, initargs=(os.getpid(),)
            )
            _SIZE = count
            with plain_main():  # each submit starts a process while none is idle
                _STARTED[:] = [_HELPERS.submit(_ready) for _ in range(count)]
        return _HELPERS


def start_helpers() -> list[int]:
    """Start the helpers now (each imports this module's numpy, scipy and scikit-learn) and wait
    until they are up: their PIDs (none when one process fits the layers)."""
    count = processes() - 1
    if count < 1:
        return []
    helpers(count)
    return [future.result() for future in list(_STARTED)]


def layer_rows(
    states: Sequence,
    arguments: tuple,
    *,
    done: Callable[[int, int], None] | None = None,
) -> list[Row]:
    """`layer_row` of every layer of ``states`` ((L+1, N, d), numpy or torch), in layer order:
    ``layer_row(layer, states[layer] as float64, *arguments)``, the layers shared between this
    process and `processes()` − 1 helper processes (`share_layers`); ``done(finished, total)``
    is called in this process as layers finish.
    """
    calls = [(layer, _sendable(states[layer]), *arguments) for layer in range(len(states))]
    work = len(states) * int(np.prod(states[0].shape))
    return share_layers(_helper_row, calls, work=work, done=done)


def share_layers(
    function: Callable,
    calls: Sequence[tuple],
    *,
    work: int,
    done: Callable[[int, int], None] | None = None,
) -> list:
    """``[function(*call) for call in calls]``, in order, the calls shared between this process
    and the helpers (module docstring): the helpers take them from the front, this process from
    the back, each call made once, in whichever process, with the same arguments. ``function``
    is a module-level function (helpers import it by name) that sets its own BLAS threads;
    ``work`` (numbers in all) below `PARALLEL_MIN_WORK` keeps every call here."""
    n_calls = len(calls)
    report = done or (lambda finished, total: None)
    out: list = [None] * n_calls
    claims: dict[int, concurrent.futures.Future] = {}
    if min(processes(), n_calls) >= 2 and work >= PARALLEL_MIN_WORK:
        try:
            pool = helpers(processes() - 1)
            for k, call in enumerate(calls):
                claims[k] = pool.submit(function, *call)
        except BrokenProcessPool:  # a helper died just now: this process makes every call
            for future in claims.values():
                future.cancel()
            claims = {}
    if not claims:
        for k, call in enumerate(calls):
            out[k] = function(*call)
            report(k + 1, n_calls)
        last_share.update(here=list(range(n_calls)), helpers=[])
        return out
    finished = 0
    try:
        for k in reversed(range(n_calls)):
            if not claims[k].cancel():
                break  # a helper has it, and every call before it
            del claims[k]
            out[k] = function(*calls[k])
            finished += 1
            report(finished + sum(f.done() for f in claims.values()), n_calls)
        pending = set(claims.values())
        while pending:
            ready, pending = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_COMPLETED
            )
            finished += len(ready)
            report(finished, n_calls)
        for k, future in claims.items():
            try:
                out[k] = future.result()
            except BrokenProcessPool:  # a helper died (killed, out of memory): made here
                out[k] = function(*calls[k])
    finally:
        for future in claims.values():
            future.cancel()
    last_share.update(here=sorted(set(range(n_calls)) - set(claims)), helpers=sorted(claims))
    return out


# -- the layer repeats' rows (`analysis.layers.repeats`) -------------------------------------------


def split_by_example(
    indices: np.ndarray, classes: np.ndarray, seed: int
) -> tuple[Split, np.ndarray]:
    """The train / dev / test split of a resample's rows, drawn over its distinct examples.

    indices: (N,) the resample (example index per row); classes: (N_total,) codes of every
    example. Returns (split over the rows 0..N−1, groups (N,): which distinct example each row
    copies). Every copy of an example lands in the part its example was drawn into.
    """
    distinct, groups = np.unique(indices, return_inverse=True)
    by_example = split_indices(classes[distinct], seed)
    part = np.zeros(len(distinct), dtype=np.int64)
    part[by_example.dev] = 1
    part[by_example.test] = 2
    row_part = part[groups]
    split = Split(*(np.flatnonzero(row_part == p) for p in range(3)))
    return split, groups


def resampled_row(
    h: np.ndarray,
    rows: np.ndarray,
    classes: np.ndarray,
    raw: np.ndarray,
    predictions: np.ndarray | None,
    metric: str,
    which: Sequence[str],
    split_seed: int,
) -> list[float]:
    """nu, cca, rank, probe of one layer on the rows ``rows`` (a resample, copies allowed, or a
    jackknife subsample); h: (N, d) the layer's states, classes / raw (N,), predictions (N,) the
    probe's out-of-fold predictions (None: no probe). CCA's split is drawn over the distinct
    examples (`split_by_example`)."""
    x = as_float64(h[rows])
    y = classes[rows]
    out = [np.nan] * 4
    if "nu" in which:
        out[0] = nu(x, y)
    if "cca" in which:
        split, _ = split_by_example(rows, classes, split_seed)
        if len(split.dev) >= 2 and len(split.test) >= 2:
            out[1] = cca_score(x, y, split=split)
    if "rank" in which:
        out[2] = rank_metric(x, y)
    if "probe" in which and predictions is not None and np.isfinite(predictions).all():
        out[3] = task_score(metric, raw[rows], predictions[rows].astype(raw.dtype, copy=False))
    return out


def resampled_rows(
    h: np.ndarray,
    draws: Sequence[tuple[np.ndarray, int]],
    classes: np.ndarray,
    raw: np.ndarray,
    predictions: np.ndarray | None,
    metric: str,
    which: Sequence[str],
) -> np.ndarray:
    """(len(draws), 4): `resampled_row` of one layer for each (rows, split seed) draw, on
    `blas_threads` (one call of `share_layers`)."""
    with blas_threads():
        return np.array(
            [
                resampled_row(h, rows, classes, raw, predictions, metric, which, split_seed)
                for rows, split_seed in draws
            ],
            dtype=np.float64,
        ).reshape(len(draws), 4)
