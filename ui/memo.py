"""A process-wide memo for results computed with a progress bar, served first come, first served.

Why not st.cache_resource / st.cache_data: elements drawn inside a cached function (our progress
bar) are replayed on every hit, and st.cache_data pickles what it returns (tensors of hidden
states, here). This is a small, thread-safe LRU shared by every session of the process; on a miss
it draws one st.progress bar, passes its callback to the computation, and removes the bar.

**A class on one server.** Every session's script runs in its own thread of the one server
process. Left alone, thirty students opening thirty different views start thirty computations at
once, which share the cores and all finish together, minutes later. So every computation here
takes a turn in one process-wide `ComputeQueue`: at most ``slots`` run at once (`default_slots`:
one per compute worker, at least two), each with the compute pool as its executor (its layer
tables fan out there: `ui.compute_pool`); the rest wait in the order their page views started (a
view's later computations do not queue behind views opened after it), and each waiting page says
how many computations are ahead of its own. A view asked for by several sessions at once is
computed once: the later ones wait for the first one's result (`ProgressMemo.get`) instead of
queueing a copy. ``$TUNESCOPE_COMPUTE_LOG`` names a file that gets a tab-separated line per
event: the kind (``view``: a script run started; ``drawn``: it ended, its page drawn — a page
that stops early logs none; ``asked``: a page asked for a computation that no one has;
``computed``, ``loaded`` (read from the disk cache: nothing computed), ``shared`` or ``hit``: how
it was served; ``failed``: it raised, or its page went away), the seconds it took (a
computation's without its wait for a turn; ``drawn``: the whole run's), when (Unix time; for
``computed``, when it ended), the label, and the session (a short tag of Streamlit's session id,
``-`` outside one). `bench/bench_class.py` reads it: a session's first ``view`` is when its page
reached the server, so the server's part of each wait can be told from the browser's.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import streamlit as st

from analysis.compute import processes, using
from analysis.progress import Progress
from analysis.workspace import Workspace
from ui import compute_pool

T = TypeVar("T")
SLOTS_ENV = "TUNESCOPE_COMPUTE_SLOTS"  # an earlier setting, still read (with a note)
LOG_ENV = "TUNESCOPE_COMPUTE_LOG"
# How often a waiting page redraws its place in the queue. Each redraw is also where Streamlit
# stops the script of a session that closed its tab or reran, which then leaves the queue.
WAIT_REFRESH_S = 1.0
# After a page view's computation ends, its next one (the page asks for the metrics right after
# the states, say) has this long to claim the slot before views that started later may take it.
# Without it a view would go to the back of the queue between any two of its computations.
FOLLOW_ON_S = 0.5


def default_slots() -> int:
    """Computations that run at once: one per compute process (`analysis.compute.processes`), at
    least two (a computation waiting on one worker, an extraction, leaves the others idle for a
    second one). ``$TUNESCOPE_COMPUTE_SLOTS``, an earlier setting, is still read, with a note."""
    text = os.environ.get(SLOTS_ENV, "").strip()
    if text:
        warnings.warn(
            f"{SLOTS_ENV} is deprecated: TUNESCOPE_PROCESSES sets the compute workers, and the "
            "slots follow them.", FutureWarning, stacklevel=2,
        )  # fmt: skip
        try:
            slots = int(text)
        except ValueError:
            slots = 0
        if slots < 1:
            raise ValueError(f"{SLOTS_ENV} must be a whole number ≥ 1 (got {text!r}).")
        return slots
    return max(2, processes())


class ComputeQueue:
    """First come, first served: at most ``slots`` computations run at once, process-wide.

    A thread that already holds a turn (a computation that asks for another one inside it) goes
    straight on, so nested computations never wait for themselves.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"A compute queue needs at least one slot (got {slots}).")
        self.slots = slots
        self._cond = threading.Condition()
        self._waiting: list[tuple[float, int]] = []  # (priority, ticket), kept sorted
        self._order = itertools.count()  # tickets and priorities: one increasing count
        self._running = 0
        self._local = threading.local()
        self._follow_on: tuple[float, float] | None = None  # (priority, until when)

    def next_priority(self) -> float:
        """A priority behind everything that has asked so far."""
        return float(next(self._order))

    def ahead_of(self, entry: tuple[float, int]) -> int:
        """Computations running or waiting before ``entry`` (call with the lock held)."""
        return self._running + bisect.bisect_left(self._waiting, entry)

    def _held_for_follow_on(self, entry: tuple[float, int]) -> float:
        """Seconds ``entry`` must still leave the slot to the view that just finished a
        computation (0: it need not). Call with the lock held."""
        if self._follow_on is None:
            return 0.0
        priority, until = self._follow_on
        left = until - time.monotonic()
        if left <= 0 or entry[0] <= priority:
            if left <= 0:
                self._follow_on = None
            return 0.0
        return left

    @property
    def busy(self) -> tuple[int, int]:
        """(running, waiting) right now."""
        with self._cond:
            return self._running, len(self._waiting)

    @contextmanager
    def turn(
        self, on_wait: Callable[[int], None] = lambda ahead: None, priority: float | None = None
    ) -> Iterator[None]:
        """Wait for this thread's turn, then hold a slot for the ``with`` body.

        Turns go by ``priority`` (lower first), then by arrival; without one, by arrival alone.
        Pages pass the start of their script run (`run_priority`), so that the computations of
        one page view follow each other instead of queueing behind every view opened since.

        on_wait(ahead) is called while waiting, every `WAIT_REFRESH_S` seconds and whenever the
        number of computations ahead changes; an exception from it (Streamlit stopping the
        script) leaves the queue.
        """
        if getattr(self._local, "depth", 0):
            self._local.depth += 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        with self._cond:
            ticket = next(self._order)
            entry = (float(ticket) if priority is None else priority, ticket)
            bisect.insort(self._waiting, entry)
        started = False
        try:
            last, shown_at = -1, 0.0
            while True:
                with self._cond:
                    held = self._held_for_follow_on(entry)
                    if not held and self._waiting[0] == entry and self._running < self.slots:
                        self._waiting.pop(0)
                        self._running += 1
                        started = True
                        self._cond.notify_all()  # the next in line may fit in a free slot too
                        break
                    ahead = self.ahead_of(entry) + int(held)
                    if ahead == last and time.monotonic() - shown_at < WAIT_REFRESH_S:
                        self._cond.wait(min(WAIT_REFRESH_S, held or WAIT_REFRESH_S))
                        continue
                on_wait(ahead)
                last, shown_at = ahead, time.monotonic()
            self._local.depth = 1
            yield
        finally:
            with self._cond:
                if started:
                    self._running -= 1
                    self._local.depth = 0
                    if priority is not None and self._running == self.slots - 1:  # the last slot
                        self._follow_on = (priority, time.monotonic() + FOLLOW_ON_S)
                else:
                    self._waiting.remove(entry)
                self._cond.notify_all()


