"""Where computation runs (analysis/compute.py): the settings, the thread pins, the two executors
and `run_all`, with real spawned worker processes."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pool_jobs import count_to, die, pid_after, refuse, threads_here

from analysis import compute

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def workers():
    pool = compute.Workers(2)
    yield pool
    pool.shutdown()


# --- the settings ------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    for name in (compute.PROCESSES_ENV, *compute.EARLIER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(compute, "_NOTED", set())


def test_the_process_count_setting(clean_env, monkeypatch):
    assert compute.processes() == min(compute.usable_cores(), compute.DEFAULT_MAX_PROCESSES)
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "3")
    assert compute.processes() == 3
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "0")
    assert compute.processes() == 1
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "many")
    with pytest.raises(ValueError, match="TUNESCOPE_PROCESSES must be a whole number"):
        compute.processes()


def test_usable_cores_are_the_affinity_at_most_the_cgroups_quota(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(compute, "CGROUP_CPU_MAX", str(cpu_max))
    assert compute.usable_cores() == 6  # no cgroup file: the affinity
    cpu_max.write_text("max 100000\n")
    assert compute.usable_cores() == 6  # no quota
    cpu_max.write_text("250000 100000\n")
    assert compute.usable_cores() == 3  # 2.5 CPUs: three cores busy part of the time
    cpu_max.write_text("5000 100000\n")
    assert compute.usable_cores() == 1
    cpu_max.write_text("900000 100000\n")
    assert compute.usable_cores() == 6  # a quota above the affinity: the affinity


def test_earlier_settings_are_read_with_a_note_or_named_as_ignored(clean_env, monkeypatch):
    monkeypatch.setenv("TUNESCOPE_LAYER_PROCESSES", "3")
    with pytest.warns(
        FutureWarning, match="TUNESCOPE_LAYER_PROCESSES is deprecated: read as TUNES"
    ):
        assert compute.processes() == 3
    monkeypatch.delenv("TUNESCOPE_LAYER_PROCESSES")
    monkeypatch.setenv("TUNESCOPE_COMPUTE_PROCESSES", "0")
    with pytest.warns(FutureWarning, match="TUNESCOPE_COMPUTE_PROCESSES is deprecated"):
        assert compute.processes() == 1
    monkeypatch.setenv("TUNESCOPE_GRAM_THREADS", "2")
    with pytest.warns(FutureWarning, match="TUNESCOPE_GRAM_THREADS is deprecated: no longer read"):
        compute.processes()
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "2")  # the new name wins
    assert compute.processes() == 2


def test_the_default_executor_follows_the_setting(clean_env, monkeypatch):
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "1")
    assert isinstance(compute.default_executor(), compute.InProcess)
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "3")
    with compute.default_executor() as executor:
        assert isinstance(executor, compute.Workers) and executor.count == 3
        assert executor.min_work == compute.MIN_WORK and executor.started == 0  # none yet


# --- threads -----------------------------------------------------------------------------------


def test_one_thread_pins_blas_and_torch_and_the_last_block_to_leave_restores_them():
    """Another thread's block ending inside this one's leaves the pins in place; this block's end
    restores them. (OpenBLAS raises its thread count again only from the thread that set it,
    here the main thread, as a worker's tasks run in its main thread.)"""
    import torch
    from threadpoolctl import threadpool_info

    def blas() -> set[int]:
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    torch.set_num_threads(2)
    before = blas()
    seen = []

    def other_block():
        with compute.one_thread():
            seen.append((blas(), torch.get_num_threads()))

    with compute.one_thread():
        assert blas() == {1} and torch.get_num_threads() == 1
        thread = threading.Thread(target=other_block)
        thread.start()
        thread.join()
        assert seen == [({1}, 1)]
        assert blas() == {1} and torch.get_num_threads() == 1  # still held by this block
    assert blas() == before and torch.get_num_threads() == 2
    with compute.one_torch_thread():
        assert torch.get_num_threads() == 1 and blas() == before
    assert torch.get_num_threads() == 2


# --- the executors -----------------------------------------------------------------------------


def test_in_process_runs_at_submit_on_one_thread_and_keeps_errors_in_the_future():
    import torch

    future = compute.IN_PROCESS.submit(threads_here)
    assert future.done() and future.result()["pid"] == os.getpid()
    assert future.result()["blas"] == {1} and future.result()["torch"] == 1
    assert torch.get_num_threads() != 1 or os.cpu_count() == 1  # restored
    failed = compute.IN_PROCESS.submit(refuse, "no")
    with pytest.raises(ValueError, match="no"):
        failed.result()


def test_workers_run_tasks_on_one_thread_in_other_processes_that_share_the_work(workers):
    out = compute.run_all(pid_after, [(0.5,)] * 4, executor=workers)
    assert os.getpid() not in out and len(set(out)) == 2  # both workers took tasks
    assert workers.started == 2 and workers.completed == 4
    where = workers.submit(threads_here).result()
    assert where["blas"] == {1} and where["torch"] == 1


def test_run_all_keeps_order_reports_progress_and_raises_a_calls_error(workers):
    seen = []
    out = compute.run_all(
        pid_after, [(0.3,), (0.0,), (0.1,)], executor=workers,
        done=lambda finished, total: seen.append((finished, total)),
    )  # fmt: skip
    assert len(out) == 3 and seen[-1] == (3, 3)
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(seen))
    with pytest.raises(ValueError, match="bad input"):
        compute.run_all(refuse, [("bad input",)], executor=workers)


