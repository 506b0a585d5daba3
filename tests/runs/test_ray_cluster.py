"""Ray clusters that fail loudly, on a real cluster of separate processes (``ray start --head`` on
127.0.0.1 in a temporary folder, with a token of its own; `ray_head_node`): the handshake before
anything is queued (not Ray, auth refused, no token, version mismatch), a Ray worker that gives up
at once and honours SIGTERM, losing the head node with runs in flight, and the local cluster that
tunescope starts listening on 127.0.0.1 only (``ss -ltn``)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray_head_node
import waiting

from analysis.config import DataSpec, ModelSpec
from analysis.runs.db import RunsDB
from analysis.runs.queue import pid_alive
from analysis.runs.ray_cluster import node_label
from analysis.runs.ray_executor import RayUnavailable, check_address
from analysis.runs.worker import RAY, worker_pid
from tunescope.cli import main

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
# Deadlines, not durations: Ray's processes start slowly on a busy machine.
wait_for = functools.partial(waiting.wait_for, timeout=300.0)


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    """A head node that the module's handshake tests share (the head-node-loss test starts its
    own)."""
    cluster = ray_head_node.start_head_node(tmp_path_factory.mktemp("rh", numbered=True))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def root() -> Path:
    return Path(os.environ["TUNESCOPE_CACHE"])


def with_env(monkeypatch, env: dict[str, str]) -> None:
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        if key in env:
            monkeypatch.setenv(key, env[key])
        else:
            monkeypatch.delenv(key, raising=False)


def tiny_config(model_dir: Path, steps: int, seed: int = 0):
    from analysis.finetune.config import FinetuneConfig

    return FinetuneConfig(
        model=ModelSpec(str(model_dir)),
        data=DataSpec("movie-snippets"),
        method="layers",
        layers=(1, 1, 2),
        steps=steps,
        batch_size=4,
        n_train=32,
        n_eval=16,
        eval_every=2,
        seed=seed,
        device="cpu",
    )


# -- fake servers: a port that is open but is not Ray ---------------------------------------------


@contextlib.contextmanager
def fake_server(kind: str):
    """``silent``: accepts connections and never answers; ``http``: answers as an HTTP/1 server;
    ``page``: Python's own HTTP/1 server (it answers HTTP/2's preface with an HTML page alone);
    ``binary``: answers bytes of no known protocol."""
    if kind == "page":
        with http_server() as address:
            yield address
        return
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if kind in ("http", "binary"):
                answer = {
                    "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                    "binary": bytes(range(0xF0, 0x100)),
                }[kind]
                with conn, contextlib.suppress(OSError):
                    conn.recv(4096)
                    conn.sendall(answer)
            else:
                held.append(conn)  # open, silent

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for conn in held:
            conn.close()


@contextlib.contextmanager
def http_server():
    """Python's ``http.server`` on loopback, in a thread."""
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- the handshake ----------------------------------------------------------------------------------


def test_the_handshake_accepts_a_ray_head_node_with_its_token(head_node, monkeypatch):
    with_env(monkeypatch, head_node.env())
    started = time.monotonic()
    assert check_address(head_node.address) == head_node.address
    assert time.monotonic() - started < 15


def test_a_wrong_token_is_auth_refused(head_node, monkeypatch):
    with_env(monkeypatch, head_node.env(RAY_AUTH_TOKEN="0" * 32))
    with pytest.raises(RayUnavailable, match="refused this machine's authentication token"):
        check_address(head_node.address)


def test_no_token_for_a_cluster_that_wants_one(head_node, monkeypatch):
    with_env(monkeypatch, {})  # no RAY_AUTH_MODE: Ray sends no token to an explicit address
    with pytest.raises(RayUnavailable, match="requires token authentication and this machine"):
        check_address(head_node.address)


