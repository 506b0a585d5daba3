"""Helper processes: started without re-running a script (`plain_main`), and ended with the
process that started them (`exit_with_parent`).

A `concurrent.futures.ProcessPoolExecutor` worker waits on its call queue forever: when its
parent is killed (SIGKILL, the OOM killer), nothing tells it, and it lingers holding its memory.
`exit_with_parent`, run in the worker's initializer, watches the parent from a daemon thread and
ends the worker within ``POLL_S`` of its parent's death. (Linux's ``PR_SET_PDEATHSIG`` would do it
without a thread, but only on Linux, and it fires when the parent *thread* exits, which for an
executor started from a worker thread is too early.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import types
from collections.abc import Iterator

POLL_S = 1.0


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS says), at least 1."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return max(1, len(cores) if cores else (os.cpu_count() or 1))


def exit_with_parent(parent: int) -> None:
    """End this process (exit status 0, no clean-up: it has nothing to save) once ``parent``,
    the PID of the process that started it, is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="tunescope-parent-watch", daemon=True).start()


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def plain_main() -> Iterator[None]:
    """Start processes while ``__main__`` names no file.

    Streamlit runs app.py (and each page) as the module ``__main__``, and a spawned process
    re-imports its parent's ``__main__`` file before anything else (multiprocessing's spawn
    "prepare" step): every helper would run the whole app again, bare. So helpers are started (a
    `ProcessPoolExecutor` starts a process at a submit) while a plain module stands in for
    ``__main__``, one thread at a time (`_MAIN_LOCK`: two overlapping swaps would restore each
    other's stand-in). A session whose script run starts in that instant sets its own
    ``__main__``, which the restore then replaces; nothing reads it back (each run sets its own
    again).
    """
    with _MAIN_LOCK:
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