def test_a_stop_from_the_progress_callback_cancels_the_calls_not_started(workers):
    class Stopped(Exception):
        pass

    def stop(finished, total):
        raise Stopped

    clock = time.monotonic()
    with pytest.raises(Stopped):
        compute.run_all(pid_after, [(1.0,)] * 12, executor=workers, done=stop)
    assert time.monotonic() - clock < 5  # not the 6 s the twelve would take on two workers
    time.sleep(1.5)
    assert workers.completed <= 4  # the two running (and at most two more) ran, not twelve


def test_small_work_stays_in_the_calling_process():
    pool = compute.Workers(2, min_work=1000)
    try:
        assert compute.run_all(pid_after, [(0,)], executor=pool, work=10) == [os.getpid()]
        assert pool.started == 0
        assert compute.run_all(pid_after, [(0,)], executor=pool, work=1000) != [os.getpid()]
    finally:
        pool.shutdown()


def test_the_current_executor_is_in_process_unless_one_is_installed(workers):
    assert compute.current() is compute.IN_PROCESS
    with compute.using(workers):
        assert compute.current() is workers
        assert compute.run_all(pid_after, [(0,)]) != [os.getpid()]
        seen = []
        thread = threading.Thread(target=lambda: seen.append(compute.current()))
        thread.start()
        thread.join()
        assert seen == [compute.IN_PROCESS]  # another thread: its own context
    assert compute.current() is compute.IN_PROCESS


def test_a_killed_worker_fails_only_its_own_calls_and_is_replaced(workers):
    """One worker killed mid-task: that task fails with `WorkerDied`; a task running beside it on
    the other worker finishes; the next call gets a new worker."""
    beside = workers.submit(pid_after, 2.0)
    time.sleep(0.3)
    with pytest.raises(compute.WorkerDied, match="ended before it finished"):
        workers.submit(die).result(timeout=60)
    assert beside.result(timeout=60) != os.getpid()
    assert compute.run_all(pid_after, [(0,)] * 2, executor=workers)
    assert workers.started == 2


def test_a_worker_that_died_while_idle_is_replaced_at_the_next_call():
    pool = compute.Workers(1)
    try:
        first = pool.submit(pid_after, 0).result()
        os.kill(first, signal.SIGKILL)
        time.sleep(1.0)  # the executor sees its process end
        again = pool.submit(pid_after, 0).result()
        assert again not in (first, os.getpid()) and pool.started == 1
    finally:
        pool.shutdown()


def test_a_call_relays_progress_and_its_error(workers):
    seen = []
    out = workers.call(count_to, 5, progress=lambda f, m="": seen.append((f, m)))
    assert out["pid"] != os.getpid()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and max(fractions) > 0
    assert any(m.startswith("step ") for _, m in seen)
    with pytest.raises(ValueError, match="one class"):
        workers.call(refuse, "one class")


def test_warm_starts_the_first_worker_and_the_others_once_it_is_up():
    pool = compute.Workers(2)
    try:
        pool.warm((pid_after, 1.0), (pid_after, 0))
        assert pool.started == 1  # the second waits for the first's start-up
        deadline = time.monotonic() + 60
        while pool.started < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.started == 2
    finally:
        pool.shutdown()


def test_workers_end_with_the_process_that_started_them(tmp_path):
    """A parent killed outright (SIGKILL: no clean-up runs) leaves no worker behind."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
        "from analysis import compute\n"
        "from pool_jobs import pid_after\n"
        "if __name__ == '__main__':\n"
        "    pool = compute.Workers(1)\n"
        "    print(pool.submit(pid_after, 0).result(), flush=True)\n"
        "    time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        os.kill(worker, 0)  # alive
    finally:
        parent.kill()
        parent.wait()
    if not _gone(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker outlived its parent by 10 s")
