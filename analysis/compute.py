"""Where computation runs: the cores, the threads and the child processes, behind one executor
interface (`concurrent.futures.Executor`).

Science code (the layer table, the streamed route, the repeats) cuts its work into calls of
module-level functions and hands them to `run_all`; it never starts a process or sets a thread
count. Two executors carry the calls out:

- `InProcess`: each call in the calling thread, one after the other.
- `Workers`: a flat pool of child processes. Each is a one-process executor of its own, so that a
  worker that dies (killed, out of memory) fails only the calls it was running (`WorkerDied`) and
  is replaced at the next call; calls wait in one queue and go to the first idle worker, so
  layers of unequal cost balance themselves. Workers are spawned (never forked from a threaded
  parent) without re-running the parent's script (`plain_main`), started when a call finds every
  started one busy (or ahead of need: `Workers.warm`), and end with the process that started
  them, even when it is killed (`exit_with_parent`).

Every call handed to `submit` runs on one BLAS thread and one torch thread (`one_thread`): the
cores are shared out by processes. A layer's work is many small fits and d × d products, which
extra threads slow down rather than speed up, and pinned to one thread a call gives the same
numbers bit for bit in whichever process runs it. Whole computations sent with `Workers.call`
(an extraction, the head statistics) keep the worker's own thread settings and report progress.

`current()` is the executor science code uses when it is given none: `InProcess` unless an entry
point installed another with `using` (the CLI: `default_executor()`; the dashboard: its compute
pool, `ui.compute_pool`). ``$TUNESCOPE_PROCESSES`` (`processes`) says how many processes compute
side by side; its default is every usable core, at most 8.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import multiprocessing as mp
import os
import sys
import threading
import time
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.progress import Cancelled, Progress, no_progress

PROCESSES_ENV = "TUNESCOPE_PROCESSES"
DEFAULT_MAX_PROCESSES = 8  # each worker holds its imports (≈ 150–400 MB); tables have ≤ 25 layers
MIN_WORK = 1_000_000  # numbers (examples × d × layers) below which starting processes costs more
POLL_S = 0.25  # how often a waiting caller hears of progress
PARENT_POLL_S = 1.0  # how often a worker checks that its parent lives
CANCEL_FLAGS = 4096  # cancel flags shared with the workers (calls in flight are far fewer)
CANCEL_WAIT_S = 30.0  # how long an abandoned call waits for its worker to stop

# Settings of earlier versions, each named in one note (the first two still read until removed).
EARLIER = {
    "TUNESCOPE_LAYER_PROCESSES": f"read as {PROCESSES_ENV}; set that instead.",
    "TUNESCOPE_COMPUTE_PROCESSES": f"0 is read as {PROCESSES_ENV}=1 (compute in the dashboard's "
    "own threads); set that instead.",
    **dict.fromkeys(
        ("TUNESCOPE_BLAS_THREADS", "TUNESCOPE_GRAM_THREADS", "TUNESCOPE_STREAM_OVERLAP"),
        f"no longer read: every task runs on one thread, and {PROCESSES_ENV} sets how many "
        "processes compute side by side.",
    ),
}
_NOTED: set[str] = set()


def usable_cores() -> int:
    """The CPU cores this process may run on, at least 1: its affinity where the OS says, at
    most its cgroup's CPU quota (a container limited to 2 CPUs sees every core of its host)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    count = len(cores) if cores else (os.cpu_count() or 1)
    quota = _cgroup_cpus()
    return max(1, min(count, quota) if quota else count)


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "<quota> <period>" or "max <period>"


