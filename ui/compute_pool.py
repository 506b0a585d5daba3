"""Where the dashboard's heavy computations run: worker processes beside the server.

**Why.** Every session's script is a thread of the one server process. With a class of 30
sessions open, one extraction that takes 1.2–3.9 s alone took 34.6 s while the server process
used about half a core (`bench/bench_class.py`, issue 22): the computation shared the
interpreter lock with 30 script threads and their websocket traffic, and most of its many small
torch and numpy calls wait for that lock. In a process of its own a computation has a core (and
an interpreter) to itself; the server only draws.

**How.** `ComputePool.call(fn, *args, progress=…)` runs ``fn(*args, progress=…)`` in one of
``workers`` processes (the compute queue's slots: `ui.memo.ComputeQueue` still decides *when*
each computation runs; the pool only decides *where*) and waits for it in the calling script
thread, which keeps drawing the worker's progress bar (Streamlit elements can only be drawn from
the script's own thread). Progress travels through one `multiprocessing` queue tagged with a
call id. The jobs are module-level functions taking picklable settings (configs, seeds); a job
computes through the disk cache, so what it returns is small (a table, statistics) or nothing
(the hidden states: the server then reads them from the cache, memory-mapped, instead of being
sent gigabytes through a pipe).

- Workers start with ``spawn`` (the server is multithreaded; a fork would copy its held locks)
  and then live as long as the server. The first starts with the server's first page (`warm_up`)
  and loads the sidebar's default model; each further one only when a computation finds every
  started worker busy (up to ``workers``); a worker still starting up is not busy, so the first
  page's computation waits for the rest of that start-up instead of starting a second worker
  from nothing (`ComputePool`). Jobs are the functions of `ui.jobs`, which imports no Streamlit.
  Why not all at once: on this project's 2-core machine
  a second worker's start-up (its imports and model, ≈ 4 s of CPU) beside the first made a lone
  newcomer's first Layers figure 12.4–12.7 s instead of 10.2–10.6 s (`bench_first_figure.py`, two
  slots vs one, side by side). Each worker loads a model once (`worker_model`) and works in the
  server's workspace (the root goes with each call).
- A script stopped while its computation runs (a closed tab, a rerun) cancels it, as Streamlit
  stops an in-process computation at its next progress call: the worker raises `Cancelled` at
  its next progress report (shared cancel flags), and the slot is free again once it has; the
  cache publishes only whole entries, so nothing half-written is kept.
- A worker that dies (killed, out of memory) fails only the computations it ran, with a clear
  message; the pool is rebuilt for the next one.
- An exception inside a job (bad input: a missing column, one class only) comes back as itself,
  with its message, as it would in-process.

``$TUNESCOPE_COMPUTE_PROCESSES``: ``1`` (default) runs computations in the workers, ``0`` in the
server's own script threads (the page tests' AppTest, which drives one page at a time in one
process, sets it).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.children import exit_with_parent, plain_main, usable_cores
from analysis.progress import Cancelled, Progress, no_progress

ENV = "TUNESCOPE_COMPUTE_PROCESSES"
# = analysis.layers.rows.PROCESSES_ENV (not imported here: that module loads scikit-learn)
LAYER_PROCESSES_ENV = "TUNESCOPE_LAYER_PROCESSES"
POLL_S = 0.25  # how often a waiting script thread redraws its computation's progress
CANCEL_FLAGS = 4096  # cancel flags shared with the workers (calls in flight are far fewer)
CANCEL_WAIT_S = 30.0  # how long an abandoned call waits for its worker to stop


def enabled() -> bool:
    """Whether computations run in worker processes (``$TUNESCOPE_COMPUTE_PROCESSES``, default on)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class WorkerDied(RuntimeError):
    """The worker process running a computation ended before it returned."""


# --- the worker's side ---------------------------------------------------------------------------

_progress_queue: Any = None  # the worker's end of the progress queue (set by `_init_worker`)
_cancel: Any = None  # the shared cancel flags, one per call id modulo CANCEL_FLAGS


