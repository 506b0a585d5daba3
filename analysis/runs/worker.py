"""The worker: a separate process that trains the queue of the runs database.

    python -m analysis.runs.worker [--device cuda:0] [--idle-timeout 120] [--cache DIR]
    python -m analysis.runs.worker --executor ray [--ray-address HOST:6379] [--ray-cpus-per-run 1]

It lives outside the Streamlit script run, so page reruns, page switches and closing the tab do
not touch it. One worker per device (``--executor local``, the default) and one Ray worker per
cache folder (``--executor ray``): each holds an exclusive ``flock`` on
``<cache root>/worker-<device or "ray">.lock`` (which also names its pid). The OS drops the lock
when the process dies, however it dies, so a stale lock file of a dead worker is simply taken over.

Loop (`serve`, the same for both executors): reap runs left ``running`` by dead processes → claim
queued runs while the runner has a free slot → let the runner train them → repeat; after
``idle_timeout`` seconds without work it exits (after one last look at the queue with the lock
released, so a run queued at that moment is never stranded). The runner says where runs train:
`LocalRunner` trains one at a time in this process with `execute_run`; `RayRunner`
(`analysis.runs.ray_executor`) keeps as many in flight on a Ray cluster as it has room for.

`ExecutorChoice` is what the page and the CLI pass to start the right workers.
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
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from analysis.compute import usable_cores
from analysis.config import help_of
from analysis.io import atomic_write_json, read_json
from analysis.runs.db import RunsDB
from analysis.runs.execute import ModelCache
from analysis.runs.executor import EXECUTORS, RAY, ExecutorChoice
from analysis.runs.ray_executor import (
    LOCAL_CLUSTER,
    RayRunner,
    check_address,
    read_status,
    resolve_address,
    write_status,
)
from analysis.runs.record import Run
from analysis.words import counted
from analysis.workspace import Workspace

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig


PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_IDLE_TIMEOUT_S = 120.0
RETAKE_PATIENCE_S = 2.0  # how long an idle worker tries to take its lock back (`_take_again`)


CPU_WORKERS_ENV = "TUNESCOPE_CPU_WORKERS"
SMALL_MODEL_PARAMS = 50_000_000  # up to this size, one CPU worker per core (bench_packing.py)


def estimate_params(spec) -> int | None:
    """An encoder's parameter count from its config alone (no weights loaded): embeddings plus
    L × (4 d² + 2 d · d_ff); None when the config cannot be read."""
    try:
        from transformers import AutoConfig

        from analysis.models import resolve_source

        source, _ = resolve_source(spec.name)
        config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
        d = getattr(config, "hidden_size", None) or config.dim
        layers = getattr(config, "num_hidden_layers", None) or config.n_layers
        ff = getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", 4 * d)
        vocab = getattr(config, "vocab_size", 0) + getattr(config, "max_position_embeddings", 0)
        return int(vocab * d + layers * (4 * d * d + 2 * d * ff))
    except Exception:  # any unreadable config: the safe packing (one worker, every core)
        return None


def queued_params(root: Path) -> int | None:
    """The largest `estimate_params` among the models of the queued runs at ``root`` (None: no
    queued run, or a size that cannot be read)."""
    from analysis.config import ModelSpec

    queued = RunsDB(Workspace(root)).list_runs(status="queued")
    if queued.empty or "model" not in queued:
        return None
    sizes = [estimate_params(ModelSpec(str(name))) for name in queued["model"].dropna().unique()]
    return None if not sizes or None in sizes else max(sizes)


def cpu_packing(
    n_params: int | None, cores: int | None = None, workers: int | None = None
) -> tuple[int, int]:
    """(CPU worker processes, torch threads each) for a queue of runs of ``n_params`` parameters.

    ``workers`` (the ``--cpu-workers`` choice), else ``$TUNESCOPE_CPU_WORKERS``, else: one worker
    per core for models up to `SMALL_MODEL_PARAMS` (a small encoder's small batches keep one core
    busy, not two; ``bench/bench_packing.py`` compares the packings), one worker with every core
    above (or when the size is unknown). The cores are shared out: threads = cores // workers, at
    least 1.
    """
    cores = cores or usable_cores()
    if workers is None and os.environ.get(CPU_WORKERS_ENV):
        workers = int(os.environ[CPU_WORKERS_ENV])
    if workers is None:
        workers = cores if n_params is not None and n_params <= SMALL_MODEL_PARAMS else 1
    workers = max(1, min(int(workers), cores))
    return workers, max(1, cores // workers)


def parallel_runs(choice: ExecutorChoice, n_params: int | None) -> int:
    """How many runs of ``n_params`` parameters ``choice`` trains at once on this machine: the
    CPU workers `start_workers` would start, else one (a GPU worker; a Ray cluster's slots are
    not known before it is asked)."""
    if choice.executor == RAY or (choice.device and choice.device != "cpu"):
        return 1
    if choice.device == "cpu" or all_devices() == ["cpu"]:
        return cpu_packing(n_params, workers=choice.cpu_workers)[0]
    return 1


def cpu_slot(k: int) -> str:
    """The device label of CPU worker k: ``cpu``, ``cpu-1``, ``cpu-2``…"""
    return "cpu" if k == 0 else f"cpu-{k}"


def torch_device(label: str) -> str:
    """The torch device of a worker's device label (every CPU slot trains on ``cpu``)."""
    return "cpu" if label.startswith("cpu") else label


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