def _cgroup_cpus() -> int | None:
    """The CPUs this process's cgroup may use (its quota over its period, rounded up), or None
    when it sets no quota (or has no cgroup v2 file)."""
    try:
        quota, period = Path(CGROUP_CPU_MAX).read_text(encoding="ascii").split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def processes() -> int:
    """How many processes compute side by side: ``$TUNESCOPE_PROCESSES``, else every usable core
    up to `DEFAULT_MAX_PROCESSES`. 1: no child processes, everything computes in the calling
    process (the dashboard in its own threads). A setting of an earlier version (`EARLIER`)
    gets a note."""
    for name, now in EARLIER.items():
        if os.environ.get(name, "").strip() and name not in _NOTED:
            _NOTED.add(name)
            warnings.warn(f"{name} is deprecated: {now}", FutureWarning, stacklevel=2)
    for name in (PROCESSES_ENV, "TUNESCOPE_LAYER_PROCESSES"):
        text = os.environ.get(name, "").strip()
        if text:
            try:
                return max(1, int(text))
            except ValueError:
                raise ValueError(f"{name} must be a whole number (got {text!r}).") from None
    old = os.environ.get("TUNESCOPE_COMPUTE_PROCESSES", "").strip().lower()
    if old in ("0", "false", "no", "off"):
        return 1
    return min(usable_cores(), DEFAULT_MAX_PROCESSES)


# --- threads ---------------------------------------------------------------------------------

_PINS = threading.Lock()


class _Pin:
    """A process-wide thread count held at one by blocks of several threads: the first to enter
    sets it, the last to leave restores it. ``pin()`` sets it and returns how to undo it, or None
    when it cannot yet (torch not imported): a later entry tries again."""

    def __init__(self, pin: Callable[[], Callable[[], None] | None]) -> None:
        self.pin, self.holders, self.undo = pin, 0, None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with _PINS:
            if self.undo is None:
                self.undo = self.pin()
            self.holders += 1
        try:
            yield
        finally:
            with _PINS:
                self.holders -= 1
                if self.holders == 0 and self.undo is not None:
                    self.undo()
                    self.undo = None


def _pin_blas() -> Callable[[], None]:
    import numpy  # noqa: F401  (its BLAS loaded, so that it is limited)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1, user_api="blas").restore_original_limits


def _pin_torch() -> Callable[[], None] | None:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "set_num_threads"):
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return lambda: torch.set_num_threads(before)


_BLAS, _TORCH = _Pin(_pin_blas), _Pin(_pin_torch)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One BLAS thread (threadpoolctl) and one torch thread for the block: how every task runs.

    The settings are process-wide, so blocks of several threads share them (`_Pin`). BLAS
    libraries loaded inside the block are not limited (threadpoolctl sees loaded ones only):
    numpy's is loaded first, and a task's module imports the others (scipy's) before it runs.
    torch imported inside the block is pinned by the next `one_torch_thread`, which its products
    enter.
    """
    with _BLAS.held(), _TORCH.held():
        yield


def one_torch_thread() -> contextlib.AbstractContextManager[None]:
    """torch's intra-op threads at one for the block (cheap enough to wrap each product): the
    probe's products (`analysis.layers.logistic_batch`) round the same in every process only on
    one thread."""
    return _TORCH.held()


# --- child processes ---------------------------------------------------------------------------


def exit_with_parent(parent: int) -> None:
    """End this process (exit status 0, no clean-up: it has nothing to save) once ``parent``, the
    PID of the process that started it, is gone.

    A `ProcessPoolExecutor` worker waits on its call queue forever: when its parent is killed
    (SIGKILL, the OOM killer) nothing tells it. A daemon thread watches the parent instead.
    (Linux's ``PR_SET_PDEATHSIG`` fires when the parent *thread* exits, which for an executor
    started from a worker thread is too early.)
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="tunescope-parent-watch", daemon=True).start()


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def plain_main() -> Iterator[None]:
    """Start processes while ``__main__`` names no file.

    Streamlit runs app.py (and each page) as the module ``__main__``, and a spawned process
    re-imports its parent's ``__main__`` file before anything else (multiprocessing's spawn
    "prepare" step): every worker would run the whole app again, bare. So workers start while a
    plain module stands in for ``__main__``, one thread at a time (two overlapping swaps would
    restore each other's stand-in).
    """
    with _MAIN_LOCK:
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved


# --- the worker's side -------------------------------------------------------------------------

