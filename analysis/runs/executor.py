"""Where queued runs train: the executor choice of the page and the CLI (`ExecutorChoice`).

Kept apart from the worker so the CLI's option parser (and ``--help``) can read its help texts
without loading the runs database; `analysis.runs.worker.start_workers` acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.config import setting

LOCAL_WORKERS = "local"  # the executor: worker processes on this machine
RAY = "ray"  # the executor: a Ray cluster
EXECUTORS = (LOCAL_WORKERS, RAY)


@dataclass(frozen=True)
class ExecutorChoice:
    """Train queued runs on this machine (one worker process per device) or on a Ray cluster
    (`analysis.runs.ray_executor`)."""

    executor: str = setting(
        LOCAL_WORKERS,
        help="local: worker processes on this machine, one per device; ray: a Ray cluster",
    )
    ray_address: str | None = setting(
        None,
        help="HOST:PORT of the Ray cluster's head node (default: $RAY_ADDRESS, else a local "
        "Ray cluster on this machine)",
    )
    cpus_per_run: int = setting(
        1, help="CPUs each run asks of a Ray cluster without GPUs (with GPUs: one GPU per run)"
    )
    device: str | None = setting(None, help="local: start only this device's worker")
    cpu_workers: int | None = setting(
        None,
        help="local, CPU: worker processes that train at once, the cores shared out among them "
        "(default: $TUNESCOPE_CPU_WORKERS, else one per core for models up to 50 M parameters "
        "and one with every core above)",
    )

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(
                f"Unknown executor {self.executor!r}: choose one of {', '.join(EXECUTORS)}."
            )
        if isinstance(self.cpus_per_run, bool) or not isinstance(self.cpus_per_run, int):
            raise ValueError(f"CPUs per run must be a whole number (got {self.cpus_per_run!r}).")
        if self.cpus_per_run < 1:
            raise ValueError(f"CPUs per run must be at least 1 (got {self.cpus_per_run}).")
        if self.executor == RAY and self.device not in (None, "", "cpu"):
            raise ValueError(
                f"--device {self.device} picks a device of this machine; on a Ray cluster Ray "
                "assigns one GPU per run (give --device cpu to train on CPUs there)."
            )
        if self.cpu_workers is not None and (
            isinstance(self.cpu_workers, bool)
            or not isinstance(self.cpu_workers, int)
            or self.cpu_workers < 1
        ):
            raise ValueError(f"CPU workers must be a whole number ≥ 1 (got {self.cpu_workers!r}).")
        if self.ray_address is not None and not isinstance(self.ray_address, str):
            raise ValueError("The Ray address must be text such as HOST:6379.")