def _root(root: Path | str | None) -> Path:
    """``root``, or the current workspace's."""
    return Workspace(root).root if root is not None else Workspace.current().root


def lock_path(root: Path, device: str) -> Path:
    return Workspace(root).lock(device)


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
    root = _root(root)
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
    """Live workers: by device over every device of this machine, and ``ray``."""
    slots = sorted(p.stem.removeprefix("worker-") for p in _root(root).glob("worker-cpu-*.lock"))
    pids = {name: worker_pid(root, name) for name in [*all_devices(), *slots, RAY]}
    return {name: pid for name, pid in pids.items() if pid is not None}


def _spawn(root: Path, lock: WorkerLock, arguments: list[str]) -> int:
    """Start ``python -m analysis.runs.worker ARGUMENTS`` detached, handing it ``lock``.

    The child gets its own session (no signal from the parent's terminal or Streamlit reaches it),
    the cache root through ``TUNESCOPE_CACHE``, and appends its output to
    ``<cache root>/worker.log``.
    """
    env = {**os.environ, **Workspace(root).environment()}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    command = [sys.executable, "-m", "analysis.runs.worker", *arguments]
    command += ["--lock-fd", str(lock.fd)]
    try:
        with open(Workspace(root).worker_log, "ab") as log:
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
    # Collect its exit status when it ends, so that a finished worker never stays <defunct>
    # under a long-lived parent (the app's server) until that stops.
    threading.Thread(target=child.wait, name=f"reap-worker-{child.pid}", daemon=True).start()
    return child.pid


def ensure_worker(
    root: Path | str | None = None,
    device: str | None = None,
    idle_timeout: float | None = None,
    threads: int | None = None,
) -> int:
    """Start a detached worker for ``device`` unless one is alive; return its pid. ``threads``:
    torch's CPU threads in it (default: torch's own choice, every core)."""
    root = _root(root)
    device = device or default_device()
    idle_timeout = default_idle_timeout() if idle_timeout is None else idle_timeout
    # Take the device's lock here and hand it to the child: there is no moment in which a second
    # caller could see "no worker" while this one is still starting.
    lock = WorkerLock(lock_path(root, device))
    if not lock.acquire():
        pid = worker_pid(root, device)
        return pid if pid is not None else ensure_worker(root, device, idle_timeout, threads)
    arguments = ["--device", device, "--idle-timeout", str(idle_timeout)]
    return _spawn(root, lock, arguments + (["--threads", str(threads)] if threads else []))