_progress_queue: Any = None  # this worker's progress queue (set by `_init_worker`)
_cancel: Any = None  # the cancel flags shared by every worker, one per call id modulo CANCEL_FLAGS


def _init_worker(progress_queue: Any, cancel: Any, parent: int) -> None:
    global _progress_queue, _cancel
    _progress_queue, _cancel = progress_queue, cancel
    exit_with_parent(parent)
    # Idle OpenMP threads sleep instead of spinning: a spinning worker takes the core its parent
    # (the dashboard's server) draws with.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _task(fn: Callable[..., Any], args: tuple) -> Any:
    with one_thread():
        return fn(*args)


def _call(call_id: int, fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args, progress=…)``: progress goes to the parent, which cancels through the flags."""
    last = [0.0]

    def progress(fraction: float, message: str = "") -> None:
        if _cancel[call_id % CANCEL_FLAGS]:
            raise Cancelled("The page that asked for this computation went away.")
        now = time.monotonic()
        if now - last[0] >= POLL_S / 2 or fraction >= 1.0:  # no flood of tiny updates
            last[0] = now
            _progress_queue.put((call_id, float(fraction), str(message)))

    progress(0.0)  # (cancelled before it started: stop here)
    return fn(*args, progress=progress)


# --- the executors -----------------------------------------------------------------------------


class WorkerDied(RuntimeError):
    """The worker process running a computation ended before it returned."""


DIED = (
    "The computation's worker process ended before it finished (killed, or out of memory?). "
    "Nothing it computed was kept; try again, or with fewer examples."
)


class InProcess(Executor):
    """Each call runs at its `submit`, in the calling thread, on one thread (`one_thread`)."""

    count = 1

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        future.set_running_or_notify_cancel()
        try:
            with one_thread():
                future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise  # a stop (KeyboardInterrupt, Streamlit's) is not the call's result
            future.set_exception(exc)
        return future


IN_PROCESS = InProcess()


@dataclass(eq=False)
class _Worker:
    """One worker process (a one-process executor) and its own progress queue: a process killed
    while it writes to a queue leaves the queue's lock held, so no two workers share one."""

    executor: ProcessPoolExecutor
    progress: Any
    ready: Future  # its first job: its start-up (`Workers.warm`), or a bare ping
    busy: bool = False


@dataclass
class _Pending:
    future: Future
    runner: Callable[..., Any]  # `_task` or `_call`, run in the worker
    args: tuple