QUEUE = ComputeQueue(default_slots())
_PRIORITY = "compute_priority"
_STARTED = "compute_run_started"


def start_run() -> None:
    """Called at the top of every script run (app.py): this run's computations queue by when it
    started (`ComputeQueue.turn`)."""
    st.session_state[_PRIORITY] = QUEUE.next_priority()
    st.session_state[_STARTED] = (time.perf_counter(), time.thread_time())
    _log("view", "script run", 0.0)


def end_run(page: str) -> None:
    """Called when a script run has drawn its page (app.py): logs ``drawn`` with the run's
    seconds — the server's whole part of showing ``page`` — and, in its label, the CPU seconds
    the run's own thread used (what its wall time is on a machine it shares with nothing)."""
    started = st.session_state.get(_STARTED)
    if started is not None:
        wall, cpu = started
        spent = time.thread_time() - cpu
        _log("drawn", f"{page or 'home'} (cpu {spent:.3f} s)", time.perf_counter() - wall)


def run_priority() -> float | None:
    """The current script run's place in the queue (None outside a page)."""
    try:
        return st.session_state.get(_PRIORITY)
    except Exception:  # no session (a bare call, a test)
        return None


@contextmanager
def queued() -> Iterator[None]:
    """A turn in the process-wide queue for a computation that draws nothing (st.cache_data
    bodies), at the current page's priority."""
    with QUEUE.turn(priority=run_priority()):
        yield


