"""Jobs and tasks for tests/test_compute.py and tests/ui/test_compute_pool.py: module-level, so
that a spawned worker can import them by name."""

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


def refuse(message: str, progress=None) -> None:
    raise ValueError(message)


def die(progress=None) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def spin(seconds: float, progress) -> str:
    """Reports progress every 0.05 s for ``seconds`` (a long computation)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        progress(0.5, "spinning")
        time.sleep(0.05)
    return "finished"


def pid_after(seconds: float) -> int:
    """A task: where it ran, after ``seconds``."""
    time.sleep(seconds)
    return os.getpid()


def threads_here() -> dict:
    """A task: the BLAS threads it runs with, and torch's inside a product's block (torch is
    imported by the task itself, as the probe's products import it)."""
    import torch
    from threadpoolctl import threadpool_info

    from analysis.compute import one_torch_thread

    blas = {info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}
    with one_torch_thread():
        inside = torch.get_num_threads()
    return {"blas": blas, "torch": inside, "pid": os.getpid()}