class Workers(Executor):
    """A flat pool of ``count`` worker processes (module docstring).

    ``submit(fn, *args)`` runs ``fn(*args)`` in a worker on one thread; `call` runs a whole
    computation there with progress. ``min_work``: `run_all` keeps batches smaller than this
    (numbers in all) in the calling process, where starting workers would cost more than it saves.
    """

    def __init__(self, count: int, *, min_work: int = 0) -> None:
        if count < 1:
            raise ValueError(f"A pool of workers needs at least one worker (got {count}).")
        self.count, self.min_work = count, min_work
        self.completed = 0  # calls and tasks that returned (tests, logs)
        self._cond = threading.Condition()
        self._workers: list[_Worker] = []
        self._pending: deque[_Pending] = deque()
        self._rest: tuple | None = None  # (fn, *args) every further worker starts with (`warm`)
        self._fill = False  # start the rest now: the first worker is warm
        self._closed = False
        self._cancel: Any = None
        self._latest: dict[int, tuple[float, str]] = {}
        self._ids = itertools.count()
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="tunescope-workers", daemon=True
        )
        self._dispatcher.start()

    @property
    def started(self) -> int:
        """Worker processes started and not ended."""
        with self._cond:
            return len(self._workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if kwargs:
            raise TypeError("Workers.submit takes positional arguments only.")
        return self._enqueue(_Pending(Future(), _task, (fn, args)))

    def warm(self, first: tuple | None = None, rest: tuple | None = None) -> None:
        """Start the first worker now with ``first`` = (fn, *args) as its start-up, without
        waiting; once that is done, the other ``count − 1`` with ``rest`` when given (a second
        start beside the first's would slow the first). A worker still warming is idle: a call
        made meanwhile waits for it rather than starting another from nothing."""
        with self._cond:
            if self._workers:
                return
            self._rest = rest
            ready = self._start(first).ready
        ready.add_done_callback(lambda _: self._warmed())

    def call(self, fn: Callable[..., Any], *args: Any, progress: Progress | None = None) -> Any:
        """``fn(*args, progress=…)`` in a worker; ``progress`` is called here, in the calling
        thread, with the worker's latest progress every `POLL_S` seconds. An exception from it
        (the page went away) cancels the call: the worker raises `Cancelled` at its next progress
        report, and this returns once it has (at most `CANCEL_WAIT_S`)."""
        progress = progress or no_progress
        call_id = next(self._ids)
        with self._cond:
            self._latest[call_id] = (0.0, "")
            self._shared_flags()[call_id % CANCEL_FLAGS] = 0
        future = None
        try:
            future = self._enqueue(_Pending(Future(), _call, (call_id, fn, args)))
            shown = None
            while True:
                try:
                    return future.result(timeout=POLL_S)
                except TimeoutError:
                    pass
                with self._cond:
                    latest = self._latest.get(call_id)
                if latest is not None and latest != shown:
                    shown = latest
                progress(*(shown or (0.0, "")))  # also where a stopped caller leaves the wait
        except BaseException:
            if future is not None and not future.done():
                self._cancel[call_id % CANCEL_FLAGS] = 1
                if not future.cancel():
                    with contextlib.suppress(BaseException):
                        future.result(timeout=CANCEL_WAIT_S)
            raise
        finally:
            with self._cond:
                self._latest.pop(call_id, None)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            workers, self._workers = self._workers, []
            pending, self._pending = list(self._pending), deque()
            self._cond.notify_all()
        for item in pending:
            item.future.cancel()
        for worker in workers:
            worker.executor.shutdown(wait=wait, cancel_futures=True)
            worker.progress.close()

    # --- dispatch: every submit to a worker happens in the dispatcher thread ---------------------

    def _enqueue(self, item: _Pending) -> Future:
        with self._cond:
            if self._closed:
                raise RuntimeError("This pool of workers was shut down.")
            self._pending.append(item)
            self._cond.notify_all()
        return item.future

    def _dispatch_loop(self) -> None:
        # A worker's executor calls our done-callbacks from its own threads, some with its
        # locks held, so submitting from a callback could deadlock: this thread does it.
        with self._cond:
            while not self._closed:
                self._prestart()
                while self._pending and self._dispatch_one():
                    pass
                self._cond.wait()

    def _prestart(self) -> None:
        while self._fill and self._rest is not None and len(self._workers) < self.count:
            self._start(self._rest)

    def _dispatch_one(self) -> bool:
        """Send the next pending item to an idle worker (starting one if allowed); False when
        every worker is busy. Called with the lock held."""
        worker = next((w for w in self._workers if not w.busy), None)
        if worker is None:
            if len(self._workers) >= self.count:
                return False
            worker = self._start()
        item = self._pending.popleft()
        if not item.future.set_running_or_notify_cancel():
            return True  # cancelled while it waited
        try:
            inner = worker.executor.submit(item.runner, *item.args)
        except BrokenProcessPool:  # it died while idle: nothing ran there; a new one takes it
            self._drop(worker)
            worker = self._start()
            inner = worker.executor.submit(item.runner, *item.args)
        worker.busy = True
        inner.add_done_callback(lambda done: self._finished(worker, item.future, done))
        return True

    def _finished(self, worker: _Worker, outer: Future, inner: Future) -> None:
        if inner.cancelled():
            outer.cancel() or outer.set_exception(WorkerDied(DIED))
        elif isinstance(inner.exception(), BrokenProcessPool):
            outer.set_exception(WorkerDied(DIED))
        elif inner.exception() is not None:
            outer.set_exception(inner.exception())
        else:
            outer.set_result(inner.result())
        with self._cond:
            worker.busy = False
            if isinstance(inner.exception(), BrokenProcessPool) or inner.cancelled():
                self._drop(worker)
            else:
                self.completed += 1
            self._cond.notify_all()

    def _start(self, job: tuple | None = None) -> _Worker:
        """A new worker (lock held): its process spawns now, ``job`` = (fn, *args) first."""
        context = mp.get_context("spawn")
        progress = context.Queue()
        threading.Thread(
            target=self._read_progress, args=(progress,), daemon=True,
            name="tunescope-worker-progress",
        ).start()  # fmt: skip
        executor = ProcessPoolExecutor(
            1,
            mp_context=context,
            initializer=_init_worker,
            initargs=(progress, self._shared_flags(), os.getpid()),
        )
        with plain_main():  # the process starts with this first submit
            ready = executor.submit(*(job or (_ready,)))
        worker = _Worker(executor, progress, ready)
        self._workers.append(worker)
        return worker

    def _warmed(self) -> None:
        with self._cond:
            self._fill = True
            self._cond.notify_all()

    def _shared_flags(self) -> Any:
        if self._cancel is None:  # one writer per flag at a time: no lock
            self._cancel = mp.get_context("spawn").Array("b", CANCEL_FLAGS, lock=False)
        return self._cancel

    def _drop(self, worker: _Worker) -> None:
        """Forget a worker whose process died (lock held; a later call starts a new one)."""
        if worker in self._workers:
            self._workers.remove(worker)
            worker.executor.shutdown(wait=False, cancel_futures=True)
            worker.progress.close()

    def _read_progress(self, source: Any) -> None:
        while True:
            try:
                call_id, fraction, message = source.get()
            except (EOFError, OSError, ValueError):  # the queue was closed
                return
            with self._cond:
                if call_id in self._latest:
                    self._latest[call_id] = (fraction, message)


def _ready() -> int:
    return os.getpid()


# --- which executor, and running a batch of calls ----------------------------------------------

_CURRENT: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "tunescope_executor", default=None
)


