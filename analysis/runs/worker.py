"""The worker: a separate process that trains queued runs one after another on one device.

    python -m analysis.runs.worker [--device cuda:0] [--idle-timeout 120] [--cache DIR]

It lives outside the Streamlit script run, so page reruns, page switches and closing the tab do
not touch it. One worker per device: it holds an exclusive ``flock`` on
``<cache root>/worker-<device>.lock`` (which also names its pid). The OS drops the lock when the
process dies, however it dies, so a stale lock file of a dead worker is simply taken over.

Loop: reap runs left ``running`` by dead processes → claim the oldest queued run → train it with
`execute_run` → repeat; after ``idle_timeout`` seconds without work it exits (after one last look
at the queue with the lock released, so a run queued at that moment is never stranded).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.runs.db import RunsDB, db_path

if TYPE_CHECKING:
    from analysis.config import ModelSpec
    from analysis.finetune.config import FinetuneConfig
    from analysis.models import LoadedModel


PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_IDLE_TIMEOUT_S = 120.0


def default_idle_timeout() -> float:
    """Seconds an idle worker waits for work: ``$TUNESCOPE_WORKER_IDLE_S``, else 120."""
    return float(os.environ.get("TUNESCOPE_WORKER_IDLE_S", DEFAULT_IDLE_TIMEOUT_S))


def default_device() -> str:
    """``cuda:0`` when a GPU is visible, else ``cpu``."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def all_devices() -> list[str]:
    """One entry per GPU (``cuda:0``, ``cuda:1``…), or ``['cpu']``."""
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def lock_path(root: Path, device: str) -> Path:
    return Path(root) / f"worker-{device.replace(':', '')}.lock"


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [worker {os.getpid()}] {message}", flush=True)