def test_a_cluster_of_another_ray_version_is_refused(head_node, monkeypatch):
    """The head node's metadata (what ray.init compares) says Ray 2.59.0: refused, before
    ray.init."""
    with_env(monkeypatch, head_node.env())
    script = (
        "import json, sys\n"
        "from ray._raylet import GcsClient\n"
        "c = GcsClient(address=sys.argv[1])\n"
        "old = c.internal_kv_get(b'CLUSTER_METADATA', namespace=b'cluster')\n"
        "meta = json.loads(sys.argv[2]) if len(sys.argv) > 2 else dict(json.loads(old), "
        "ray_version='2.59.0')\n"
        "c.internal_kv_put(b'CLUSTER_METADATA', json.dumps(meta).encode(), True, "
        "namespace=b'cluster')\n"
        "print(old.decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, head_node.address], env=head_node.env(), capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    original = done.stdout.strip().splitlines()[-1]
    try:
        with pytest.raises(RayUnavailable, match=r"runs Ray 2\.59\.0 on Python .*Ray 2\.60\.0"):
            check_address(head_node.address)
    finally:
        subprocess.run(
            [sys.executable, "-c", script, head_node.address, original], env=head_node.env(),
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
    assert check_address(head_node.address) == head_node.address


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("silent", "accepts connections but does not answer"),
        ("http", "answers in HTTP/1"),
        ("page", "answers in HTTP/1"),
        ("binary", "answers in a protocol other than HTTP/2"),
    ],
)
def test_an_open_port_that_is_not_ray_queues_nothing(kind, said, tiny_bert_dir, capsys):
    with fake_server(kind) as address:
        with pytest.raises(RayUnavailable, match=said):
            check_address(address)
        argv = [
            "sweep", "--model", str(tiny_bert_dir), "--strategies", "down", "--l-star", "1",
            "--seeds", "0", "--steps", "2", "--device", "cpu", "--executor", "ray",
            "--ray-address", address,
        ]  # fmt: skip
        started = time.monotonic()
        assert main(argv) == 2
        assert time.monotonic() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {address} ") and said in err[0], err
    assert "b'" not in err[0] and 'b"' not in err[0], err  # words, not raw bytes
    assert RunsDB().list_runs().empty


