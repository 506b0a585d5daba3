"""The dashboard's compute workers (ui/compute_pool.py): real spawned processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from apptest_utils import errors, make_app, open_page
from pool_jobs import count_to, die, refuse, spin

from analysis.workspace import Workspace
from ui.compute_pool import ComputePool, WorkerDied


@pytest.fixture
def pool():
    workers = ComputePool(1)
    yield workers
    workers.shutdown()


def test_a_job_runs_in_another_process_in_the_callers_workspace_with_its_progress(pool, tmp_path):
    seen = []
    with Workspace(tmp_path / "ws").active():
        out = pool.call(count_to, 6, progress=lambda f, m="": seen.append((f, m)))
    assert out["pid"] != os.getpid()
    assert Path(out["root"]) == (tmp_path / "ws").resolve()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and max(fractions) > 0  # relayed, in order
    assert any(m.startswith("step ") for _, m in seen)
    assert pool.call(count_to, 1)["pid"] == out["pid"]  # the worker lives on


def test_a_jobs_exception_comes_back_as_itself(pool):
    with pytest.raises(ValueError, match="only one class"):
        pool.call(refuse, "only one class in the sample")


def test_a_dead_worker_fails_its_job_clearly_and_the_pool_recovers(pool):
    with pytest.raises(WorkerDied, match="ended before it finished"):
        pool.call(die)
    assert pool.call(count_to, 1)["pid"] != os.getpid()


def test_a_page_that_goes_away_cancels_its_computation_and_frees_the_worker(pool):
    """Streamlit stops a script by raising from its next element call (our progress bar): the
    worker's computation stops too, at its next progress report, and the one worker is free."""

    class Stopped(Exception):
        pass

    calls = []

    def stop_on_second(fraction, message=""):
        calls.append(fraction)
        if len(calls) >= 2:
            raise Stopped

    with pytest.raises(Stopped):
        pool.call(spin, 60.0, progress=stop_on_second)
    clock = time.monotonic()
    assert pool.call(count_to, 1)["pid"] != os.getpid()  # not behind a minute of spinning
    assert time.monotonic() - clock < 10


def test_layers_page_through_the_workers_equals_the_in_process_page(tiny_bert_dir, monkeypatch):
    """The page's extraction, layer table and repeats computed in compute workers give the very
    table the in-process route gives (and the workers' states land in the same cache)."""
    import ui.compute_pool

    def table(processes: str):
        monkeypatch.setenv("TUNESCOPE_COMPUTE_PROCESSES", processes)
        at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/layers.py")
        assert not errors(at)
        return at.dataframe[0].value

    try:
        through_workers = table("1")
        # the extraction, the layer table and its repeats ran in the workers
        assert ui.compute_pool._POOL is not None and ui.compute_pool._POOL.completed >= 3
        cache = Path(os.environ["TUNESCOPE_CACHE"])
        assert any(cache.rglob("*")), "the workers wrote no cache entry"
        monkeypatch.setenv("TUNESCOPE_CACHE", str(cache.parent / "elsewhere"))
        in_process = table("0")
    finally:
        if ui.compute_pool._POOL is not None:
            ui.compute_pool._POOL.shutdown()
            ui.compute_pool._POOL = None
    assert json.loads(through_workers.to_json()) == json.loads(in_process.to_json())


def test_a_second_worker_starts_only_when_a_computation_finds_the_first_busy(tmp_path):
    """Two slots: the warm-up starts one worker; a call while it is busy starts the second
    (a lone user's computations never pay a second start-up)."""
    import threading

    workers = ComputePool(2)
    try:
        workers.warm()
        alone = {workers.call(count_to, 1)["pid"] for _ in range(3)}
        assert len(alone) == 1  # one after another: always the first worker
        pids = []
        with Workspace(tmp_path / "ws").active():
            threads = [
                threading.Thread(target=lambda: pids.append(workers.call(count_to, 8)["pid"]))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert len(set(pids)) == 2 and alone <= set(pids)  # at once: a second one joined
    finally:
        workers.shutdown()
