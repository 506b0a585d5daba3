"""One local Ray cluster (2 CPUs) shared by every Ray test of the session, and the clean-up that
makes sure no Ray process outlives the tests."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest


def _descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, their children…) with its command line."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                with contextlib.suppress(OSError):
                    found[child] = (
                        (Path("/proc") / str(child) / "cmdline")
                        .read_bytes()
                        .decode(errors="replace")
                    )
                    frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    from analysis.runs.queue import pid_alive

    return pid_alive(pid)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> str:
    """The address of a local Ray cluster with 2 CPUs; this test process is connected to it.

    Ray's files go under the session's tmp folder (short name: Ray's socket paths must stay
    under the 107-byte limit), its dashboard is off and usage statistics are never sent.
    """
    import ray

    from analysis.runs.ray_executor import LOCAL_CLUSTER, connect

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    temp_dir = tmp_path_factory.mktemp("ray", numbered=True)
    connect(LOCAL_CLUSTER, num_cpus=2, temp_dir=str(temp_dir))
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ours = [pid for pid, cmd in _descendants(os.getpid()).items() if "ray" in cmd.lower()]
        ray.shutdown()
        # ray.shutdown() stops the processes this session started; make sure of it.
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in ours) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in ours:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stop_leftover_ray_worker():
    """A failing test must not leave a Ray worker (a driver process) behind."""
    yield
    from analysis.runs.worker import RAY, worker_pid

    pid = worker_pid(Path(os.environ["TUNESCOPE_CACHE"]), RAY)
    if pid and pid > 0 and pid != os.getpid():  # (a queue loop in a thread of this process)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
