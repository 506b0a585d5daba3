"""The Ray executor: the queue of the runs database, trained on a Ray cluster.

    python -m analysis.runs.worker --executor ray [--ray-address HOST:6379] [--ray-cpus-per-run 1]

The split, in three parts:
- the **queue loop** (`analysis.runs.worker.serve`): one process per cache folder and executor
  claims queued runs, reaps runs of dead processes and exits when idle, for both executors;
- the **runner** (`RayRunner` here, `LocalRunner` there): where a claimed run trains. This one
  is a Ray driver: it submits each run as a Ray task that declares its resources (one GPU when
  the cluster has GPUs, else ``cpus_per_run`` CPUs) and keeps as many in flight as the cluster
  holds;
- the **recorder** (`analysis.runs.execute.RunRecorder`): how what a run reports becomes rows.
  A task streams events back (Ray's streaming generator: one small object per step, dev score,
  progress note or ending, in order) and the driver hands them to the same recorder the local
  executor calls directly. So only the driver's machine touches the runs database: nodes need
  no shared disk and no database, and the page, the CLI and the results read the same rows
  whichever executor trained a run.

Inputs on the nodes: built-in models and data load from the installed packages there, hub ids
from the hub there; a local data file is read here (within `TUNESCOPE_MAX_FILE_MB`) and its bytes
travel through Ray's object store (once per file, shared by the runs of a sweep). tunescope's own
``analysis`` package travels with the job (``runtime_env`` ``py_modules``), so every node runs the
driver's code. Runs that need files of this machine — a local model folder, a zero-weights file,
a subspace source trajectory, or trajectory snapshots to record — are pinned to the driver's node
(which is always a node of the cluster: Ray drivers run on one).

Faults: a cancel raised from the page or the CLI is seen within ``cancel_poll_s``; ``ray.cancel``
interrupts the task, whose training thread stops at its next step, and the run is recorded as
cancelled. A Ray worker process or node that dies surfaces as a Ray system error: the run is
failed ("Ray worker died on NODE"), its steps stay, the other runs go on (tasks are never retried:
a retry would train the run a second time over its recorded steps). If the driver itself dies,
Ray ends the tasks it owns and the next worker reaps its runs as "worker died". Losing the
cluster's head (its GCS port stops taking connections, looked at every ``HEAD_CHECK_S``) fails the
runs in flight ("lost the Ray cluster head at ADDR") and is a `HeadLost`: the queue loop claims
nothing more and the worker exits, the queued runs left queued. Before anything is queued, and
before this process connects, `check_address` shakes hands with the cluster
(`analysis.runs.ray_cluster.handshake`): unreachable, not a Ray cluster, auth refused or another
Ray version is one clear `RayUnavailable`, and a Ray worker that cannot connect exits without
claiming anything. Nodes are named ``host/address/node-id-prefix`` (`ray_cluster.node_label`).

``ray`` is imported inside the functions that need it, so the page and the CLI can check an
address or queue runs without loading it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.io import atomic_write_json, read_json
from analysis.runs.db import RunsDB
from analysis.runs.execute import (
    ModelCache,
    RunRecorder,
    describe_error,
    run_dir_for,
    source_trajectory,
)
from analysis.runs.ray_cluster import (
    HeadLost,
    RayUnavailable,
    handshake,
    head_alive,
    is_loopback,
    loopback_only,
    node_label,
    terminate_at_once,
)
from analysis.runs.record import Run

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig

LOCAL_CLUSTER = "local"  # the address that means: start a Ray cluster inside the worker process
DEFAULT_PORT = 6379
CONNECT_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 60.0
RAY_INSTALL = "run ./tasks.sh setup, or pip install -e . (both pin ray)"
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the `analysis` package, shipped to nodes
# Ray's system errors that mean "the process (or machine) running the task is gone".
SYSTEM_FAILURE = "Ray worker died on {node}"
HEAD_LOST = "lost the Ray cluster head at {address}"
HEAD_CHECK_S = 1.0  # how often the head is looked at (`ray_cluster.head_alive`)


# -- addresses and the cluster ----------------------------------------------------------------


def resolve_address(address: str | None) -> str:
    """The cluster to use: ``address``, else ``$RAY_ADDRESS``, else `LOCAL_CLUSTER` (a Ray cluster that
    the worker starts on this machine and stops when it exits)."""
    chosen = (address or "").strip() or os.environ.get("RAY_ADDRESS", "").strip()
    return chosen or LOCAL_CLUSTER


def check_address(address: str | None) -> str:
    """The resolved address, once Ray is importable and a Ray cluster answers Ray's handshake
    there (`analysis.runs.ray_cluster.handshake`: reachable, a Ray head, the token accepted, the
    same Ray and Python versions).

    Raises `RayUnavailable` with one clear sentence otherwise, within seconds: ``ray.init``
    itself would retry such an address for minutes.
    """
    address = resolve_address(address)
    if importlib.util.find_spec("ray") is None:  # (without importing it: the page stays light)
        raise RayUnavailable(f"Ray is not installed in this environment: {RAY_INSTALL}.")
    if address in (LOCAL_CLUSTER, "auto"):
        return address
    if address.startswith("ray://"):
        raise RayUnavailable(
            f"Ray Client addresses ({address}) are not supported: run tunescope on a machine of "
            f"the cluster (`ray start --address HEAD:{DEFAULT_PORT}` there) and give HEAD:"
            f"{DEFAULT_PORT}."
        )
    host, _, port_text = address.rpartition(":")
    if not host:
        host, port_text = address, str(DEFAULT_PORT)
    try:
        port = int(port_text)
    except ValueError:
        raise RayUnavailable(
            f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.5:{DEFAULT_PORT})."
        ) from None
    handshake(host, port, address)
    return address if ":" in address else f"{host}:{port}"


def runtime_env() -> dict[str, Any]:
    """What every task's process gets: this checkout's ``analysis`` package (so the nodes run
    the driver's code) and no thread oversubscription from BLAS."""
    return {"py_modules": [str(PACKAGE_DIR)], "env_vars": {"TOKENIZERS_PARALLELISM": "false"}}


def connect(
    address: str | None, *, num_cpus: int | None = None, temp_dir: str | None = None
) -> bool:
    """Connect this process to the cluster (or start a local one). Returns whether this call
    started Ray here, i.e. whether the caller should ``ray.shutdown()`` at the end.

    A process already connected (tests, benchmarks) keeps its connection. A local cluster runs
    without Ray's own dashboard (tunescope's pages show the runs) and listens on 127.0.0.1 only,
    as does this process when it joins a cluster at a loopback address (`ray_cluster
    .loopback_only`); usage statistics are off unless ``RAY_USAGE_STATS_ENABLED`` says otherwise.
    While connecting, SIGTERM ends the process at once (nothing is claimed yet).
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = check_address(address)
    if address == LOCAL_CLUSTER or is_loopback(address.rpartition(":")[0]):
        loopback_only()
    options: dict[str, Any] = {
        "runtime_env": runtime_env(),
        "configure_logging": False,
        "log_to_driver": True,
    }
    try:
        with terminate_at_once():
            _init(ray, address, num_cpus, temp_dir, options)
    except (ConnectionError, RuntimeError) as exc:
        raise RayUnavailable(f"Cannot connect to the Ray cluster at {address}: {exc}") from None
    return True


def _init(ray: Any, address: str, num_cpus: int | None, temp_dir: str | None, options: dict):
    if address == LOCAL_CLUSTER:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            _temp_dir=temp_dir,
            _node_ip_address="127.0.0.1",
            **options,
        )
    else:
        ray.init(address=address, **options)


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What a Ray cluster offers tunescope: its nodes, CPUs, GPUs and how many runs fit at once
    (one GPU each when it has GPUs, else ``cpus_per_run`` CPUs each)."""

    address: str
    nodes: int
    cpus: float
    gpus: float
    cpus_per_run: int = 1

    @property
    def slots(self) -> int:
        """Runs trained at once."""
        if self.gpus >= 1:
            return int(self.gpus)
        return int(self.cpus // max(self.cpus_per_run, 1))

    def per_run(self) -> str:
        return "one GPU each" if self.gpus >= 1 else f"{self.cpus_per_run} CPU(s) each"

    def describe(self) -> str:
        where = (
            "a local Ray cluster on this machine" if self.address == LOCAL_CLUSTER else self.address
        )
        return (
            f"{where}: {self.nodes} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs → "
            f"trains {self.slots} run(s) at once ({self.per_run()})"
        )

    def check(self) -> None:
        if self.slots < 1:
            raise RayUnavailable(
                f"The Ray cluster at {self.address} has {self.cpus:g} CPUs and no GPU: fewer than "
                f"the {self.cpus_per_run} CPUs a run asks for. Lower the CPUs per run."
            )


def current_cluster(address: str, cpus_per_run: int) -> ClusterInfo:
    """The cluster this process is connected to, as it is now (alive nodes only)."""
    import ray

    total = ray.cluster_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return ClusterInfo(
        address, nodes, float(total.get("CPU", 0)), float(total.get("GPU", 0)), cpus_per_run
    )


def local_cluster(cpus_per_run: int = 1) -> ClusterInfo:
    """What a local Ray cluster on this machine would offer (without starting one)."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ClusterInfo(LOCAL_CLUSTER, 1, float(cpus or 1), float(gpus), cpus_per_run)


def probe_cluster(address: str | None, cpus_per_run: int = 1) -> ClusterInfo:
    """The cluster at ``address``, asked from a short-lived process (so the caller — the page —
    never becomes a Ray driver itself). A `RayUnavailable` when it cannot be reached."""
    address = check_address(address)
    if address == LOCAL_CLUSTER:
        return local_cluster(cpus_per_run)
    command = [sys.executable, "-m", "analysis.runs.ray_executor", address]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise RayUnavailable(
            f"The Ray cluster at {address} did not answer within {PROBE_TIMEOUT_S:g} s."
        ) from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        detail = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise RayUnavailable(f"Cannot use the Ray cluster at {address}: {detail}")
    payload = json.loads(lines[-1])
    return dataclasses.replace(ClusterInfo(**payload), cpus_per_run=cpus_per_run)


# -- the worker's status file -------------------------------------------------------------------


def status_path(root: Path | str) -> Path:
    """``<cache root>/worker-ray.json``: the Ray worker's address and cluster, for the page."""
    return Path(root) / "worker-ray.json"


def read_status(root: Path | str) -> dict[str, Any] | None:
    """The last status the Ray worker wrote (None if there is none or it is unreadable)."""
    path = status_path(root)
    if not path.is_file():
        return None
    try:
        return read_json(path, "Ray worker status file")
    except ValueError:
        return None


def write_status(root: Path | str, payload: dict[str, Any]) -> None:
    atomic_write_json(status_path(root), payload)


# -- the driver side ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Flight:
    """One run in flight on the cluster."""

    run_id: str
    stream: Any  # ray.ObjectRefGenerator
    recorder: RunRecorder
    zero_weights: str | None = None  # as queued, when the task got an absolute path
    node: str | None = None
    cancelling: bool = False


class RayRunner:
    """Trains claimed runs as Ray tasks, as many at once as the cluster holds (module docstring).

    The queue loop calls ``free_slots`` → ``submit`` (for each claimed run) → ``pump`` (wait up to
    ``timeout`` for events, record them, pass on cancels) and ``close`` at the end.

    The cluster is re-read (``refresh``: nodes come and go) every ``refresh_s`` in a thread of its
    own, never in the queue loop: once the head is gone, Ray's calls to its GCS (``ray.nodes``)
    block for a minute, and the loop must go on meanwhile to notice the loss (``check_head``, a
    plain connection to the GCS port) and end.
    """

    device_label = "ray"

    def __init__(
        self,
        db: RunsDB,
        address: str | None = None,
        cpus_per_run: int = 1,
        *,
        log: Callable[[str], None] = print,
        cancel_poll_s: float = 0.5,
        refresh_s: float = 5.0,
        status_root: Path | str | None = None,
    ) -> None:
        import ray

        if int(cpus_per_run) < 1:
            raise ValueError(f"CPUs per run must be at least 1 (got {cpus_per_run!r}).")
        self.db, self.log = db, log
        self.cpus_per_run = int(cpus_per_run)
        self.started_here = connect(address)  # keeps a connection this process already has
        context = ray.get_runtime_context()
        self.address = resolve_address(address) if self.started_here else str(context.gcs_address)
        self.node_id = context.get_node_id()
        self.gcs = str(context.gcs_address)  # the head's GCS: watched while runs are in flight
        self.head_lost = False
        self._last_head_check = float("-inf")
        self.cancel_poll_s, self.refresh_s = cancel_poll_s, refresh_s
        self.status_root = status_root
        self.flights: dict[str, _Flight] = {}
        self._task = ray.remote(max_retries=0)(_train_stream)
        self._data: OrderedDict[tuple, Any] = OrderedDict()  # file → ObjectRef of its bytes
        self._last_cancel_poll = 0.0
        self.this_node: dict[str, float] = {}  # this machine's node: its CPU and GPU
        self._closing = threading.Event()
        self._status_lock = threading.Lock()  # a refresh writes no status file once closing
        try:
            self.info = self.refresh()
            self.info.check()
        except BaseException:
            if self.started_here:
                ray.shutdown()
            raise
        self._refresher = threading.Thread(
            target=self._keep_refreshing, name="tunescope-ray-refresh", daemon=True
        )
        self._refresher.start()
        log(f"Ray cluster: {self.info.describe()}")

    # ---- the cluster ------------------------------------------------------------------------------
    def refresh(self) -> ClusterInfo:
        """Re-read the cluster (nodes come and go) and write the status file."""
        import ray

        info = current_cluster(self.address, self.cpus_per_run)
        for node in ray.nodes():
            if node.get("NodeID") == self.node_id:
                resources = node.get("Resources", {})
                self.this_node = {k: float(resources.get(k, 0)) for k in ("CPU", "GPU")}
        self.info = info
        with self._status_lock:
            if self.status_root is not None and not self._closing.is_set():
                write_status(
                    self.status_root,
                    {
                        **dataclasses.asdict(info),
                        "slots": info.slots,
                        "in_flight": len(self.flights),
                        "pid": os.getpid(),
                        "updated": time.time(),
                    },
                )
        return info

    def _keep_refreshing(self) -> None:
        """``refresh`` every ``refresh_s`` until closing (the refresh thread, class docstring).
        A refresh that fails is tried again at the next turn; one that blocks on a lost head
        blocks only this daemon thread."""
        while not self._closing.wait(self.refresh_s):
            if not head_alive(self.gcs):
                return  # (the queue loop's `check_head` says so and ends)
            try:
                self.refresh()
            except Exception as exc:  # e.g. a GCS call timing out while the head restarts
                if self._closing.is_set():
                    return
                self.log(f"could not re-read the Ray cluster ({type(exc).__name__}: {exc})")

    def check_head(self, force: bool = False) -> None:
        """A `HeadLost` once the head's GCS port stops taking connections (looked at every
        ``HEAD_CHECK_S``): every run in flight is failed "lost the Ray cluster head at ADDR"
        first, and the queue loop claims nothing more (the queued runs stay queued)."""
        now = time.monotonic()
        if self.head_lost or (not force and now - self._last_head_check < HEAD_CHECK_S):
            return
        self._last_head_check = now
        if head_alive(self.gcs):
            return
        self.head_lost = True
        message = HEAD_LOST.format(address=self.gcs)
        for flight in list(self.flights.values()):
            self._end(flight, flight.recorder.failed(message))
        raise HeadLost(f"{message[0].upper()}{message[1:]}: its runs in flight failed.")

    def free_slots(self) -> int:
        self.check_head()
        return self.info.slots - len(self.flights)

    def busy(self) -> bool:
        return bool(self.flights)

    # ---- submitting ---------------------------------------------------------------------------------
    def submit(self, run: Run) -> None:
        """Start one claimed run on the cluster (or record at once why it cannot start)."""
        run_id = run.id
        recorder = RunRecorder(self.db, run_id)
        try:
            cfg = run.config
            inputs = self._inputs(run_id, cfg)
        except Exception as exc:
            recorder.failed(describe_error(exc))
            self.log(f"run {run_id}: failed before it started: {describe_error(exc)}")
            return
        options: dict[str, Any] = {"num_returns": "streaming"}
        pinned = inputs.pop("pinned")
        gpus = self.this_node.get("GPU", 0) if pinned else self.info.gpus
        wants_gpu = cfg.device != "cpu" and gpus >= 1
        if pinned and not wants_gpu and self.this_node.get("CPU", 0) < self.cpus_per_run:
            message = (
                "this run needs files of this machine (a local model folder, a zero-weights "
                "file or a trajectory), but this machine's Ray node offers "
                f"{self.this_node.get('CPU', 0):g} CPUs, fewer than the {self.cpus_per_run} a "
                "run asks (was it started with --num-cpus 0?): train it with the local executor"
            )
            recorder.failed(message)
            self.log(f"run {run_id}: failed before it started: {message}")
            return
        if wants_gpu:
            options.update(num_cpus=1, num_gpus=1)
        else:
            options.update(num_cpus=self.cpus_per_run, num_gpus=0)
        if pinned:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=self.node_id, soft=False
            )
        stream = self._task.options(**options).remote(
            cfg.to_dict(), threads=self.cpus_per_run, **inputs
        )
        self.flights[run_id] = _Flight(
            run_id, stream, recorder, zero_weights=cfg.zero_weights if pinned else None
        )
        where = "this machine's node" if pinned else "the cluster"
        self.db.set_progress(run_id, 0.0, f"submitted to Ray; waiting for a slot on {where}")
        self.log(
            f"run {run_id}: {run.method} {run.label} seed {run.seed} → Ray "
            f"({'1 GPU' if wants_gpu else f'{self.cpus_per_run} CPU'}"
            f"{', pinned to this node' if pinned else ''})"
        )

    def _inputs(self, run_id: str, cfg: FinetuneConfig) -> dict[str, Any]:
        """What the task needs besides the config: the data file's bytes, absolute paths of the
        files of this machine it uses, and whether that pins it to this node."""
        from analysis.models import resolve_source

        inputs: dict[str, Any] = {"pinned": False}
        source, kind = resolve_source(cfg.model.name)
        if kind == "local":
            inputs.update(model_folder=source, pinned=True)
        if _is_data_file(cfg.data.name):
            inputs["data_file"], inputs["data_bytes"] = self._data_ref(cfg)
        if cfg.zero_weights:
            inputs["zero_weights"] = str(Path(cfg.zero_weights).expanduser().resolve())
            inputs["pinned"] = True
        trajectory = source_trajectory(self.db, cfg)
        if trajectory is not None:
            inputs.update(trajectory=str(Path(trajectory).resolve()), pinned=True)
        if cfg.trajectory_every:
            inputs.update(run_dir=str(run_dir_for(self.db, run_id).resolve()), pinned=True)
        return inputs

    def _data_ref(self, cfg: FinetuneConfig) -> tuple[str, Any]:
        """(path, ObjectRef of the file's bytes), put into the object store once per file
        version (a sweep's runs share it; the last few files are kept)."""
        import ray

        from analysis.data.files import checked_file

        path, stat = checked_file(cfg.data)
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._data:
            self._data[key] = ray.put(path.read_bytes())
            while len(self._data) > 4:
                self._data.popitem(last=False)
        self._data.move_to_end(key)
        return str(path), self._data[key]

    # ---- events -------------------------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        """Record what arrived within ``timeout`` seconds, then pass on cancel requests."""
        import ray

        self.check_head()
        if self.flights:
            by_stream = {id(f.stream): f for f in self.flights.values()}
            streams = [f.stream for f in self.flights.values()]
            ready, _ = ray.wait(streams, num_returns=1, timeout=timeout)
            if ready:
                ready, _ = ray.wait(streams, num_returns=len(streams), timeout=0)
            for stream in ready:
                self._next_event(by_stream[id(stream)])
        self._pass_on_cancels()

    def _next_event(self, flight: _Flight) -> None:
        import ray
        from ray import exceptions as rex

        try:
            event = ray.get(next(flight.stream))
        except StopIteration:
            self._end(flight, flight.recorder.failed("the Ray task ended without a result"))
        except rex.TaskCancelledError:
            self._end(flight, flight.recorder.cancelled("cancelled by the user"))
        except rex.OutOfMemoryError:
            node = flight.node or "its node"
            message = (
                f"out of memory: Ray stopped the worker on {node} (lower the batch size or max "
                "length, or give each run more CPUs)"
            )
            self._end(flight, flight.recorder.failed(message))
        except rex.RayTaskError as exc:  # our code raised outside the training thread
            self._end(flight, flight.recorder.failed(describe_error(exc.cause or exc)))
        except rex.RayError as exc:  # the process or machine running the task is gone
            self.check_head(force=True)  # (or the whole cluster with its head)
            node = flight.node or "a node it had not reported yet"
            message = f"{SYSTEM_FAILURE.format(node=node)} ({type(exc).__name__})"
            self._end(flight, flight.recorder.failed(message))
        else:
            self._record(flight, event)

    def _record(self, flight: _Flight, event: dict[str, Any]) -> None:
        kind, recorder = event.get("kind"), flight.recorder
        if kind == "step":
            recorder.step(event["step"], event["metrics"])
        elif kind == "eval":
            recorder.eval(event["step"], event["metrics"])
        elif kind == "progress":
            recorder.progress(event["fraction"], event["message"])
        elif kind == "start":
            flight.node = node_label(event["node"], event.get("ip"), event.get("node_id"))
            self.db.set_device(flight.run_id, f"ray:{flight.node} {event['device']}")
            self.log(f"run {flight.run_id}: training on {flight.node} ({event['device']})")
        elif kind == "done":
            result = dict(event["result"])
            if flight.zero_weights is not None and isinstance(result.get("config"), dict):
                result["config"]["zero_weights"] = flight.zero_weights  # as queued
            self._end(flight, recorder.done(result))
        elif kind == "failed":
            self._end(flight, recorder.failed(event["error"]))
        elif kind == "cancelled":
            self._end(flight, recorder.cancelled("cancelled by the user"))

    def _end(self, flight: _Flight, status: str) -> None:
        self.flights.pop(flight.run_id, None)
        error = self.db.get_run(flight.run_id)["error"] if status != "done" else None
        self.log(f"run {flight.run_id}: {status}{f' ({error})' if error else ''}")

    def _pass_on_cancels(self) -> None:
        import ray

        now = time.monotonic()
        if not self.flights or now - self._last_cancel_poll < self.cancel_poll_s:
            return
        self._last_cancel_poll = now
        running = self.db.list_runs(status="running")
        wanted = set(running.loc[running["cancel_requested"] == 1, "id"])
        for run_id in wanted & set(self.flights):
            flight = self.flights[run_id]
            if not flight.cancelling:
                flight.cancelling = True
                ray.cancel(flight.stream)
                self.log(f"run {run_id}: cancel passed on to Ray")

    # ---- the end --------------------------------------------------------------------------------------
    def close(self, reason: str | None = None) -> None:
        """Stop what is still in flight (recorded as failed with ``reason``) and disconnect."""
        import ray

        for flight in list(self.flights.values()):
            with contextlib.suppress(Exception):
                if not self.head_lost:
                    ray.cancel(flight.stream, force=True)
            flight.recorder.failed(reason or "stopped: the Ray worker ended")
        self.flights.clear()
        with self._status_lock:
            self._closing.set()
            if self.status_root is not None:
                with contextlib.suppress(OSError):
                    status_path(self.status_root).unlink()
        if self.started_here:
            self._refresher.join(timeout=10)  # (a cluster of our own: its GCS answers)
            ray.shutdown()


def _is_data_file(name: str) -> bool:
    """Whether a data name is a local file (not a built-in or a GLUE task)."""
    from analysis.data.builtin import BUILTIN_DATA

    key = name.strip().lower()
    return key not in BUILTIN_DATA and not key.startswith("glue/")


# -- the task side (runs on a node, in a Ray worker process) ------------------------------------------

_MODELS = ModelCache()  # per Ray worker process: a sweep on one model loads it once per process
PROGRESS_EVERY_S = 0.5


def _train_stream(
    config: dict[str, Any],
    *,
    threads: int = 1,
    data_file: str | None = None,
    data_bytes: bytes | None = None,
    model_folder: str | None = None,
    zero_weights: str | None = None,
    trajectory: str | None = None,
    run_dir: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Train one run on this node and yield what happens, as plain dicts:
    start {node, device, pid} · progress {fraction, message} · step / eval {step, metrics} ·
    then one of done {result}, failed {error}, cancelled.

    The engine runs in a thread so that this generator can hand each event to Ray as it comes;
    when Ray cancels the task (KeyboardInterrupt here) or closes the generator, ``stop`` is set
    and the engine stops at its next step.
    """
    import ray

    device = "cuda:0" if ray.get_gpu_ids() else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES
    # First, before the heavy imports: from here on a death of this process names its node
    # (host name, address and node id: two nodes of one machine share the first two).
    yield {
        "kind": "start",
        "node": socket.gethostname(),
        "ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "device": device,
        "pid": os.getpid(),
    }

    import torch

    from analysis.finetune.config import FinetuneConfig

    if device == "cpu":
        torch.set_num_threads(max(1, int(threads)))
    cfg = FinetuneConfig.from_dict(config)
    changes: dict[str, Any] = {"device": device}
    if zero_weights is not None:
        changes["zero_weights"] = zero_weights
    cfg = dataclasses.replace(cfg, **changes)
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    stop = threading.Event()
    worker = threading.Thread(
        target=_train_into,
        args=(cfg, events, stop),
        kwargs=dict(
            data_file=data_file,
            data_bytes=data_bytes,
            model_folder=model_folder,
            trajectory=trajectory,
            run_dir=run_dir,
        ),
        name="tunescope-run",
        daemon=True,
    )
    worker.start()
    try:
        while True:
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                continue
            if event is None:
                return
            yield event
    finally:
        stop.set()
        worker.join(timeout=120)


def _train_into(
    cfg: FinetuneConfig,
    events: queue.Queue,
    stop: threading.Event,
    *,
    data_file: str | None,
    data_bytes: bytes | None,
    model_folder: str | None,
    trajectory: str | None,
    run_dir: str | None,
) -> None:
    """The training thread of `_train_stream`: every callback becomes an event."""
    from analysis.data.files import task_from_bytes
    from analysis.finetune.engine import run_finetune
    from analysis.progress import Cancelled

    last = [float("-inf")]

    def progress(fraction: float, message: str = "") -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or fraction >= 1.0:
            last[0] = now
            events.put({"kind": "progress", "fraction": float(fraction), "message": message})

    def on_step(step: int, metrics: dict[str, float]) -> None:
        events.put({"kind": "step", "step": int(step), "metrics": dict(metrics)})

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        events.put({"kind": "eval", "step": int(step), "metrics": dict(metrics)})

    try:
        spec = dataclasses.replace(cfg.model, name=model_folder) if model_folder else cfg.model
        loaded = _MODELS.get(spec, cfg.device)
        data = None
        if data_bytes is not None and data_file is not None:
            data = task_from_bytes(cfg.data, data_bytes, Path(data_file))
        result = run_finetune(
            cfg,
            progress=progress,
            should_stop=stop.is_set,
            on_step=on_step,
            on_eval=on_eval,
            run_dir=run_dir,
            loaded=loaded,
            data=data,
            trajectory=trajectory,
        )
        events.put({"kind": "done", "result": result.to_dict()})
    except Cancelled:
        events.put({"kind": "cancelled"})
    except Exception as exc:
        traceback.print_exc()  # into the Ray worker's log (and the driver's, log_to_driver)
        events.put({"kind": "failed", "error": describe_error(exc, cfg.device)})
    finally:
        events.put(None)


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.runs.ray_executor ADDRESS``: print the cluster at ADDRESS as one JSON
    line (`probe_cluster` runs it, so the page never becomes a Ray driver)."""
    args = sys.argv[1:] if argv is None else argv
    address = args[0] if args else None
    import ray

    try:
        connect(address)
        info = current_cluster(resolve_address(address), 1)
    except RayUnavailable as exc:
        print(str(exc), file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    print(json.dumps(dataclasses.asdict(info)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
