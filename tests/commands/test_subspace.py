"""``python -m tunescope subspace``: the JSON schema, run ids, disable files, clear errors."""

from __future__ import annotations

import json

import torch
from transformers import AutoModel

from analysis.models import encoder_layers
from analysis.runs.db import RunsDB
from analysis.subspace import trajectory
from tunescope.cli import main


def record_bert(folder, model_dir, t=4):
    model = AutoModel.from_pretrained(model_dir)
    layers = encoder_layers(model)
    rec = trajectory.TrajectoryRecorder(
        folder, layers, every=1, prefixes=trajectory.layer_prefixes(model, layers)
    )
    rec.maybe_record(0)
    g = torch.Generator().manual_seed(0)
    for step in range(1, t + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=g))
            # a planted spike: one query weight keeps moving a lot
            model.encoder.layer[0].attention.self.query.weight[4, 9] += 0.5
        rec.maybe_record(step)
    rec.close()
    return model


def finished_run(db: RunsDB, result: dict) -> str:
    run_id = db.enqueue({"model": {"name": "tiny"}, "data": {"name": "x"}, "method": "full"})
    db.claim_next(worker_pid=1)
    assert db.finish(run_id, result)
    return run_id


def test_cli_report_schema_by_run_id_and_disable_files(tmp_path, tiny_bert_dir, capsys):
    record_bert(tmp_path / "traj", tiny_bert_dir)
    run_id = finished_run(RunsDB(), {"score": 0.5, "trajectory_dir": str(tmp_path / "traj")})
    out = tmp_path / "report.json"
    assert main(["subspace", "--run", run_id, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["t"] == 4 and report["run"] == run_id
    assert [layer["layer"] for layer in report["layers"]] == [1, 2]
    first = report["layers"][0]
    assert len(first["singular_values"]) == 4 and first["rank"] >= 1
    assert {"param", "row", "col", "value"} <= set(first["outliers"][0])
    top = first["outliers"][0]
    assert (top["param"], top["row"], top["col"]) == ("attention.self.query.weight", 4, 9)
    assert top["hidden_dim"] == 9 and top["kind"] == "query"
    assert isinstance(report["recurring"], list)
    assert "layer" in capsys.readouterr().out

    zero = tmp_path / "zero.json"
    assert main(["subspace", "--run", str(tmp_path / "traj"), "--write-disable", str(zero)]) == 0
    positions = json.loads(zero.read_text())
    assert [4, 9] in positions["encoder.layer.0.attention.self.query.weight"]
    n = sum(map(len, positions.values()))
    rand = tmp_path / "rand.json"
    args = ["subspace", "--run", run_id, "--write-disable", str(rand), "--random", "--seed", "3"]
    assert main(args) == 0
    assert sum(map(len, json.loads(rand.read_text()).values())) == n


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    run_id = finished_run(RunsDB(), {"score": 0.5})
    assert main(["subspace", "--run", run_id]) == 2
    assert "recorded no trajectory" in capsys.readouterr().err
    assert main(["subspace", "--run", "no-such-run"]) == 2
    assert "matches no run" in capsys.readouterr().err
    assert main(["subspace", "--run", "x", "--random"]) == 2
    assert "--write-disable" in capsys.readouterr().err