def ensure_workers(
    root: Path | str | None = None,
    idle_timeout: float | None = None,
    packing: tuple[int, int] = (1, 0),
) -> list[int]:
    """One worker per GPU; without GPUs, ``packing`` = (workers, threads each) CPU workers
    (`cpu_packing`; (1, 0): one worker, torch's default threads)."""
    devices = all_devices()
    if devices != ["cpu"]:
        return [ensure_worker(root, device, idle_timeout) for device in devices]
    workers, threads = packing
    if workers == 1 and threads >= usable_cores():
        threads = 0  # one worker with every core: torch's default
    return [ensure_worker(root, cpu_slot(k), idle_timeout, threads or None) for k in range(workers)]


def ensure_ray_worker(
    root: Path | str | None = None,
    address: str | None = None,
    cpus_per_run: int = 1,
    idle_timeout: float | None = None,
) -> int:
    """Start a detached Ray worker for ``address`` unless one is alive; return its pid.

    A live Ray worker serving another cluster is a ValueError: one queue, one Ray cluster at a
    time. (`check_executor` checks both that and the address before anything is queued; this
    check stays for a worker that started in between.)
    """
    root = _root(root)
    address = resolve_address(address)
    idle_timeout = default_idle_timeout() if idle_timeout is None else idle_timeout
    lock = WorkerLock(lock_path(root, RAY))
    if not lock.acquire():
        pid = worker_pid(root, RAY)
        if pid is None:
            return ensure_ray_worker(root, address, cpus_per_run, idle_timeout)
        _refuse_another_cluster(root, address, pid)
        return pid
    write_status(root, {"address": address, "state": "starting"})
    arguments = ["--executor", RAY, "--ray-address", address]
    arguments += ["--ray-cpus-per-run", str(int(cpus_per_run)), "--idle-timeout", str(idle_timeout)]
    return _spawn(root, lock, arguments)


def _serving_address(root: Path) -> str | None:
    status = read_status(root)
    return str(status["address"]) if status and status.get("address") else None


def _refuse_another_cluster(root: Path, address: str, pid: int | None = None) -> None:
    """A ValueError if a live Ray worker of the queue at ``root`` trains on a cluster other than
    ``address`` (resolved): one queue, one Ray cluster at a time."""
    pid = worker_pid(root, RAY) if pid is None else pid
    if pid is None:
        return
    serving = _serving_address(root)
    if serving is not None and serving != address:
        raise ValueError(
            f"A Ray worker (pid {pid}) already trains this queue on the Ray cluster at "
            f"{serving}; it exits once the queue is empty. Queue on that cluster, or wait."
        )


def check_executor(choice: ExecutorChoice, root: Path | str | None = None) -> None:
    """Before anything is queued or remembered: a ValueError (one sentence) if ``choice`` cannot
    work now: a live Ray worker of the queue at ``root`` (default: the cache root) trains on
    another cluster, or the Ray cluster is unreachable."""
    if choice.executor == RAY:
        root = _root(root)
        _refuse_another_cluster(root, resolve_address(choice.ray_address))
        check_address(choice.ray_address)


def start_workers(
    choice: ExecutorChoice,
    root: Path | str | None = None,
    idle_timeout: float | None = None,
    n_params: int | None = None,
) -> str:
    """Start the workers ``choice`` needs (unless alive) and remember ``choice`` (`last_choice`);
    returns one line saying which. Without GPUs the local executor starts `cpu_packing`'s
    workers for runs of ``n_params`` parameters (default: the largest queued model's,
    `queued_params`; ``choice.cpu_workers`` overrides)."""
    root = _root(root)
    if choice.executor == RAY:
        address = resolve_address(choice.ray_address)
        pid = ensure_ray_worker(root, address, choice.cpus_per_run, idle_timeout)
        _remember(root, choice)  # only once a worker serves it: a refused choice is not kept
        where = "a local Ray cluster on this machine" if address == LOCAL_CLUSTER else address
        return f"Ray worker pid {pid}, on {where}"
    _remember(root, choice)
    if choice.device and choice.device != "cpu":
        pids = [ensure_worker(root, choice.device, idle_timeout)]
    elif choice.device == "cpu" or all_devices() == ["cpu"]:
        if n_params is None and choice.cpu_workers is None and not os.environ.get(CPU_WORKERS_ENV):
            n_params = queued_params(root)
        workers, threads = cpu_packing(n_params, workers=choice.cpu_workers)
        pids = ensure_workers(root, idle_timeout, (workers, threads))
        if workers > 1:
            workers_words = f"{counted(workers, 'CPU worker')} × {counted(threads, 'thread')}"
            return f"{workers_words}, pids {', '.join(map(str, pids))}"
    else:
        pids = ensure_workers(root, idle_timeout)
    return f"worker pid {', '.join(map(str, pids))}"