def test_a_ray_worker_on_a_port_that_is_not_ray_exits_at_once_and_on_sigterm(root, tiny_bert_dir):
    """The worker gives up within seconds (no minutes of Ray retries), leaves the queue as it
    was, and SIGTERM ends it promptly while it checks."""
    db = RunsDB()
    queued = db.enqueue(tiny_config(tiny_bert_dir, steps=2))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "analysis.runs.worker", "--executor", "ray"]
    with fake_server("silent") as address:
        started = time.monotonic()
        done = subprocess.run(
            [*command, "--ray-address", address], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and time.monotonic() - started < 15, done.stdout
        assert "does not answer" in done.stdout and "The queued runs stay queued" in done.stdout
        assert db.get_run(queued)["status"] == "queued"
        worker = subprocess.Popen(
            [*command, "--ray-address", address], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # (python start-up, then the check)
        stopped = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=10) != 0 and time.monotonic() - stopped < 5
    assert db.get_run(queued)["status"] == "queued"


# -- losing the head node --------------------------------------------------------------------------


def test_losing_the_head_node_fails_the_runs_in_flight_and_claims_nothing_more(
    root, tiny_bert_dir, tmp_path_factory
):
    """Kill the head node's GCS and raylet while a run trains there: that run fails "lost the Ray
    cluster's head node at ADDR" with its steps kept, the run queued behind it stays queued, and the
    Ray worker exits on its own with one clear line and status 2 (long before Ray's own 60 s).
    The worker's parent lives on here, as under the dashboard's server."""
    cluster = ray_head_node.start_head_node(tmp_path_factory.mktemp("rh", numbered=True))
    worker = None
    try:
        db = RunsDB()
        doomed = db.enqueue(tiny_config(tiny_bert_dir, steps=100_000))
        behind = db.enqueue(tiny_config(tiny_bert_dir, steps=2, seed=1))
        log = root / "worker.log"
        root.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "analysis.runs.worker", "--executor", "ray", "--ray-address",
            cluster.address, "--ray-cpus-per-run", "2", "--idle-timeout", "60",
        ]  # fmt: skip
        with open(log, "ab") as out:
            worker = subprocess.Popen(
                command, cwd=ROOT, env=cluster.env(PYTHONPATH=str(ROOT)), stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(lambda: len(db.steps(doomed, kind="train")) >= 3, what="steps", log=log)
        device = db.get_run(doomed)["device"]
        assert re.fullmatch(rf"ray:{re.escape(HOST)}/127\.0\.0\.1/[0-9a-f]{{8}} cpu", device)
        assert db.get_run(behind)["status"] == "queued"  # one slot: 2 CPUs per run
        kept = len(db.steps(doomed))
        lost_at = time.monotonic()
        cluster.kill("gcs_server", "raylet")
        try:
            code = worker.wait(timeout=45)
        except subprocess.TimeoutExpired:  # (the worker's log says where it stood)
            code = None
        assert code == 2, log.read_text()[-3000:]
        assert time.monotonic() - lost_at < 30
        run = db.get_run(doomed)
        assert run["status"] == "failed", run
        assert run["error"] == f"lost the Ray cluster's head node at {cluster.address}"
        assert len(db.steps(doomed)) >= kept
        assert db.get_run(behind)["status"] == "queued"  # not claimed, not used up
        text = log.read_text()
        assert f"error: Lost the Ray cluster's head node at {cluster.address}" in text
        assert "The queued runs stay queued" in text
        assert text.rstrip().endswith("exit status 2"), text[-3000:]
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        cluster.stop()


def test_a_worker_that_sweep_started_says_its_last_word_after_losing_the_head_node(
    root, tiny_bert_dir, tmp_path_factory, tmp_path
):
    """``sweep`` starts the Ray worker detached and exits, so the worker runs on orphaned (its
    parent is init): there Ray's client ends the process itself as soon as it writes to a local
    raylet that is gone. Kill the head node: the run in flight fails with its steps kept, the run
    behind it stays queued, and worker.log ends with the error, the count of runs and the exit
    status, 2."""
    cluster = ray_head_node.start_head_node(tmp_path_factory.mktemp("rh", numbered=True))
    log, out = root / "worker.log", tmp_path / "sweep.json"
    pid = None
    try:
        argv = [
            sys.executable, "-m", "tunescope", "sweep", "--model", str(tiny_bert_dir),
            "--strategies", "down", "--l-star", "1", "--seeds", "0", "--steps", "100000",
            "--batch-size", "4", "--n-train", "32", "--n-eval", "8", "--eval-every", "2",
            "--device", "cpu", "--executor", "ray", "--ray-address", cluster.address,
            "--ray-cpus-per-run", "2", "--json", str(out),
        ]  # fmt: skip
        env = cluster.env(PYTHONPATH=str(ROOT), TUNESCOPE_WORKER_IDLE_S="120")
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        pid = worker_pid(root, RAY)
        assert pid is not None and pid_alive(pid), log.read_text()[-3000:]
        ids = [run["run_id"] for run in json.loads(out.read_text())["runs"]]
        db = RunsDB()
        doomed = wait_for(
            lambda: next((i for i in ids if len(db.steps(i, kind="train")) >= 3), None),
            what="steps of the first run",
            log=log,
        )
        (behind,) = set(ids) - {doomed}
        assert db.get_run(behind)["status"] == "queued"  # one slot: 2 CPUs per run
        parent = _parent(pid)
        kept = len(db.steps(doomed))
        lost_at = time.monotonic()
        cluster.kill("gcs_server", "raylet")
        wait_for(lambda: not pid_alive(pid), what="the worker to exit", log=log)
        took = time.monotonic() - lost_at
        said = [
            line.split("] ", 1)[1]
            for line in log.read_text().splitlines()
            if f"[worker {pid}] " in line
        ]
        assert said[-3:] == [
            "exiting after 1 run",
            f"error: Lost the Ray cluster's head node at {cluster.address}: its runs in flight "
            "failed. The queued runs stay queued.",
            "exit status 2",
        ], f"(parent {parent}, {took:.1f} s after the kill)\n" + "\n".join(said[-8:])
        assert took < 30, took
        run = db.get_run(doomed)
        assert run["status"] == "failed"
        assert run["error"] == f"lost the Ray cluster's head node at {cluster.address}"
        assert len(db.steps(doomed)) >= kept
        assert db.get_run(behind)["status"] == "queued"
        assert db.pragma("integrity_check") == "ok"
    finally:
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        cluster.stop()


def _parent(pid: int) -> int | None:
    """The parent pid of ``pid`` (None once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


# -- loopback only, and the node's name -----------------------------------------------------------------


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(local address, pid) of every TCP socket listening, of the processes ``pids``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in pids:
                found.append((fields[3], pid))
    return found


def test_the_local_cluster_tunescope_starts_listens_on_loopback_only(ray_cluster):
    """The session's cluster is `connect(LOCAL_CLUSTER)`'s, as a Ray worker without an address starts
    it: its GCS, raylet, workers and this driver listen on 127.0.0.1 alone."""
    assert ray_cluster.startswith("127.0.0.1:")
    pids = {os.getpid(), *ray_head_node.descendants(os.getpid())}
    listening = _listening(pids)
    assert len(listening) >= 3, listening  # at least the GCS, the raylet and this driver
    outward = [(a, p) for a, p in listening if not re.match(r"^(\[::ffff:)?127\.", a)]
    assert outward == [], outward
    assert any(a.endswith(ray_cluster.split(":")[1]) for a, _ in listening)


def test_node_label_names_host_address_and_node():
    assert node_label("vm", "10.0.0.5", "0d2c937b981f66c4ca") == "vm/10.0.0.5/0d2c937b"
    assert node_label("vm", None, None) == "vm/?/?"
    assert json.dumps(node_label("a", "b", "c")) == '"a/b/c"'