def current() -> Executor:
    """The executor installed by `using` in this context, else `InProcess`."""
    return _CURRENT.get() or IN_PROCESS


@contextlib.contextmanager
def using(executor: Executor) -> Iterator[Executor]:
    """Make ``executor`` the `current` one for the block (this thread's context)."""
    token = _CURRENT.set(executor)
    try:
        yield executor
    finally:
        _CURRENT.reset(token)


def default_executor() -> Executor:
    """What an entry point (the CLI) computes with: `Workers` of `processes()` processes, which
    keep batches under `MIN_WORK` here, or `InProcess` when that is 1. Shut it down when done
    (a ``with`` block)."""
    count = processes()
    return Workers(count, min_work=MIN_WORK) if count > 1 else InProcess()


def run_all(
    fn: Callable[..., Any],
    calls: Sequence[tuple],
    *,
    executor: Executor | None = None,
    work: int = 0,
    done: Callable[[int, int], None] | None = None,
) -> list:
    """``[fn(*call) for call in calls]``, in order, each call a task of ``executor`` (default
    `current()`); ``work`` (numbers in all) below the executor's ``min_work`` keeps them here.

    ``done(finished, total)`` is called here as calls finish (and every `POLL_S` while waiting);
    an exception from it, or from a call, cancels the calls not yet started and is raised.
    ``fn`` is a module-level function (a worker imports it by name) of picklable arguments.
    """
    executor = executor or current()
    report = done or (lambda finished, total: None)
    total = len(calls)
    if isinstance(executor, InProcess) or work < getattr(executor, "min_work", 0):
        out = []
        for call in calls:  # one at a time: progress after each, a stop between any two
            out.append(IN_PROCESS.submit(fn, *call).result())
            report(len(out), total)
        return out
    futures = [executor.submit(fn, *call) for call in calls]
    try:
        pending, finished = set(futures), 0
        while pending:
            ready, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in ready:
                future.result()  # the first error, raised here
            finished += len(ready)
            report(finished, total)
        return [future.result() for future in futures]
    finally:
        for future in futures:
            future.cancel()