def _init_worker(progress_queue: Any, cancel: Any, server: int, layer_processes: int) -> None:
    global _progress_queue, _cancel
    _progress_queue, _cancel = progress_queue, cancel
    exit_with_parent(server)  # a killed server leaves no idle worker behind
    os.environ.setdefault(LAYER_PROCESSES_ENV, str(layer_processes))
    # Idle OpenMP threads sleep instead of spinning (as ./tasks.sh sets it): a spinning worker
    # would take the core the server draws with.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _run(
    call_id: int, root: str, fn: Callable[..., Any], args: tuple, processes: int | None = None
) -> Any:
    """One computation in a worker: ``fn(*args, progress=…)`` in the workspace ``root``, its
    layer tables on ``processes`` processes (None: as the worker's environment says)."""
    from analysis.workspace import Workspace

    if processes is not None:
        os.environ[LAYER_PROCESSES_ENV] = str(processes)

    last = [0.0]

    def progress(fraction: float, message: str = "") -> None:
        if _cancel[call_id % CANCEL_FLAGS]:
            raise Cancelled("The page that asked for this computation went away.")
        now = time.monotonic()
        if now - last[0] >= POLL_S / 2 or fraction >= 1.0:  # no flood of tiny updates
            last[0] = now
            _progress_queue.put((call_id, float(fraction), str(message)))

    progress(0.0)  # (cancelled before it started: stop here)
    with Workspace(Path(root)).active():
        return fn(*args, progress=progress)


def _warm(model: str | None = None) -> None:
    """A worker's start-up: the imports every computation needs (torch, transformers,
    scikit-learn) and the sidebar's default model, a few seconds paid once, before the first
    page asks (a model that does not load is left to that page's own clear message).

    What the first page asks for first is an extraction, so its imports and the model come
    first; the layer table's (scikit-learn, scipy, pandas: 0.8 s) then load in a thread of this
    worker, beside that extraction (whose torch kernels leave the interpreter free), instead of
    before it. A job that imports them meanwhile waits for that import to finish. That thread
    then starts the worker's layer helpers (`analysis.layers.rows.start_helpers`: the processes
    a layer table shares its layers with, `layer_processes`), so the first table finds them up."""
    import analysis.extract
    import analysis.heads.collect  # noqa: F401

    if model:
        with contextlib.suppress(Exception):
            _model(model, False)
    # Not a daemon: a worker's exit waits for this import (≤ 3 s) rather than finalising the
    # interpreter in the middle of it.
    threading.Thread(target=_import_table, name="tunescope-warm-imports").start()


def _import_table() -> None:
    import analysis.layers.table  # noqa: F401
    from analysis.layers.rows import start_helpers

    with contextlib.suppress(Exception):  # (a table then fits its layers here alone)
        start_helpers()


def call_layer_processes(share: int, alone: bool) -> int | None:
    """Processes one call's layer tables may use: the worker's ``share`` while no other worker
    computes, else 1. A lone newcomer's table then uses both cores of a 2-core machine, while in
    a class (every worker busy) the helpers would only take CPU from the server that draws every
    session's page. With helpers in every call, a class of 30 on this 2-core machine had 6 of 30
    sessions time out and its figures served at a median 76.9 s (`bench/bench_class.py`; last
    round, without helpers, on a quieter machine: none and 38.9 s). None where
    ``$TUNESCOPE_LAYER_PROCESSES`` is set: the user's setting holds in every call."""
    if os.environ.get(LAYER_PROCESSES_ENV, "").strip():
        return None
    return share if alone else 1


