"""bench/gpu_check.py's --smoke path: every stage of the GPU check runs on the CPU at toy sizes.

This is the only run the GPU script gets on a machine without a GPU; it drives extraction in three
precisions, head statistics, a step of every fine-tuning method, the trajectory SVD and the large
random encoder, so a broken stage shows here rather than on a borrowed GPU. (~15 s: the streamed
metrics of the large stage are left out, tests/layers/test_streamed.py covers them.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gpu_check


def test_smoke_runs_every_stage(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a crowded 2-core machine: see tests/finetune/test_engine.py
    try:
        status = gpu_check.main(
            ["--smoke", "--skip-large-metrics", "--workdir", str(tmp_path), "--json",
             str(tmp_path / "gpu.json")]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "gpu.json").read_text())
    failed = {k: v.get("error") for k, v in report["stages"].items() if not v["ok"]}
    assert status == 0 and not failed, failed
    stages = report["stages"]
    methods = {k.removeprefix("finetune_") for k in stages if k.startswith("finetune_")}
    from analysis.finetune.registry import method_names

    assert methods == set(method_names())
    assert {"extraction_float32", "extraction_bfloat16", "heads", "trajectory_svd"} <= set(stages)
    assert stages["large_bfloat16"]["n"] == gpu_check.SMOKE.large_n
    assert f"{len(stages)} of {len(stages)} stages passed" in capsys.readouterr().out
