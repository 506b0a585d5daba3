"""A Ray cluster of separate processes for the tests: ``ray start --head`` on 127.0.0.1 in a
temporary folder, with its own token, stopped by the PIDs of its processes (never ``ray stop``,
which would stop every Ray cluster of this machine)."""

from __future__ import annotations

import contextlib
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Head:
    address: str
    temp_dir: Path
    token: str

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose Ray clients present this cluster's token."""
        env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        env.update(extra)
        return env

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


def start_head(temp_dir: Path, num_cpus: int = 2) -> Head:
    """``ray start --head`` on 127.0.0.1 (tunescope's loopback setting) with a token of its own."""
    port, token = free_port(), secrets.token_hex(16)
    head = Head(f"127.0.0.1:{port}", temp_dir, token)
    env = head.env(**{LOOPBACK_ENV: "0", "RAY_USAGE_STATS_ENABLED": "0"})
    command = [
        str(RAY), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
        "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus), "--num-gpus", "0",
        "--include-dashboard", "false", "--disable-usage-stats",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        head.stop()
        raise RuntimeError(f"ray start --head failed:\n{done.stdout}\n{done.stderr}")
    return head
