"""The Ray executor: the queue of the runs database, trained on a Ray cluster.

    python -m analysis.runs.worker --executor ray [--ray-address HOST:6379] [--ray-cpus-per-run 1]

The split, in three parts:
- the **queue loop** (`analysis.runs.worker.serve`): one process per cache folder and executor
  claims queued runs, reaps runs of dead processes and exits when idle, for both executors;
- the **runner** (`RayRunner` here, `LocalRunner` there): where a claimed run trains. This one
  is a Ray driver: it submits each run as a Ray task that declares its resources (one GPU when
  the cluster has GPUs, else ``cpus_per_run`` CPUs), as many as the cluster has room for now
  (`ClusterWatch`, which also watches the head node);
- the **recorder** (`analysis.runs.execute.RunRecorder`): how what a run reports becomes rows.
  A task (`analysis.runs.ray_task.train_stream`) streams events back (Ray's streaming
  generator: one small object per step, dev score, progress note or ending, in order) and the
  driver hands them to the same recorder the local executor calls directly. So only the
  driver's machine touches the runs database: nodes need no shared disk and no database, and
  the page, the CLI and the results read the same rows whichever executor trained a run.

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
a retry would train the run a second time over its recorded steps), and nothing more is claimed
until the cluster has been re-read. If the driver itself dies, Ray ends the tasks it owns and the
next worker reaps its runs as "worker died". Losing the cluster's head node (its GCS port stops
taking connections, looked at every ``HEAD_NODE_CHECK_S``) fails the runs in flight ("lost the Ray
cluster's head node at ADDR") and is a `HeadNodeLost`: the queue loop claims nothing more and the
worker exits, the queued runs left queued, without ``ray.shutdown`` (`ClusterWatch.close`). Before
anything is queued, and before this process connects, `check_address` shakes hands with the cluster
(`analysis.runs.ray_cluster.handshake`): unreachable, not a Ray cluster, auth refused or another Ray
version is one clear `RayUnavailable`, and a Ray worker that cannot connect exits without claiming
anything. Nodes are named ``host/address/node-id-prefix`` (`ray_cluster.node_label`).

``ray`` is imported inside the functions that need it, so the page and the CLI can check an
address or queue runs without loading it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.io import atomic_write_json, read_json
from analysis.runs.db import RunsDB
from analysis.runs.execute import (
    RunRecorder,
    describe_error,
    run_dir_for,
    source_trajectory,
)
from analysis.runs.ray_cluster import (
    HeadNodeLost,
    RayUnavailable,
    handshake,
    head_node_alive,
    is_loopback,
    loopback_only,
    node_label,
    one_line_ray_messages,
    terminate_at_once,
)
from analysis.runs.record import Run
from analysis.words import counted

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
HEAD_NODE_LOST = "lost the Ray cluster's head node at {address}"
HEAD_NODE_CHECK_S = 1.0  # how often the head node is looked at (`ray_cluster.head_node_alive`)


# -- addresses and the cluster ----------------------------------------------------------------


def resolve_address(address: str | None) -> str:
    """The cluster to use: ``address``, else ``$RAY_ADDRESS``, else `LOCAL_CLUSTER` (a Ray cluster that
    the worker starts on this machine and stops when it exits)."""
    chosen = (address or "").strip() or os.environ.get("RAY_ADDRESS", "").strip()
    return chosen or LOCAL_CLUSTER


def check_address(address: str | None) -> str:
    """The resolved address, once Ray is importable and a Ray cluster answers Ray's handshake
    there (`analysis.runs.ray_cluster.handshake`: reachable, a Ray head node, the token accepted,
    the same Ray and Python versions).

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
            f"the cluster (`ray start --address HEAD_NODE:{DEFAULT_PORT}` there) and give "
            f"HEAD_NODE:{DEFAULT_PORT}."
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
    .loopback_only`); usage statistics are off unless ``RAY_USAGE_STATS_ENABLED`` says otherwise,
    and Ray's own processes print one line per note (`ray_cluster.one_line_ray_messages`). While connecting, SIGTERM ends the process at once (nothing is
    claimed yet).
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # what Ray prints: plain text, no colour codes
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
    one_line_ray_messages()
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
    (one GPU each when it has GPUs, else ``cpus_per_run`` CPUs each), and what of it is free
    (``free_cpus``, ``free_gpus``; None when not read)."""

    address: str
    nodes: int
    cpus: float
    gpus: float
    cpus_per_run: int = 1
    free_cpus: float | None = None
    free_gpus: float | None = None

    def _runs_in(self, cpus: float, gpus: float) -> int:
        if self.gpus >= 1:
            return int(gpus)
        return int(cpus // max(self.cpus_per_run, 1))

    @property
    def slots(self) -> int:
        """Runs trained at once."""
        return self._runs_in(self.cpus, self.gpus)

    def room(self, held: int = 0) -> int:
        """Runs that fit into what was free plus what ``held`` runs of ours hold (a slot each);
        every slot when nothing was read of what is free."""
        if self.free_cpus is None:
            return self.slots
        return min(self.slots, self._runs_in(self.free_cpus, self.free_gpus or 0.0) + held)

    def per_run(self) -> str:
        return "one GPU each" if self.gpus >= 1 else f"{counted(self.cpus_per_run, 'CPU')} each"

    def describe(self) -> str:
        where = (
            "a local Ray cluster on this machine" if self.address == LOCAL_CLUSTER else self.address
        )
        return (
            f"{where}: {counted(self.nodes, 'node')}, {counted(self.cpus, 'CPU')}, "
            f"{counted(self.gpus, 'GPU')} → trains {counted(self.slots, 'run')} at once "
            f"({self.per_run()})"
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

    total, free = ray.cluster_resources(), ray.available_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return ClusterInfo(
        address,
        nodes,
        float(total.get("CPU", 0)),
        float(total.get("GPU", 0)),
        cpus_per_run,
        float(free.get("CPU", 0)),
        float(free.get("GPU", 0)),
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


class ClusterWatch:
    """The cluster this process drives: connected to on construction, re-read every
    ``refresh_s`` (nodes come and go; the status file tells the page), its head node looked at, and
    how many runs can start on it now (`free_slots`).

    The cluster is re-read in a thread of its own, never in the queue loop: once the head node is
    gone, Ray's calls to its GCS (``ray.nodes``) block for a minute, and the loop must go on
    meanwhile to notice the loss (`head_node_gone`, a plain connection to the GCS port) and end.

    A run is claimed only while the cluster has room for it, or it would show ``running`` (its
    start time the claim's) while it waits in Ray's queue. The room is the last reading's free
    resources plus what our started runs held then (`ClusterInfo.room`), less the runs in flight
    now. A run whose Ray worker or node died may have taken its slot with it: until the cluster
    has been re-read (at once) nothing is claimed.
    """

    def __init__(
        self,
        address: str | None,
        cpus_per_run: int,
        *,
        log: Callable[[str], None],
        refresh_s: float,
        status_root: Path | str | None,
    ) -> None:
        import ray

        self.cpus_per_run, self.log = cpus_per_run, log
        self.refresh_s, self.status_root = refresh_s, status_root
        self.started_here = connect(address)  # keeps a connection this process already has
        context = ray.get_runtime_context()
        self.address = resolve_address(address) if self.started_here else str(context.gcs_address)
        self.node_id = context.get_node_id()
        self.gcs = str(context.gcs_address)  # the head node's GCS: watched while runs are in flight
        self.head_node_lost = False
        self._last_head_node_check = float("-inf")
        self.this_node: dict[str, float] = {}  # this machine's node: its CPU and GPU
        self.in_flight = 0  # runs submitted and not ended
        self.holding = 0  # of those, runs that started (their resources are taken)
        self._room = 0  # `ClusterInfo.room` at the last reading
        self._deaths = 0  # runs whose Ray worker or node died
        self._deaths_read = 0  # of those, the ones before the last reading began
        self._lock = threading.Lock()  # the counts above, between the loop and the refresher
        self._wake, self._closing = threading.Event(), threading.Event()
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

    # ---- what the cluster holds ---------------------------------------------------------------
    def refresh(self) -> ClusterInfo:
        """Re-read the cluster and write the status file."""
        import ray

        with self._lock:
            holding, deaths = self.holding, self._deaths
        info = current_cluster(self.address, self.cpus_per_run)
        for node in ray.nodes():
            if node.get("NodeID") == self.node_id:
                resources = node.get("Resources", {})
                self.this_node = {k: float(resources.get(k, 0)) for k in ("CPU", "GPU")}
        with self._lock:
            self.info, self._room, self._deaths_read = info, info.room(holding), deaths
            if self.status_root is not None and not self._closing.is_set():
                status = {**dataclasses.asdict(info), "slots": info.slots}
                status.update(in_flight=self.in_flight, pid=os.getpid(), updated=time.time())
                write_status(self.status_root, status)
        return info

    def _keep_refreshing(self) -> None:
        """``refresh`` every ``refresh_s``, or at once when woken, until closing. A refresh that
        fails is tried again at the next turn; one that blocks on a lost head node blocks only this
        daemon thread."""
        while True:
            self._wake.wait(self.refresh_s)
            self._wake.clear()
            if self._closing.is_set() or not head_node_alive(self.gcs):
                return  # (a lost head node: the queue loop's `head_node_gone` says so and ends)
            try:
                self.refresh()
            except Exception as exc:  # e.g. a GCS call timing out while the head node restarts
                if self._closing.is_set():
                    return
                self.log(f"could not re-read the Ray cluster ({type(exc).__name__}: {exc})")

    def head_node_gone(self, force: bool = False) -> bool:
        """Whether the head node's GCS port stopped taking connections (looked at every
        ``HEAD_NODE_CHECK_S``, or now with ``force``); once gone, always gone."""
        now = time.monotonic()
        if self.head_node_lost or (
            not force and now - self._last_head_node_check < HEAD_NODE_CHECK_S
        ):
            return self.head_node_lost
        self._last_head_node_check = now
        self.head_node_lost = not head_node_alive(self.gcs)
        return self.head_node_lost

    # ---- slots ----------------------------------------------------------------------------------
    def free_slots(self) -> int:
        """Runs that can start now (class docstring)."""
        with self._lock:
            if self._deaths != self._deaths_read:
                return 0
            return max(0, self._room - self.in_flight)

    def submitted(self) -> None:
        with self._lock:
            self.in_flight += 1

    def started(self) -> None:
        with self._lock:
            self.holding += 1

    def ended(self, started: bool, died: bool) -> None:
        """A run in flight ended; ``died``: its Ray worker or node died (re-read the cluster)."""
        with self._lock:
            self.in_flight -= 1
            self.holding -= int(started)
            self._deaths += int(died)
        if died:
            self._wake.set()

    # ---- the end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop re-reading, remove the status file, and disconnect (`ray.shutdown`) when this
        process connected, unless the head node is lost: then Ray's shutdown would end the process
        itself (its local raylet gone, its C++ client exits), before the worker's last word."""
        import ray

        with self._lock:
            self._closing.set()
            self._wake.set()
            if self.status_root is not None:
                with contextlib.suppress(OSError):
                    status_path(self.status_root).unlink()
        if self.started_here and not self.head_node_lost:
            self._refresher.join(timeout=10)  # (a live head node: its GCS answers)
            ray.shutdown()


class TaskInputs:
    """What a run's task needs besides its config: the data file's bytes (put into Ray's object
    store once per file version, shared by a sweep's runs; the last few files kept), absolute
    paths of the files of this machine it uses, and whether those pin it to this node."""

    KEEP_FILES = 4

    def __init__(self, db: RunsDB) -> None:
        self.db = db
        self._data: OrderedDict[tuple, Any] = OrderedDict()  # file version → ObjectRef

    def of(self, run_id: str, cfg: FinetuneConfig) -> tuple[dict[str, Any], bool]:
        """(the task's keyword arguments, pinned to this node)."""
        from analysis.models import resolve_source

        inputs: dict[str, Any] = {}
        pinned = False
        source, kind = resolve_source(cfg.model.name)
        if kind == "local":
            inputs["model_folder"], pinned = source, True
        if _is_data_file(cfg.data.name):
            inputs["data_file"], inputs["data_bytes"] = self._data_ref(cfg)
        if cfg.zero_weights:
            inputs["zero_weights"] = str(Path(cfg.zero_weights).expanduser().resolve())
            pinned = True
        trajectory = source_trajectory(self.db, cfg)
        if trajectory is not None:
            inputs["trajectory"], pinned = str(Path(trajectory).resolve()), True
        if cfg.trajectory_every:
            inputs["run_dir"], pinned = str(run_dir_for(self.db, run_id).resolve()), True
        return inputs, pinned

    def _data_ref(self, cfg: FinetuneConfig) -> tuple[str, Any]:
        """(path, ObjectRef of the file's bytes)."""
        import ray

        from analysis.data.files import checked_file

        path, stat = checked_file(cfg.data)
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._data:
            self._data[key] = ray.put(path.read_bytes())
            while len(self._data) > self.KEEP_FILES:
                self._data.popitem(last=False)
        self._data.move_to_end(key)
        return str(path), self._data[key]


@dataclasses.dataclass
class _Flight:
    """One run in flight on the cluster."""

    run_id: str
    stream: Any  # ray.ObjectRefGenerator
    recorder: RunRecorder
    zero_weights: str | None = None  # as queued, when the task got an absolute path
    node: str | None = None  # once the task reported where it trains
    cancelling: bool = False


class RayRunner:
    """Trains claimed runs as Ray tasks, as many at once as the cluster has room for (module
    docstring; the cluster side is `ClusterWatch`).

    The queue loop calls ``free_slots`` → ``submit`` (for each claimed run) → ``pump`` (wait up to
    ``timeout`` for events, record them, pass on cancels) and ``close`` at the end. ``free_slots``
    and ``pump`` raise `HeadNodeLost` once the head node is gone, after failing the runs in flight.
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

        from analysis.runs.ray_task import train_stream

        if int(cpus_per_run) < 1:
            raise ValueError(f"CPUs per run must be at least 1 (got {cpus_per_run!r}).")
        self.db, self.log = db, log
        self.cpus_per_run = int(cpus_per_run)
        self.cluster = ClusterWatch(
            address, self.cpus_per_run, log=log, refresh_s=refresh_s, status_root=status_root
        )
        self.inputs = TaskInputs(db)
        self.flights: dict[str, _Flight] = {}
        self._task = ray.remote(max_retries=0)(train_stream)
        self.cancel_poll_s = cancel_poll_s
        self._last_cancel_poll = 0.0
        log(f"Ray cluster: {self.cluster.info.describe()}")

    def check_head_node(self, force: bool = False) -> None:
        """A `HeadNodeLost` once the head node is gone (`ClusterWatch.head_node_gone`), every run
        in flight failed "lost the Ray cluster's head node at ADDR" first; the queued runs stay
        queued."""
        if not self.cluster.head_node_gone(force):
            return
        message = HEAD_NODE_LOST.format(address=self.cluster.gcs)
        for flight in list(self.flights.values()):
            self._end(flight, flight.recorder.failed(message))
        raise HeadNodeLost(f"{message[0].upper()}{message[1:]}: its runs in flight failed.")

    def free_slots(self) -> int:
        self.check_head_node()
        return self.cluster.free_slots()

    def busy(self) -> bool:
        return bool(self.flights)

    # ---- submitting ---------------------------------------------------------------------------------
    def submit(self, run: Run) -> None:
        """Start one claimed run on the cluster (or record at once why it cannot start)."""
        recorder = RunRecorder(self.db, run.id)
        try:
            cfg = run.config
            inputs, pinned = self.inputs.of(run.id, cfg)
            options = self._options(cfg, pinned)
        except Exception as exc:
            message = exc.args[0] if isinstance(exc, _CannotStart) else describe_error(exc)
            recorder.failed(message)
            self.log(f"run {run.id}: failed before it started: {message}")
            return
        stream = self._task.options(**options).remote(
            cfg.to_dict(), threads=self.cpus_per_run, **inputs
        )
        zero_weights = cfg.zero_weights if pinned else None
        self.flights[run.id] = _Flight(run.id, stream, recorder, zero_weights=zero_weights)
        self.cluster.submitted()
        where = "this machine's node" if pinned else "the cluster"
        self.db.set_progress(run.id, 0.0, f"submitted to Ray; waiting for a slot on {where}")
        gpu = options["num_gpus"] == 1
        self.log(
            f"run {run.id}: {run.method} {run.label} seed {run.seed} → Ray "
            f"({'1 GPU' if gpu else f'{self.cpus_per_run} CPU'}"
            f"{', pinned to this node' if pinned else ''})"
        )

    def _options(self, cfg: FinetuneConfig, pinned: bool) -> dict[str, Any]:
        """The task's Ray options: its resources, and this node for a pinned run."""
        this_node = self.cluster.this_node
        gpus = this_node.get("GPU", 0) if pinned else self.cluster.info.gpus
        wants_gpu = cfg.device != "cpu" and gpus >= 1
        if pinned and not wants_gpu and this_node.get("CPU", 0) < self.cpus_per_run:
            raise _CannotStart(
                "this run needs files of this machine (a local model folder, a zero-weights "
                "file or a trajectory), but this machine's Ray node offers "
                f"{this_node.get('CPU', 0):g} CPUs, fewer than the {self.cpus_per_run} a "
                "run asks (was it started with --num-cpus 0?): train it with the local executor"
            )
        options: dict[str, Any] = {"num_returns": "streaming"}
        if wants_gpu:
            options.update(num_cpus=1, num_gpus=1)
        else:
            options.update(num_cpus=self.cpus_per_run, num_gpus=0)
        if pinned:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=self.cluster.node_id, soft=False
            )
        return options

    # ---- events -------------------------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        """Record what arrived within ``timeout`` seconds, then pass on cancel requests."""
        import ray

        self.check_head_node()
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
            self._end(flight, flight.recorder.failed(message), died=True)
        except rex.RayTaskError as exc:  # our code raised outside the training thread
            self._end(flight, flight.recorder.failed(describe_error(exc.cause or exc)))
        except rex.RayError as exc:  # the process or machine running the task is gone
            self.check_head_node(force=True)  # (or the whole cluster with its head node)
            node = flight.node or "a node it had not reported yet"
            message = f"{SYSTEM_FAILURE.format(node=node)} ({type(exc).__name__})"
            self._end(flight, flight.recorder.failed(message), died=True)
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
            self.cluster.started()
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

    def _end(self, flight: _Flight, status: str, died: bool = False) -> None:
        if self.flights.pop(flight.run_id, None) is not None:
            self.cluster.ended(started=flight.node is not None, died=died)
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
        """Stop what is still in flight (recorded as failed with ``reason``) and let go of the
        cluster (`ClusterWatch.close`)."""
        import ray

        for flight in list(self.flights.values()):
            with contextlib.suppress(Exception):
                if not self.cluster.head_node_lost:
                    ray.cancel(flight.stream, force=True)
            flight.recorder.failed(reason or "stopped: the Ray worker ended")
        self.flights.clear()
        self.cluster.close()


class _CannotStart(Exception):
    """A claimed run that this cluster cannot train (its message is the run's error)."""


def _is_data_file(name: str) -> bool:
    """Whether a data name is a local file (not a built-in or a GLUE task)."""
    from analysis.data.builtin import BUILTIN_DATA

    key = name.strip().lower()
    return key not in BUILTIN_DATA and not key.startswith("glue/")


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
