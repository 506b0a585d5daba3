"""Where the dashboard's heavy computations run: one flat pool of worker processes beside the
server (`analysis.compute.Workers`).

**Why.** Every session's script is a thread of the one server process: a computation run there
shares the interpreter lock with every session's script thread and its websocket traffic, and
most of its many small torch and numpy calls wait for that lock. In a process of its own a
computation has a core (and an interpreter) to itself; the server only draws.

**How.** `ui.memo.ComputeQueue` decides *when* a computation runs (one queue, first come, first
served by page view); this pool decides *where*:

- a whole computation (an extraction, the head statistics, one layer's held-out predictions)
  goes to one worker with `compute`, which waits for it in the calling script thread and draws
  the worker's progress there (Streamlit elements can only be drawn from the script's own
  thread); it runs in the server's workspace, and what it returns is small (a table) or nothing
  (the states go into the disk cache, and the server reads them from there, memory-mapped);
- a layer table or its repeats fan out over the pool, one task per layer (`executor`, which
  `ui.memo` installs around every computation: `analysis.compute.current`); each task reads its
  layer from the disk cache, memory-mapped, so no states travel through a pipe.

Workers are spawned, end with the server even when it is killed, and the first starts with the
server's first page, loading the sidebar's default model (`ui.loaders.warm_up`); the others start
once it is up (a start-up beside it would slow the first page's extraction). A worker still
warming up is idle: the first page's extraction waits for it rather than starting another from
nothing. A script stopped while its computation runs (a closed tab, a rerun) cancels it at its
next progress report; a worker that dies fails only the computations it ran, with a clear
message, and is replaced. ``$TUNESCOPE_PROCESSES`` (`analysis.compute.processes`) sets the
workers; ``1`` computes in the server's own script threads (the page tests' AppTest sets it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from analysis.compute import IN_PROCESS, Workers, processes
from analysis.progress import Progress


def enabled() -> bool:
    """Whether computations run in worker processes (`analysis.compute.processes` > 1)."""
    return processes() > 1


def _in_workspace(root: str, fn: Callable[..., Any], args: tuple, progress: Progress) -> Any:
    from analysis.workspace import Workspace

    with Workspace(Path(root)).active():
        return fn(*args, progress=progress)


class ComputePool(Workers):
    """`analysis.compute.Workers` whose `call` runs in the caller's workspace (the root goes with
    each call: a worker serves every workspace the server does)."""

    def call(self, fn: Callable[..., Any], *args: Any, progress: Progress | None = None) -> Any:
        from analysis.workspace import Workspace

        root = str(Workspace.current().root)
        return super().call(_in_workspace, root, fn, args, progress=progress)


_POOL: ComputePool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ComputePool:
    """The server's one compute pool, of `analysis.compute.processes` workers."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ComputePool(processes())
        return _POOL


def executor() -> Executor:
    """Where a computation's per-layer tasks run: the pool, or this process when it is off."""
    return pool() if enabled() else IN_PROCESS


def compute(fn: Callable[..., Any], *args: Any, progress: Progress | None = None) -> Any:
    """``fn(*args, progress=progress)`` in a worker process when `enabled`, else right here."""
    if enabled():
        return pool().call(fn, *args, progress=progress)
    return fn(*args, progress=progress)
