"""Ray clusters of separate processes for the tests, on 127.0.0.1 in a temporary folder:

- `start_head_node`: ``ray start --head`` with a token of its own, stopped by the PIDs of its
  processes (never ``ray stop``, which would stop every Ray cluster of this machine);
- `start_two_nodes`: a head node and a worker node (``ray.cluster_utils.Cluster``, held by a helper
  process: ``ray start --address`` refuses a second node on loopback), whose worker node the
  test can lose (`TwoNodes.lose_worker_node`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from analysis.runs.ray_cluster import LOOPBACK_ENV

RAY = Path(sys.executable).with_name("ray")


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children…)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def token_env(token: str, **extra: str) -> dict[str, str]:
    """This process's environment, with ``extra``, in which Ray clients present ``token`` (not
    the token of ``~/.ray``, which a local cluster of this machine may have written)."""
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class HeadNode:
    address: str
    temp_dir: Path
    token: str

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose Ray clients present this cluster's token."""
        return token_env(self.token, **extra)

    def pids(self, *names: str) -> list[int]:
        """PIDs of this cluster's processes (their command lines name its folder), optionally
        only those whose command line starts with one of ``names``."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                if str(self.temp_dir) in cmdline and (
                    not names or any(Path(cmdline.split("\0")[0]).name == n for n in names)
                ):
                    found.append(int(entry.name))
        return found

    def kill(self, *names: str) -> None:
        for pid in self.pids(*names):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Every process of the cluster, by PID (and whatever they started is then orphaned
        and ends with them: Ray's workers exit when their raylet goes)."""
        deadline = time.monotonic() + 15
        while self.pids() and time.monotonic() < deadline:
            self.kill()
            time.sleep(0.3)


def start_head_node(temp_dir: Path, num_cpus: int = 2) -> HeadNode:
    """``ray start --head`` on 127.0.0.1 (tunescope's loopback setting) with a token of its own."""
    port, token = free_port(), secrets.token_hex(16)
    head_node = HeadNode(f"127.0.0.1:{port}", temp_dir, token)
    env = head_node.env(**{LOOPBACK_ENV: "0", "RAY_USAGE_STATS_ENABLED": "0"})
    command = [
        str(RAY), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
        "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus), "--num-gpus", "0",
        "--include-dashboard", "false", "--disable-usage-stats",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        head_node.stop()
        raise RuntimeError(f"ray start --head failed:\n{done.stdout}\n{done.stderr}")
    return head_node


# -- two nodes on loopback ---------------------------------------------------------------------


@dataclass
class TwoNodes:
    """A head node and a worker node on 127.0.0.1 (``ray.cluster_utils.Cluster``), each with
    ``num_cpus`` CPUs and a token of their own, built and held by a helper process (`main`):
    ending that process ends both nodes (Ray starts them fate-shared with it)."""

    address: str
    worker_node_id: str
    worker_raylet: int
    token: str
    process: subprocess.Popen

    def lose_worker_node(self) -> set[int]:
        """The worker node dies: its raylet crashes (SIGSEGV, so Ray writes its crash dump) and
        every process under it (its Ray workers, its agents) is killed at the same moment, so
        that none lives on (a training process left behind would finish its run). The raylet
        is stopped first, so it starts nothing more meanwhile. Returns the pids."""
        raylet = self.worker_raylet
        os.kill(raylet, signal.SIGSTOP)
        below = descendants(raylet)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.kill(raylet, signal.SIGSEGV)  # handled as soon as it runs again
        os.kill(raylet, signal.SIGCONT)
        return {raylet, *below}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the helper shuts the cluster down and exits
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_two_nodes(temp_dir: Path, num_cpus: int = 1) -> TwoNodes:
    """`TwoNodes` in ``temp_dir``, once both nodes are up."""
    token = secrets.token_hex(16)
    # RAY_TMPDIR: where `Cluster` writes its address (ray/ray_current_cluster), the test's folder
    # rather than the machine's, where a plain ray.init() would find this test's cluster.
    extra = {LOOPBACK_ENV: "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(temp_dir)}
    env = token_env(token, **extra)
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, str(Path(__file__)), str(temp_dir), str(num_cpus)]
    helper = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = helper.stdout.readline()  # one JSON line once the cluster is up, or EOF
    if not line:
        helper.kill()
        raise RuntimeError(f"the two-node cluster did not start (exit {helper.wait()})")
    found = json.loads(line)
    address, node, raylet = found["address"], found["worker_node_id"], found["worker_raylet"]
    return TwoNodes(address, node, raylet, token, helper)


def main(argv: list[str]) -> None:
    """``python tests/ray_head_node.py TEMP_DIR NUM_CPUS``: build `TwoNodes`' cluster, print its
    address, worker node id and worker raylet pid as one JSON line, and hold it until stdin
    closes."""
    from ray._common.utils import get_default_ray_temp_dir
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    temp_dir, num_cpus = argv[0], int(argv[1])
    # Every node's files go to temp_dir, so nothing creates the folder of the address file.
    Path(get_default_ray_temp_dir()).mkdir(parents=True, exist_ok=True)
    common = {"node_ip_address": "127.0.0.1", "num_cpus": num_cpus, "num_gpus": 0}
    head_node_args = {**common, "temp_dir": temp_dir, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head_node_args)
    node = cluster.add_node(**common)
    cluster.wait_for_nodes()
    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    found = {"address": cluster.address, "worker_node_id": node.node_id, "worker_raylet": raylet}
    print(json.dumps(found), flush=True)
    sys.stdin.read()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
