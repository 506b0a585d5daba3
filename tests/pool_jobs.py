"""Jobs for tests/ui/test_compute_pool.py: module-level, so that a spawned compute worker can
import them by name."""

from __future__ import annotations

import os
import signal
import time


def count_to(n: int, progress) -> dict:
    """Reports progress n times, a little apart, and returns where it ran."""
    from analysis.workspace import Workspace

    for i in range(n):
        progress((i + 1) / n, f"step {i + 1} of {n}")
        time.sleep(0.2)
    return {"pid": os.getpid(), "root": str(Workspace.current().root)}


def refuse(message: str, progress) -> None:
    raise ValueError(message)


def die(progress) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def spin(seconds: float, progress) -> str:
    """Reports progress every 0.05 s for ``seconds`` (a long computation)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        progress(0.5, "spinning")
        time.sleep(0.05)
    return "finished"


def layer_helpers(progress) -> dict:
    """The worker's layer-process setting and its layer-row helpers' PIDs (started by now, or
    started here: `analysis.layers.rows.start_helpers` waits until they are up)."""
    from analysis.layers import rows

    return {"setting": os.environ.get(rows.PROCESSES_ENV), "helpers": rows.start_helpers()}
