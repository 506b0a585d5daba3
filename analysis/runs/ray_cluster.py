"""Talking to a Ray cluster before using it, and keeping the clusters tunescope starts on loopback.

`handshake` is what runs before anything is queued (and before a Ray worker connects): it
checks, each within a short timeout, that

1. the address takes a TCP connection (else: unreachable);
2. what answers there speaks HTTP/2, as a Ray head node's GCS (gRPC) port does: a port that accepts
   the connection but never answers, or answers in another protocol, is "not a Ray cluster";
3. the Ray handshake itself succeeds, in a short-lived process (so the page and the CLI never
   load Ray's C++ client, whose own retries last minutes): the GCS hands out its cluster id and
   its metadata. There an authentication failure ("auth refused") and a Ray or Python version
   other than this machine's ("version mismatch") are told apart.

Each failure is one `RayUnavailable` sentence that says what is wrong and what to do.

`loopback_only` is the setting that keeps a Ray cluster on 127.0.0.1: Ray rewrites a loopback
node address to the machine's outward interface address (``ray._private.services
.resolve_ip_for_localhost``) unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and then its gRPC
servers listen on every interface. With the setting, the node address stays 127.0.0.1 and every
server of the cluster (GCS, raylet, workers) listens there only. The Ray worker applies it to
the cluster it starts itself (`analysis.runs.ray_executor.LOCAL_CLUSTER`) and when it connects to a
cluster at a loopback address (whose head node was started with it, or it would not be on loopback).

`head_node_alive` is the Ray worker's cheap look at the head node while runs are in flight: a TCP
connection to its GCS port, within a second. `one_line_ray_messages` keeps Ray's own processes
to one line per note in the worker's log (their log files, such as a raylet's crash dump, stay
in Ray's logs).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONNECT_TIMEOUT_S = 3.0  # TCP connect, then the HTTP/2 answer
HANDSHAKE_TIMEOUT_S = 20.0  # the Ray handshake process, start-up included
HEAD_NODE_TIMEOUT_S = 1.0
RAY_PROCESSES = ("raylet", "gcs_server")  # the names a driver's output gives their messages
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray keeps a loopback node address
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# A client's HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS = 4
AUTH_HELP = (
    "the cluster's token goes in RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH or "
    "~/.ray/auth_token (`ray get-auth-token` on the head node prints it), with RAY_AUTH_MODE=token"
)
GIVE_THE_HEAD_NODE = (
    "give the address `ray start --head` printed on the head node (HOST:6379 by default)"
)


class RayUnavailable(ValueError):
    """Ray is not installed, or the cluster at an address cannot be reached or used."""


class HeadNodeLost(RayUnavailable):
    """The Ray cluster's head node went away while this process used the cluster."""


