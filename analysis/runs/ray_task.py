"""The task side of the Ray executor: one run trained on a node, in a Ray worker process.

`train_stream` is the function `analysis.runs.ray_executor.RayRunner` submits as a Ray task (a
streaming generator): it trains the run with the same engine as the local executor and yields
what happens as small plain dicts, which the driver hands to the runs database's recorder. It
never touches the database or the driver's files: what it needs from the driver's machine comes
as arguments (the data file's bytes, absolute paths on a pinned node).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.runs.execute import ModelCache, describe_error

if TYPE_CHECKING:
    from analysis.finetune.config import FinetuneConfig

_MODELS = ModelCache()  # per Ray worker process: a sweep on one model loads it once per process
PROGRESS_EVERY_S = 0.5


def train_stream(
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
    """The training thread of `train_stream`: every callback becomes an event."""
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