def _choice_file(root: Path) -> Path:
    return Path(root) / "executor.json"


def _remember(root: Path, choice: ExecutorChoice) -> None:
    atomic_write_json(_choice_file(root), dataclasses.asdict(choice))


def last_choice(root: Path | str | None = None) -> ExecutorChoice:
    """The choice runs were last queued with here (the local executor when none was recorded),
    so a queue left without a worker is picked up by the same kind of worker."""
    root = _root(root)
    path = _choice_file(root)
    if path.is_file():
        with contextlib.suppress(ValueError, TypeError):
            return ExecutorChoice(**read_json(path, "executor file"))
    return ExecutorChoice()


def _on_device(cfg: FinetuneConfig, device: str) -> FinetuneConfig:
    """The config to run on this worker's device (an explicit device in the config wins)."""
    has_device = dataclasses.is_dataclass(cfg) and "device" in {
        f.name for f in dataclasses.fields(cfg)
    }
    if has_device and getattr(cfg, "device", None) in (None, "", "auto"):
        return dataclasses.replace(cfg, device=device)
    return cfg


class LocalRunner:
    """Trains each claimed run here, to its end, before the next one is claimed."""

    def __init__(self, db: RunsDB, device: str) -> None:
        self.db, self.device_label = db, device
        self.models = ModelCache()

    def free_slots(self) -> int:
        return 1

    def busy(self) -> bool:
        return False

    def submit(self, run: Run) -> None:
        _log(f"run {run.id}: {run.method} {run.label} seed {run.seed}")
        status = _run_one(self.db, run, self.device_label, self.models)
        _log(f"run {run.id}: {status}")

    def pump(self, timeout: float) -> None:
        pass

    def close(self, reason: str | None = None) -> None:
        pass


def serve(
    root: Path | str | None = None,
    device: str | None = None,
    idle_timeout: float | None = None,
    poll_s: float = 0.5,
    lock_fd: int | None = None,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    cpus_per_run: int = 1,
) -> int:
    """Work through the queue until idle for ``idle_timeout`` s. Returns how many runs it
    claimed (or -1 when another worker already serves this device, or Ray, here).

    ``executor="ray"``: train on the Ray cluster at ``ray_address`` (`RayRunner`); an
    unreachable cluster is a `RayUnavailable` (a ValueError) before anything is claimed.
    """
    root = _root(root)
    if executor == RAY:
        device = RAY
    device = device or default_device()
    idle_timeout = default_idle_timeout() if idle_timeout is None else idle_timeout
    if lock_fd is not None:
        lock = WorkerLock.adopt(lock_path(root, device), lock_fd)
    else:
        lock = WorkerLock(lock_path(root, device))
    if lock.fd is None and not lock.acquire():
        _log(f"another worker already serves {device}; exiting")
        return -1
    ran = 0
    runner: LocalRunner | RayRunner | None = None
    try:
        db = RunsDB(Workspace(root))

        def start_runner() -> LocalRunner | RayRunner:
            if executor == RAY:
                return RayRunner(db, ray_address, cpus_per_run, log=_log, status_root=root)
            return LocalRunner(db, device)

        runner = start_runner()
        _log(f"serving {device} from {db.path} (idle timeout {idle_timeout:g} s)")
        for run_id in db.reap_dead():
            _log(f"run {run_id} was left running by a dead process: marked failed")
        idle_since = time.monotonic()
        while True:
            claimed = False
            while runner.free_slots() > 0:
                row = db.claim_next(os.getpid(), runner.device_label)
                if row is None:
                    break
                run = Run.from_row(row)
                ran += 1
                claimed = True
                runner.submit(run)
            if runner.busy():
                runner.pump(poll_s)
                idle_since = time.monotonic()
                continue
            if claimed:
                idle_since = time.monotonic()
                continue
            if time.monotonic() - idle_since < idle_timeout:
                time.sleep(poll_s)
                continue
            # Close down while still holding the lock (what the runner removes, such as the
            # Ray worker's status file, is then surely ours, not a successor's), let go, then
            # look once more: a run queued meanwhile is either seen here or finds no worker
            # alive and starts a new one.
            runner.close()
            runner = None
            lock.release()
            if db.list_runs(status="queued").empty or not _take_again(lock):
                break
            runner = start_runner()
            idle_since = time.monotonic()
    except BaseException as exc:
        if runner is not None:
            runner.close(f"stopped: the worker running it was terminated ({type(exc).__name__})")
            runner = None
        raise
    finally:
        if runner is not None:
            runner.close()
        lock.release()
        _log(f"exiting after {counted(ran, 'run')}")
    return ran


