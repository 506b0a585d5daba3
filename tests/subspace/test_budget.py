"""The trajectory budget: the automatic snapshot interval and the disk-size estimate."""

from __future__ import annotations

import pytest
import torch

from analysis.finetune.config import FinetuneConfig
from analysis.subspace.budget import (
    MAX_SNAPSHOTS,
    auto_every,
    resolve_every,
    snapshot_count,
    trajectory_bytes,
)
from analysis.subspace.trajectory import TrajectoryRecorder


@pytest.mark.parametrize(
    "steps, every, t",
    [(1, 1, 1), (32, 1, 32), (33, 2, 16), (150, 5, 30), (200, 7, 28), (10_000, 313, 31)],
)
def test_auto_every_keeps_at_most_32_snapshots(steps, every, t):
    assert auto_every(steps) == every
    assert snapshot_count(steps, every) == t <= MAX_SNAPSHOTS


def test_auto_in_the_config_and_bad_values():
    assert FinetuneConfig(steps=150, trajectory_every="auto").trajectory_every == 5
    assert FinetuneConfig(steps=150, trajectory_every=6).trajectory_every == 6
    assert FinetuneConfig(steps=150).trajectory_every is None  # off unless asked
    assert resolve_every(" AUTO ", 64) == 2
    with pytest.raises(ValueError, match="'auto'"):
        FinetuneConfig(trajectory_every="often")
    with pytest.raises(ValueError, match="positive"):
        auto_every(0)


def test_the_estimate_matches_what_the_recorder_writes(tmp_path):
    layers = [torch.nn.Linear(30, 20), torch.nn.Linear(20, 10)]  # 620 and 210 parameters
    steps, every = 9, auto_every(9, max_snapshots=4)  # k = 3: θ_0 and 3 moves
    recorder = TrajectoryRecorder(tmp_path / "t", layers, every=every, dtype="float16")
    for step in range(steps + 1):
        recorder.maybe_record(step)
    info = recorder.close()
    estimate = trajectory_bytes([620, 210], steps, every, "float16")
    assert estimate == 830 * 4 + 3 * 830 * 2
    headers = info["n_snapshots"] * 200  # safetensors headers: a few hundred bytes a file
    assert estimate <= info["bytes_total"] <= estimate + headers
    with pytest.raises(ValueError, match="dtype"):
        trajectory_bytes([1], 2, 1, "int8")
