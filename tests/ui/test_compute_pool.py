"""The dashboard's compute workers (ui/compute_pool.py, on analysis.compute.Workers): real spawned
processes."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from apptest_utils import errors, make_app, open_page
from pool_jobs import count_to, die, refuse, spin

from analysis.compute import WorkerDied
from analysis.workspace import Workspace
from ui.compute_pool import ComputePool


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


def test_a_worker_that_died_while_idle_is_replaced_at_the_next_call(pool):
    """Killed between computations (the out-of-memory killer, a user's kill): the next call
    runs in a new worker instead of failing on the dead one."""
    import signal

    first = pool.call(count_to, 1)["pid"]
    os.kill(first, signal.SIGKILL)
    time.sleep(1.0)  # the executor sees its process end
    again = pool.call(count_to, 1)["pid"]
    assert again not in (first, os.getpid())
    assert pool.started == 1


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


def test_a_call_made_while_the_first_worker_starts_up_waits_for_it(tmp_path):
    """Two slots, a call right after the warm-up (the worker still importing torch): it runs in
    that worker once it is up, and no second worker starts from nothing beside it."""
    workers = ComputePool(2)
    try:
        workers.warm()
        first = workers.call(count_to, 1)["pid"]
        assert workers.started == 1
        assert workers.call(count_to, 1)["pid"] == first
    finally:
        workers.shutdown()
    assert workers.started == 0


def test_a_layer_table_fans_out_over_the_workers_from_the_cache_file(tmp_path, monkeypatch):
    """The page's layer table on the pool: one task per layer, each worker reading its layers
    from the cache file (no states sent), both workers taking some; the very table the
    in-process route gives. Progress reaches the caller layer by layer."""
    import numpy as np

    from analysis.cache import DiskCache, TensorSpec
    from analysis.compute import IN_PROCESS, using
    from analysis.layers.table import layer_metrics

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    states = (rng.standard_normal((6, 400, 16)) + labels[:, None]).astype(np.float32)
    cache = DiskCache(tmp_path)

    def write(writer):
        for layer in range(6):
            writer.write("states", states[layer], 0, index=layer)
        return {}

    cache.get_or_write("states", {"r": 1}, {"states": TensorSpec("F32", states.shape, row_dim=1)},
                       write)  # fmt: skip
    stored = cache.stored("states", {"r": 1})["states"]
    workers = ComputePool(2)
    try:
        seen = []
        with using(workers):
            pooled = layer_metrics(stored, labels, progress=lambda f, m="": seen.append(m))
        assert workers.started == 2 and workers.completed == 6
        assert "6 of 6 layers done" in seen
        with using(IN_PROCESS):
            here = layer_metrics(states, labels)
        assert pooled.equals(here)
    finally:
        workers.shutdown()


def test_the_jobs_module_imports_no_streamlit():
    """A compute worker imports each job's module before it runs the job: `ui.jobs` must stay
    free of Streamlit (its import was 0.9 s of a worker's first job)."""
    import subprocess
    import sys

    code = "import sys, ui.jobs; print('streamlit' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert out.stdout.strip() == "False"


def test_the_warm_up_imports_what_the_pages_import():
    """A fresh server's first page of each kind must not pay for its imports (the Layers page's
    were 1 s of its first visit's CPU): the warm-up imports what every page script imports."""
    import subprocess
    import sys

    code = (
        "import sys; from ui.loaders import _import_pages; "
        "wanted = ('ui.layers.view', 'ui.heads.attention', 'ui.recommend.view', 'scipy.stats'); "
        "before = [m in sys.modules for m in wanted]; _import_pages(); "
        "print(before, [m in sys.modules for m in wanted])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert out.stdout.strip() == "[False, False, False, False] [True, True, True, True]"


def test_the_warm_up_threads_context_warning_is_dropped_and_no_other():
    import logging

    from ui.loaders import _WARM_THREAD, _NoContextWarning

    def record_from(name: str) -> logging.LogRecord:
        box = []
        thread = threading.Thread(
            target=lambda: box.append(
                logging.LogRecord("s", logging.WARNING, "", 0, "m", (), None)
            ),
            name=name,
        )
        thread.start()
        thread.join()
        return box[0]

    assert not _NoContextWarning().filter(record_from(_WARM_THREAD))
    assert _NoContextWarning().filter(record_from("ScriptRunner.scriptThread"))


def test_a_fresh_server_sends_the_extraction_before_loading_its_own_model(
    tiny_bert_dir, monkeypatch
):
    """With the workers on and the model not yet loaded here, the page's extraction goes to a
    worker first (the worker has the model), and this process loads its own after."""
    import ui.jobs
    import ui.loaders
    from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
    from ui.memo import ProgressMemo

    order = []
    monkeypatch.setattr(ui.loaders, "_LOADED", set())
    monkeypatch.setattr(ui.loaders, "_STATES", ProgressMemo(max_entries=6))
    monkeypatch.setattr(ui.loaders.compute_pool, "enabled", lambda: True)

    def compute(fn, cfg, progress=None):
        order.append(fn.__name__)
        fn(cfg, progress=progress or (lambda *a: None))  # here, in this process

    def loader(who: str):
        def load(spec):
            order.append(who)
            from analysis.models import load_model

            return load_model(spec)

        return load

    monkeypatch.setattr(ui.loaders.compute_pool, "compute", compute)
    monkeypatch.setattr(ui.jobs, "worker_model", loader("worker model"))
    monkeypatch.setattr(ui.loaders, "get_model", loader("server model"))
    cfg = ExtractConfig(ModelSpec(str(tiny_bert_dir)), DataSpec(), SampleSpec(n=12, seed=3))
    states = ui.loaders.get_states(cfg)
    assert order == ["extract_job", "worker model", "server model"]
    # Once this process has the model, it checks the cache itself: a hit sends nothing.
    order.clear()
    ui.loaders._LOADED.add((cfg.model.name, cfg.model.trust_remote_code))
    monkeypatch.setattr(ui.loaders, "_STATES", ProgressMemo(max_entries=6))  # not in memory
    assert ui.loaders.get_states(cfg).n == states.n == 12
    assert order == ["server model"]


def test_layers_page_through_the_workers_equals_the_in_process_page(tiny_bert_dir, monkeypatch):
    """The page's extraction in a compute worker, its layer table and repeats fanned out over the
    workers, give the very table the in-process route gives (and the workers' states land in the
    same cache)."""
    import ui.compute_pool
    import ui.loaders

    monkeypatch.setattr(ui.loaders, "_LOADED", set())  # a fresh server: the extraction first

    def table(processes: str):
        monkeypatch.setenv("TUNESCOPE_PROCESSES", processes)
        at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/layers.py")
        assert not errors(at)
        return at.dataframe[0].value

    try:
        through_workers = table("2")
        # the extraction, and a task per layer of the layer table and of its repeats, ran there
        assert ui.compute_pool._POOL is not None and ui.compute_pool._POOL.completed >= 1 + 2 * 3
        cache = Path(os.environ["TUNESCOPE_CACHE"])
        assert any(cache.rglob("*")), "the workers wrote no cache entry"
        monkeypatch.setenv("TUNESCOPE_CACHE", str(cache.parent / "elsewhere"))
        in_process = table("1")
    finally:
        if ui.compute_pool._POOL is not None:
            ui.compute_pool._POOL.shutdown()
            ui.compute_pool._POOL = None
    assert json.loads(through_workers.to_json()) == json.loads(in_process.to_json())


def test_a_second_worker_starts_only_when_a_computation_finds_the_first_busy(tmp_path):
    """Two slots: the warm-up starts one worker; a call while it is busy starts the second
    (a lone user's computations never pay a second start-up)."""

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


def test_a_model_that_does_not_load_gives_the_pages_message_through_the_workers(
    tmp_path, monkeypatch
):
    """A fresh server sends the extraction to a worker before loading the model itself: a model
    that cannot load then fails in the worker, and the page shows that failure's own message."""
    import ui.compute_pool
    import ui.loaders

    monkeypatch.setattr(ui.loaders, "_LOADED", set())
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "2")
    try:
        at = open_page(make_app(tmp_path / "no-such-model", monkeypatch), "views/layers.py")
        assert any("does not exist" in message for message in errors(at)), errors(at)
        assert not at.exception
    finally:
        if ui.compute_pool._POOL is not None:
            ui.compute_pool._POOL.shutdown()
            ui.compute_pool._POOL = None