def layer_processes(workers: int) -> int:
    """Processes each worker's layer tables fit layers in (`analysis.layers.rows`): its share
    of the cores, at least 2, so a lone table uses two cores even where the slots could use
    every core between them; ``$TUNESCOPE_LAYER_PROCESSES`` overrides it."""
    cores = usable_cores()
    return min(max(2, cores // max(1, workers)), cores)


@functools.lru_cache(maxsize=2)
def _model(name: str, trust_remote_code: bool):
    from analysis.config import ModelSpec
    from analysis.models import load_model

    return load_model(ModelSpec(name, trust_remote_code=trust_remote_code))


def worker_model(spec):
    """The model this process has loaded for ``spec`` (loaded once per worker; in-process calls
    get the server's shared model instead, `ui.loaders.get_model`)."""
    return _model(spec.name, spec.trust_remote_code)


# --- the server's side ---------------------------------------------------------------------------


@dataclass
class _Worker:
    """One worker process (a single-process executor), its progress queue, and the calls it has
    in flight. The queue is the worker's own: a process killed while it writes there (the
    out-of-memory killer, a user's kill) leaves the queue's write lock held, and a queue shared
    with the next worker hung that worker at its exit (seen in the tests)."""

    executor: ProcessPoolExecutor
    progress: Any
    in_flight: int = 0
    layer_processes: int = 1  # processes its layer tables may use while no other worker computes


class ComputePool:
    """Worker processes for the dashboard's computations (module docstring).

    Each worker is a one-process executor of its own, so that the pool, not the executor,
    decides which worker a call goes to: a worker with nothing in flight (one still warming up
    counts: the call waits behind its start-up), else a new worker while fewer than ``workers``
    run, else the least busy. One executor for all workers would start a second process for a
    call made while the first is still warming up: measured on the first Layers figure of a
    fresh dashboard, that second worker's own imports and model load made the extraction take
    9.2–10.1 s instead of 3.8 s.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"A compute pool needs at least one worker (got {workers}).")
        self.workers = workers
        self._lock = threading.Lock()
        self._started: list[_Worker] = []
        self._cancel: Any = None
        self._latest: dict[int, tuple[float, str]] = {}
        self._ids = itertools.count()
        self.completed = 0  # calls that returned (tests, logs)

    @property
    def started(self) -> int:
        """Worker processes started and not ended."""
        with self._lock:
            return len(self._started)

    def _new_worker(self, model: str | None = None) -> _Worker:
        """Start a worker (under ``self._lock``): its process spawns now, with ``_warm(model)``
        (the common imports, and ``model`` when one is given) as its first job."""
        context = mp.get_context("spawn")
        if self._cancel is None:  # shared by every worker (no lock: one writer per flag at a time)
            self._cancel = context.Array("b", CANCEL_FLAGS, lock=False)
        progress = context.Queue()
        threading.Thread(
            target=self._read_progress, args=(progress,), daemon=True,
            name="tunescope-compute-progress",
        ).start()  # fmt: skip
        # Only the first worker keeps layer helpers: a further one runs beside it, and its
        # helpers would hold their memory (≈ 200 MB each) for the rare moment it is alone.
        share = layer_processes(self.workers) if not self._started else 1
        executor = ProcessPoolExecutor(
            1,
            mp_context=context,
            initializer=_init_worker,
            initargs=(progress, self._cancel, os.getpid(), share),
        )
        with plain_main():  # the process starts with this first submit
            executor.submit(_warm, model)
        worker = _Worker(executor, progress, layer_processes=share)
        self._started.append(worker)
        return worker

    def _claim(self) -> tuple[_Worker, int | None]:
        """The worker for the next call (class docstring), its in-flight count raised, and the
        processes this call's layer tables may use (`call_layer_processes`)."""
        with self._lock:
            idle = [w for w in self._started if w.in_flight == 0]
            if idle:
                worker = idle[0]
            elif len(self._started) < self.workers:
                worker = self._new_worker()
            else:
                worker = min(self._started, key=lambda w: w.in_flight)
            alone = all(w.in_flight == 0 for w in self._started if w is not worker)
            worker.in_flight += 1
            return worker, call_layer_processes(worker.layer_processes, alone)

    def warm(self, model: str | None = None) -> None:
        """Start the first worker now, loading ``model``, without waiting (the first page's
        computation then finds it ready, or waits for the rest of its start-up)."""
        with self._lock:
            if not self._started:
                self._new_worker(model)

    def _read_progress(self, source: Any) -> None:
        while True:
            try:
                call_id, fraction, message = source.get()
            except (EOFError, OSError, ValueError):  # the queue was closed (shutdown)
                return
            with self._lock:
                if call_id in self._latest:
                    self._latest[call_id] = (fraction, message)

    def call(self, fn: Callable[..., Any], *args: Any, progress: Progress | None = None) -> Any:
        """``fn(*args, progress=…)`` in a worker; the caller's ``progress`` is called here, in
        the calling thread, with the worker's latest progress every `POLL_S` seconds."""
        from analysis.workspace import Workspace

        progress = progress or no_progress
        call_id = next(self._ids)
        with self._lock:
            self._latest[call_id] = (0.0, "")
        shown = future = None
        worker, processes = self._claim()
        try:
            cancel = self._cancel
            cancel[call_id % CANCEL_FLAGS] = 0
            root = str(Workspace.current().root)
            try:
                future = worker.executor.submit(_run, call_id, root, fn, args, processes)
            except BrokenProcessPool:  # its process died while idle: nothing of this call ran
                self._drop(worker)
                worker, processes = self._claim()
                future = worker.executor.submit(_run, call_id, root, fn, args, processes)
            while True:
                try:
                    value = future.result(timeout=POLL_S)
                except TimeoutError:
                    pass
                except BrokenProcessPool as exc:
                    self._drop(worker)
                    raise WorkerDied(
                        "The computation's worker process ended before it finished (killed, or "
                        "out of memory?). Nothing it computed was kept; try again, or with "
                        "fewer examples."
                    ) from exc
                else:
                    with self._lock:
                        self.completed += 1
                    return value
                with self._lock:
                    latest = self._latest.get(call_id)
                if latest is not None and latest != shown:
                    shown = latest
                    progress(*latest)
                else:
                    progress(*(shown or (0.0, "")))  # where a stopped script leaves the wait
        except BaseException:
            if future is not None and not future.done():  # abandoned: the script was stopped
                self._abandon(future, cancel, call_id)
            raise
        finally:
            with self._lock:
                self._latest.pop(call_id, None)
                worker.in_flight -= 1

    @staticmethod
    def _abandon(future: Future, cancel: Any, call_id: int) -> None:
        """Stop the computation of a page that went away (a closed tab, a rerun), as the
        in-process computation stops at its next progress call: the worker raises `Cancelled`
        at its next progress report, and its slot is free again when it has. Nothing it was
        writing is kept (the cache publishes only whole entries)."""
        cancel[call_id % CANCEL_FLAGS] = 1
        if future.cancel():  # it had not started
            return
        with contextlib.suppress(BaseException):
            future.result(timeout=CANCEL_WAIT_S)

    def _drop(self, broken: _Worker) -> None:
        """Forget a worker whose process died (a later call starts a new one); only once, when
        several of its callers see it broken."""
        with self._lock:
            if broken not in self._started:
                return
            self._started.remove(broken)
        broken.executor.shutdown(wait=False, cancel_futures=True)
        broken.progress.close()

    def shutdown(self) -> None:
        """Stop the workers (tests; the server's workers end with it)."""
        with self._lock:
            started, self._started = self._started, []
        for worker in started:
            worker.executor.shutdown(wait=True, cancel_futures=True)
            worker.progress.close()


_POOL: ComputePool | None = None
_POOL_LOCK = threading.Lock()
_WARMED = False


def pool() -> ComputePool:
    """The server's one compute pool, with as many workers as the compute queue has slots."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from ui.memo import QUEUE

            _POOL = ComputePool(QUEUE.slots)
        return _POOL


def warm_up(model: str | None = None) -> None:
    """Start the server's compute workers in the background, each loading ``model`` (the
    sidebar's default), and warm this process's model classes too (app.py calls it on every
    script run; only the first call does anything). Measured: the first Layers figure of a
    fresh dashboard came 12.4 s after the click, 7.8 s of it the extraction, which paid two
    first model loads (2.3 s each, mostly transformers' imports) one after the other."""
    global _WARMED
    with _POOL_LOCK:
        if _WARMED:
            return
        _WARMED = True
    if enabled():
        pool().warm(model)
        if model:
            threading.Thread(
                target=_warm_here, args=(model,), daemon=True, name=_WARM_THREAD
            ).start()


_WARM_THREAD = "tunescope-warm-model"


class _NoContextWarning(logging.Filter):
    """Drops Streamlit's "missing ScriptRunContext" warning for the warm-up thread, which uses
    the model cache outside any page on purpose (the warning is meant for threads that draw)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != _WARM_THREAD


def _warm_here(model: str) -> None:
    """Load ``model`` into this process's shared model cache (`ui.loaders.get_model`), so that
    the first page finds it there. That page does not wait for it to extract: its extraction
    goes to the worker while this load runs (`ui.loaders.get_states`)."""
    from analysis.config import ModelSpec
    from ui.loaders import get_model

    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        _NoContextWarning()
    )
    with contextlib.suppress(Exception):
        get_model(ModelSpec(model))


def compute(fn: Callable[..., Any], *args: Any, progress: Progress | None = None) -> Any:
    """``fn(*args, progress=progress)`` in a worker process when `enabled`, else right here."""
    if enabled():
        return pool().call(fn, *args, progress=progress)
    return fn(*args, progress=progress)