class WorkerLock:
    """An exclusive, process-lifetime lock on ``path`` that records the holder's pid."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    @classmethod
    def adopt(cls, path: Path, fd: int) -> WorkerLock:
        """Take over a lock the parent acquired and handed down (``ensure_worker``)."""
        lock = cls(path)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # already ours: succeeds at once
        lock.fd = fd
        return lock

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def worker_pid(root: Path | str | None = None, device: str | None = None) -> int | None:
    """The pid of the live worker of ``device``, or None (no lock file, or nobody holds it)."""
    root = Path(root) if root is not None else db_path().parent
    path = lock_path(root, device or default_device())
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: a worker is alive
            text = path.read_text().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def worker_pids(root: Path | str | None = None) -> dict[str, int]:
    """Live workers by device, over every device of this machine."""
    pids = {device: worker_pid(root, device) for device in all_devices()}
    return {device: pid for device, pid in pids.items() if pid is not None}


def ensure_worker(
    root: Path | str | None = None,
    device: str | None = None,
    idle_timeout: float | None = None,
) -> int:
    """Start a detached worker for ``device`` unless one is alive; return its pid.

    The child gets its own session (no signal from the parent's terminal or Streamlit reaches it),
    the cache root through ``TUNESCOPE_CACHE``, and appends its output to
    ``<cache root>/worker.log``.
    """
    root = Path(root) if root is not None else db_path().parent
    device = device or default_device()
    idle_timeout = default_idle_timeout() if idle_timeout is None else idle_timeout
    # Take the device's lock here and hand it to the child: there is no moment in which a second
    # caller could see "no worker" while this one is still starting.
    lock = WorkerLock(lock_path(root, device))
    if not lock.acquire():
        pid = worker_pid(root, device)
        return pid if pid is not None else ensure_worker(root, device, idle_timeout)
    env = dict(os.environ)
    env["TUNESCOPE_CACHE"] = str(root.resolve())
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    command = [sys.executable, "-m", "analysis.runs.worker", "--device", device]
    command += ["--idle-timeout", str(idle_timeout), "--lock-fd", str(lock.fd)]
    try:
        with open(root / "worker.log", "ab") as log:
            child = subprocess.Popen(
                command,
                cwd=PROJECT_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lock.fd,),
            )
        os.ftruncate(lock.fd, 0)
        os.pwrite(lock.fd, f"{child.pid}\n".encode(), 0)
    except BaseException:
        lock.release()
        raise
    # Close our copy without unlocking: the child's copy of the descriptor keeps the lock.
    os.close(lock.fd)
    lock.fd = None
    return child.pid


def ensure_workers(root: Path | str | None = None, idle_timeout: float | None = None) -> list[int]:
    """One worker per device (every GPU, or the CPU)."""
    return [ensure_worker(root, device, idle_timeout) for device in all_devices()]


def _on_device(cfg: FinetuneConfig, device: str) -> FinetuneConfig:
    """The config to run on this worker's device (an explicit device in the config wins)."""
    has_device = dataclasses.is_dataclass(cfg) and "device" in {
        f.name for f in dataclasses.fields(cfg)
    }
    if has_device and getattr(cfg, "device", None) in (None, "", "auto"):
        return dataclasses.replace(cfg, device=device)
    return cfg


class _Models:
    """Keeps the last loaded model, so a sweep on one model loads it once."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.loaded: LoadedModel | None = None

    def get(self, spec: ModelSpec, device: str) -> LoadedModel:
        key = (spec, device)
        if key != self.key:
            from analysis.models import load_model

            self.loaded = None
            self.loaded = load_model(spec, device=device)
            self.key = key
        return self.loaded


def serve(
    root: Path | str | None = None,
    device: str | None = None,
    idle_timeout: float | None = None,
    poll_s: float = 0.5,
    lock_fd: int | None = None,
) -> int:
    """Work through the queue until idle for ``idle_timeout`` s. Returns how many runs it ran
    (or -1 when another worker already serves this device)."""
    from analysis.finetune.config import FinetuneConfig

    root = Path(root) if root is not None else db_path().parent
    device = device or default_device()
    idle_timeout = default_idle_timeout() if idle_timeout is None else idle_timeout
    if lock_fd is not None:
        lock = WorkerLock.adopt(lock_path(root, device), lock_fd)
    else:
        lock = WorkerLock(lock_path(root, device))
    if lock.fd is None and not lock.acquire():
        _log(f"another worker already serves {device}; exiting")
        return -1
    db = RunsDB(db_path(root))
    models = _Models()
    ran = 0
    _log(f"serving {device} from {db.path} (idle timeout {idle_timeout:g} s)")
    try:
        for run_id in db.reap_dead():
            _log(f"run {run_id} was left running by a dead process: marked failed")
        idle_since = time.monotonic()
        while True:
            run = db.claim_next(os.getpid(), device)
            if run is None:
                if time.monotonic() - idle_since < idle_timeout:
                    time.sleep(poll_s)
                    continue
                # Let go first, then look once more: a run queued meanwhile is either seen here
                # or finds no worker alive and starts a new one.
                lock.release()
                if db.list_runs(status="queued").empty or not lock.acquire():
                    break
                idle_since = time.monotonic()
                continue
            ran += 1
            _log(f"run {run['id']}: {run['method']} {run['label']} seed {run['seed']}")
            status = _run_one(db, run, device, models, FinetuneConfig)
            _log(f"run {run['id']}: {status}")
            idle_since = time.monotonic()
    finally:
        lock.release()
        _log(f"exiting after {ran} run(s)")
    return ran


def _run_one(db: RunsDB, run: dict[str, Any], device: str, models: _Models, config_cls) -> str:
    import json

    from analysis.runs.execute import describe_error, execute_run

    try:
        cfg = _on_device(config_cls.from_dict(json.loads(run["config_json"])), device)
        loaded = models.get(cfg.model, device)
    except Exception as exc:
        db.fail(run["id"], describe_error(exc, device))
        return "failed"
    return execute_run(db, run["id"], cfg, loaded=loaded, log=_log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.runs.worker", description=__doc__)
    parser.add_argument("--device", default=None, help="cpu, cuda:0… (default: first GPU or cpu)")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="exit after this many seconds with an empty queue",
    )
    parser.add_argument("--cache", default=None, help="cache folder (default: $TUNESCOPE_CACHE)")
    parser.add_argument("--lock-fd", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cache:
        os.environ["TUNESCOPE_CACHE"] = str(Path(args.cache).expanduser().resolve())

    def stop(signum, frame):  # SIGTERM: end like Ctrl-C would, recording the run as stopped
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    ran = serve(device=args.device, idle_timeout=args.idle_timeout, lock_fd=args.lock_fd)
    return 0 if ran >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