def _log(kind: str, label: str, seconds: float) -> None:
    path = os.environ.get(LOG_ENV)
    if path:  # one short line, appended: safe from several threads on Linux
        line = f"{kind}\t{seconds:.3f}\t{time.time():.3f}\t{label}\t{_session_tag()}\n"
        with open(path, "a", encoding="utf-8") as log:
            log.write(line)


def _session_tag() -> str:
    """Eight hex digits naming the current Streamlit session (``-`` outside one)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is None:
        return "-"
    return hashlib.blake2s(ctx.session_id.encode(), digest_size=4).hexdigest()


def waiting_text(label: str, ahead: int) -> str:
    """What a page shows while its computation waits for a turn."""
    if ahead <= 0:
        return f"{label}: starting…"
    ones = "computation is" if ahead == 1 else "computations are"
    return (
        f"{label}: waiting for a turn — {ahead:,} {ones} ahead of yours (first come, first served)"
    )


class ProgressMemo(Generic[T]):
    def __init__(self, max_entries: int, queue: ComputeQueue | None = None) -> None:
        self.max_entries = max_entries
        self.queue = queue or QUEUE
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._running: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()

    def get(
        self, key: Hashable, label: str, compute: Callable[[Progress], T], later: bool = False,
        served: Callable[[T], bool] | None = None,
    ) -> T:  # fmt: skip
        """The value for ``key``, computing it as ``compute(progress)`` under a bar on a miss.

        When another session is computing the same key, wait for its result rather than compute
        it again (and compute it here if that one failed). ``later``: a computation that adds to
        a figure already shown (the layer repeats' bands) queues by when it is asked for, behind
        the views opened before then, instead of by its own view's start: in a class every
        session's first figure comes before anyone's refinements. ``served(value)``: whether
        ``compute`` only read the value from the disk cache (logged ``loaded``, not ``computed``).

        Values are kept per workspace: a value computed for one cache folder says nothing of
        what another holds (a lesson's "prepared" reads the disk cache it was prepared into)."""
        key = (str(Workspace.current().root), key)
        bar = None
        try:
            while True:
                with self._lock:
                    if key in self._items:
                        self._items.move_to_end(key)
                        value = self._items[key]
                        shared = bar is not None
                        break
                    other = self._running.get(key)
                    if other is None:
                        self._running[key] = threading.Event()
                        shared = None
                        break
                if bar is None:
                    bar = st.progress(0.0, text=f"{label}: being computed for another session…")
                while not other.wait(WAIT_REFRESH_S):
                    bar.progress(0.0, text=f"{label}: being computed for another session…")
            if shared is not None:
                _log("shared" if shared else "hit", label, 0.0)
                return value
            priority = self.queue.next_priority() if later else run_priority()
            return self._compute(key, label, compute, bar, priority, served)
        finally:
            if bar is not None:
                bar.empty()

    def _compute(
        self, key: Hashable, label: str, compute: Callable[[Progress], T], bar,
        priority: float | None, served: Callable[[T], bool] | None = None,
    ) -> T:  # fmt: skip
        bar = bar or st.progress(0.0, text=label)
        _log("asked", label, 0.0)
        clock = time.perf_counter()
        try:
            with self.queue.turn(
                lambda ahead: bar.progress(0.0, text=waiting_text(label, ahead)), priority
            ):
                clock = time.perf_counter()  # the computation's own time, without the wait
                with using(compute_pool.executor()):  # its layer tasks go to the compute pool
                    value = compute(
                        lambda f, m="": bar.progress(min(max(f, 0.0), 1.0), text=f"{label}: {m}")
                    )
                from_disk = served is not None and served(value)
                _log("loaded" if from_disk else "computed", label, time.perf_counter() - clock)
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.max_entries:
                    self._items.popitem(last=False)
            return value
        except BaseException:
            _log("failed", label, time.perf_counter() - clock)  # raised, or its page went away
            raise
        finally:
            with self._lock:
                self._running.pop(key).set()  # waiters look again: a value, or their own turn
            bar.empty()  # a failed computation leaves its error message, not a half-full bar
