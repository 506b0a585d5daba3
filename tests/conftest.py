from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny import make_tiny_model_dir  # noqa: E402

FAMILIES = ("bert", "roberta", "distilbert", "mpnet", "electra", "deberta-v2")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test writes its cache (and runs database) into its own temporary folder."""
    monkeypatch.setenv("TUNESCOPE_CACHE", str(tmp_path / "cache"))
    # A worker that a test starts goes away soon after its queue is empty.
    monkeypatch.setenv("TUNESCOPE_WORKER_IDLE_S", "2")
    # AppTest drives one page at a time in this process: its computations run here, not in
    # compute workers (tests/ui/test_compute_pool.py and the browser tests use the workers), and
    # a CLI command's layer tables too (tests/test_compute.py starts workers where it means to).
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "1")
    # The server's background preparation of the built-in lessons (the 12-layer model) is for a
    # real server; a test that wants it turns it on.
    monkeypatch.setenv("TUNESCOPE_PREPARE_LESSONS", "0")


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_bert_dir(tiny_root) -> Path:
    return make_tiny_model_dir("bert", tiny_root)


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_family_dir(request, tiny_root) -> tuple[str, Path]:
    return request.param, make_tiny_model_dir(request.param, tiny_root)


@pytest.fixture(scope="session", autouse=True)
def _few_threads():
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def stop_leftover_worker():
    """A failing test must not leave a worker training in the background."""
    yield
    from analysis.runs.worker import worker_pid

    pid = worker_pid(Path(os.environ["TUNESCOPE_CACHE"]), "cpu")
    if pid and pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