# -- loopback ---------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_only() -> None:
    """Keep every Ray cluster this process starts or joins on 127.0.0.1 (module docstring).

    Set in the environment (for Ray's child processes and ``ray start``) and in Ray's constants,
    should Ray be imported already (it reads the variable once, at import).
    """
    os.environ[LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


# -- what Ray's own processes say ----------------------------------------------------------------


def one_line_ray_messages() -> None:
    """Keep Ray's own processes to one line per message in this driver's output.

    A Ray driver prints, line by line, what the raylets and the GCS write to their log files (a
    raylet's crash dump: dozens of lines, some printed again later as "[repeated 2x across
    cluster]") and the notes they send the driver (a node marked dead, with its raylet's last 20
    log lines). For the Ray worker that output is worker.log. Here the log files' lines are left
    where they are (``logs/raylet*.err`` and ``gcs_server*.err`` in the node's session folder)
    and each note prints as its first line; what the tasks print passes whole. Ray has no
    setting for it: its driver prints all of these through
    ``ray._private.worker.print_worker_logs``, which this wraps, once per process.
    """
    from ray._private import worker as ray_worker

    original = ray_worker.print_worker_logs
    if getattr(original, "one_line", False):
        return

    def print_worker_logs(data: dict, print_file: Any, ignore_prefix: bool = False) -> None:
        if data.get("pid") in RAY_PROCESSES:
            if "ip" in data:  # lines of the process's log file (a note has no address)
                return
            data = {**data, "lines": one_line(data.get("lines", []))}
        original(data, print_file, ignore_prefix)

    print_worker_logs.one_line = True
    ray_worker.print_worker_logs = print_worker_logs


def one_line(lines: list[str]) -> list[str]:
    """``lines`` (each maybe of several lines) as their first non-blank line, with how many lines
    it stands for."""
    texts = [line.strip() for text in lines for line in str(text).splitlines() if line.strip()]
    if len(texts) <= 1:
        return texts
    return [f"{texts[0]} (+{len(texts) - 1} lines in Ray's logs)"]


# -- the handshake ----------------------------------------------------------------------------


def handshake(host: str, port: int, address: str) -> dict:
    """The cluster's metadata (``ray_version``, ``python_version``, ``cluster_id``) once the
    three steps of the module docstring pass; a `RayUnavailable` saying which one failed."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayUnavailable(
            f"Cannot reach the Ray cluster at {address} ({reason}): start its head node there "
            f"with `ray start --head`, or check the address and port."
        ) from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
            _speaks_http2(sock, address)
    return _ray_handshake(address)


def _speaks_http2(sock: socket.socket, address: str) -> None:
    """Send HTTP/2's preface; a gRPC server answers with its SETTINGS frame at once."""
    try:
        sock.sendall(HTTP2_PREFACE)
        answer = b""
        while len(answer) < 9:
            chunk = sock.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
    except TimeoutError:
        raise RayUnavailable(
            f"{address} accepts connections but does not answer within {CONNECT_TIMEOUT_S:g} s: "
            f"it is not the port of a Ray cluster's head node; {GIVE_THE_HEAD_NODE}."
        ) from None
    except OSError as exc:
        answer = b""
        if not isinstance(exc, ConnectionResetError):
            raise RayUnavailable(f"Cannot talk to the Ray cluster at {address}: {exc}.") from None
    if len(answer) == 9 and answer[3] == HTTP2_SETTINGS:
        return
    if not answer:
        what = "closes the connection without a word"
    elif answer.startswith((b"HTTP/", b"<")):
        # An HTTP/1 server answers a status line, or (reading "PRI * HTTP/2.0" as a request of
        # the oldest HTTP, as Python's http.server does) an HTML error page alone.
        what = "answers in HTTP/1 (a web server?)"
    else:
        what = "answers in a protocol other than HTTP/2"
    raise RayUnavailable(
        f"{address} is not a Ray cluster: it {what}, where a Ray head node speaks gRPC; "
        f"{GIVE_THE_HEAD_NODE}."
    )


def _ray_handshake(address: str) -> dict:
    """Step 3, in a short-lived process (`main`), bounded by ``HANDSHAKE_TIMEOUT_S``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    command = [sys.executable, "-m", "analysis.runs.ray_cluster", address]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=HANDSHAKE_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise RayUnavailable(
            f"The Ray cluster at {address} did not finish Ray's handshake within "
            f"{HANDSHAKE_TIMEOUT_S:g} s: is it a Ray head node's port, and is the head node "
            "healthy?"
        ) from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        detail = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise RayUnavailable(f"Ray's handshake with {address} failed: {detail}") from None
    problem = answer.get("problem")
    if problem is None:
        return answer
    detail = str(answer.get("detail", "")).split(". Note:")[0]
    if problem == "auth":
        if not answer.get("token_sent"):
            raise RayUnavailable(
                f"The Ray cluster at {address} requires token authentication and this machine "
                f"sent no token: {AUTH_HELP}."
            )
        raise RayUnavailable(
            f"The Ray cluster at {address} refused this machine's authentication token "
            f"(a wrong token): {AUTH_HELP}."
        )
    if problem == "version":
        raise RayUnavailable(
            f"The Ray cluster at {address} runs Ray {answer['ray_version']} on Python "
            f"{answer['python_version']}; this machine has Ray {answer['our_ray']} on Python "
            f"{answer['our_python']}: every node needs the same Ray and Python (tunescope pins "
            f"ray=={answer['our_ray']})."
        )
    raise RayUnavailable(
        f"{address} answers gRPC but not as a Ray cluster's head node: {detail or problem}; "
        f"{GIVE_THE_HEAD_NODE}."
    )


def _handshake_here(address: str) -> dict:
    """Step 3 itself (in the handshake process): what `_ray_handshake` reads back."""
    from ray import exceptions as rex
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray._raylet import AuthenticationTokenLoader, GcsClient

    if address in (None, "auto"):  # as ray.init: only a found local cluster enables auth
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    sent = bool(AuthenticationTokenLoader.instance().has_token())
    ours = importlib.metadata.version("ray"), ".".join(map(str, sys.version_info[:3]))
    try:
        client = GcsClient(address=address)
        raw = client.internal_kv_get(b"CLUSTER_METADATA", namespace=b"cluster", timeout=5)
    except rex.AuthenticationError as exc:
        return {"problem": "auth", "detail": str(exc), "token_sent": sent}
    except Exception as exc:
        return {"problem": "rpc", "detail": f"{type(exc).__name__}: {exc}"}
    try:
        metadata = json.loads(raw or b"{}")
    except ValueError:
        metadata = {}
    if "ray_version" not in metadata:
        return {"problem": "rpc", "detail": "it has no Ray cluster metadata"}
    theirs = metadata["ray_version"], str(metadata.get("python_version", "?"))
    answer = {
        "ray_version": theirs[0],
        "python_version": theirs[1],
        "our_ray": ours[0],
        "our_python": ours[1],
        "cluster_id": client.cluster_id.hex(),
    }
    # Ray's own rule (ray.init refuses the same): the same Ray, and Python to the patch level.
    if theirs[0] != ours[0] or theirs[1] != ours[1]:
        answer["problem"] = "version"
    return answer


def head_node_alive(address: str, timeout: float = HEAD_NODE_TIMEOUT_S) -> bool:
    """Whether the head node's GCS port at ``address`` (HOST:PORT) still takes a connection."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def terminate_at_once() -> Iterator[None]:
    """SIGTERM ends this process at once while inside (Ray's C++ connect can block for minutes
    and a Python handler would only run after it); only from the main thread, else a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def node_label(host: str, ip: str | None, node_id: str | None) -> str:
    """How a Ray node is named in the device column and messages: ``host/ip/node-id-prefix``
    (two nodes on one machine share the host name and address, never the node id)."""
    parts = [host, ip or "?", (node_id or "?")[:8]]
    return "/".join(parts)


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.runs.ray_cluster ADDRESS``: Ray's handshake with the cluster at
    ADDRESS, as one JSON line (`_ray_handshake` runs it)."""
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(_handshake_here(args[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