def _take_again(lock: WorkerLock, patience_s: float = RETAKE_PATIENCE_S) -> bool:
    """Take ``lock`` back after letting it go; False once another worker holds it.

    One failed try does not mean another worker: `worker_pid` (which the page polls) holds the
    lock shared for an instant. So try again for ``patience_s``; a new worker holds it for good.
    """
    deadline = time.monotonic() + patience_s
    while not lock.acquire():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _run_one(db: RunsDB, run: Run, device: str, models: ModelCache) -> str:
    from analysis.runs.execute import describe_error, execute_run

    try:
        cfg = _on_device(run.config, torch_device(device))
        loaded = models.get(cfg.model, torch_device(device))
    except Exception as exc:
        db.fail(run.id, describe_error(exc, device))
        return "failed"
    return execute_run(db, run.id, cfg, loaded=loaded, log=_log)


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
    parser.add_argument(
        "--executor", default="local", choices=EXECUTORS, help=help_of(ExecutorChoice, "executor")
    )
    parser.add_argument("--ray-address", default=None, help=help_of(ExecutorChoice, "ray_address"))
    parser.add_argument(
        "--ray-cpus-per-run", type=int, default=1, help=help_of(ExecutorChoice, "cpus_per_run")
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: every core)"
    )
    parser.add_argument("--lock-fd", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:  # before any torch work: the CPU slot's share of the cores
        import torch

        torch.set_num_threads(max(1, args.threads))
    workspace = Workspace.from_env(args.cache)  # the worker's one workspace
    os.environ.update(workspace.environment())  # its threads and the processes it starts too

    def stop(signum, frame):  # SIGTERM: end like Ctrl-C would, recording the run as stopped
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        with workspace.active():
            ran = serve(
                root=workspace.root,
                device=args.device,
                idle_timeout=args.idle_timeout,
                lock_fd=args.lock_fd,
                executor=args.executor,
                ray_address=args.ray_address,
                cpus_per_run=args.ray_cpus_per_run,
            )
    except ValueError as exc:  # the Ray cluster is unreachable or its head node was lost
        _log(f"error: {exc} The queued runs stay queued.")
        return 2
    except SystemExit as exc:  # SIGTERM
        return exc.code if isinstance(exc.code, int) else 1
    return 0 if ran >= 0 else 1


def end_process(status: int) -> NoReturn:
    """Log ``status`` as the worker's last line and end the process with it, at once.

    Not through ``sys.exit``: at interpreter exit Ray's hook (``ray.shutdown``) writes to the
    local raylet, and when that raylet is gone (a lost head node takes it along) Ray's client
    ends the process itself, with status 1 and no word in the log. By now the runs are settled, the
    lock released and the status file removed; a Ray cluster this process started ends with it.
    """
    _log(f"exit status {status}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    end_process(main())
