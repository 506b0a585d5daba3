"""The Subspaces page: a recorded run → spectrum, update map, outliers, comparison, queueing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from apptest_utils import errors, make_app, open_page
from transformers import AutoModel

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.model import EncoderClassifier
from analysis.runs.db import RunsDB
from analysis.subspace import trajectory
from ui.figures import subspace as figures

PAGE = "views/subspace.py"


def widget(elements, label: str):
    return next(w for w in elements if w.label == label)


def recorded_run(tmp_path, model_dir, name: str = "traj", method: str = "full") -> str:
    """A finished run of the tiny model whose trajectory has a planted outlier."""
    model = EncoderClassifier(AutoModel.from_pretrained(model_dir), "bert", 2)
    rec = trajectory.TrajectoryRecorder(tmp_path / name, model.layers, every=1)
    rec.maybe_record(0)
    g = torch.Generator().manual_seed(0)
    for step in range(1, 5):
        with torch.no_grad():
            for p in model.encoder.parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=g))
            for layer in model.layers:  # the same hidden dimension in both layers
                layer.output.dense.weight[3, 5] += 0.3
        rec.maybe_record(step)
    info = rec.close()
    db = RunsDB()
    options = {"subspace_from": "elsewhere"} if method.startswith("subspace") else {}
    cfg = FinetuneConfig.from_dict({"method": method, "trajectory_every": 1, **options}).to_dict()
    cfg["model"]["name"] = str(model_dir)
    run_id = db.enqueue(cfg)
    db.claim_next(worker_pid=1)
    db.finish(run_id, {"score": 0.7, "metric": "accuracy", "trajectory_dir": str(tmp_path / name),
                       "trajectory": info})  # fmt: skip
    return run_id


def test_page_without_runs_offers_to_record_one(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), PAGE)
    assert not errors(at)
    assert any("No completed run" in i.value for i in at.info)


def test_page_shows_spectrum_outliers_and_queues_comparisons(tiny_bert_dir, monkeypatch, tmp_path):
    run_id = recorded_run(tmp_path, tiny_bert_dir)
    import analysis.runs.worker

    monkeypatch.setattr(analysis.runs.worker, "ensure_worker", lambda *a, **k: 4242)
    at = open_page(make_app(tiny_bert_dir, monkeypatch), PAGE)
    assert not errors(at)
    assert at.selectbox(key="sub_run").value == run_id
    # spectrum, update map, recurring dims, and the comparison (the run itself is a 'full' run)
    assert len(at.get("plotly_chart")) == 4
    outliers = at.dataframe[0].value
    top = outliers[outliers["layer"] == 2].iloc[0]
    assert (top["param"], top["row"], top["col"]) == ("output.dense.weight", 3, 5)
    assert top["kind"] == "FFN out" and top["hidden_dim"] == 3
    assert at.get("plotly_chart")[2].proto.spec  # the recurring-dims bar chart
    assert '"3"' in at.get("plotly_chart")[2].proto.spec  # hidden dim 3 recurs in 2 layers
    assert at.dataframe[1].value["group"].tolist() == ["full"]

    form_buttons = [b for b in at.button if "comparison" in b.label.lower()]
    form_buttons[0].click().run()
    assert not errors(at)
    queued = RunsDB().list_runs(status="queued")
    assert len(queued) == 3 * 6  # 3 seeds × (full, intrinsic, random, frozen, 2 disable runs)
    configs = [json.loads(c) for c in queued["config_json"]]
    assert {c["options"]["source"] for c in configs if c["method"] == "subspace"} == {run_id}
    assert all(c["trajectory_every"] is None for c in configs)  # none records a trajectory
    zero_files = {c["zero_weights"] for c in configs if c["zero_weights"]}
    assert len(zero_files) == 4  # the outlier file and one random file per seed
    for path in zero_files:
        assert json.loads(Path(path).read_text())


def test_figures_carry_the_data():
    layers = [{"layer": 1, "explained_variance_ratio": [0.7, 0.2, 0.1]}]
    fig = figures.spectrum(layers)
    assert isinstance(fig, go.Figure)
    assert np.allclose(fig.data[0].y, [0.7, 0.9, 1.0])
    table = pd.DataFrame(
        [{"layer": 1, "index": 50, "n_params": 100, "kind": "query", "param": "q.weight",
          "row": 1, "col": 2, "value": 0.5}]
    )  # fmt: skip
    fig = figures.update_map({1: np.array([1.0, 4.0])}, {1: 2.0}, table)
    assert fig.data[0].z.tolist() == [[0.5, 2.0]] and list(fig.data[1].x) == [0.5]
    summary = pd.DataFrame(
        {"group": ["full", "frozen"], "n_seeds": [3, 1], "score": [0.9, 0.6],
         "score_sem": [0.01, np.nan], "n_trainable": [100, 10]}
    )  # fmt: skip
    fig = figures.comparison(summary, "accuracy")
    assert list(fig.data[0].error_y.array) == [0.01, 0.0]
    fig = figures.recurring_dims([{"hidden_dim": 7, "n_layers": 3, "layers": [1, 2, 3]}])
    assert list(fig.data[0].x) == ["7"]


def test_the_chosen_run_stays_while_other_runs_finish(tiny_bert_dir, monkeypatch, tmp_path):
    first = recorded_run(tmp_path, tiny_bert_dir, "a")
    second = recorded_run(tmp_path, tiny_bert_dir, "b")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), PAGE)
    assert at.selectbox(key="sub_run").value == second  # the newest plain run
    at.selectbox(key="sub_run").set_value(first).run()
    # Two more runs finish: a plain one and a subspace run with its own trajectory.
    recorded_run(tmp_path, tiny_bert_dir, "c")
    recorded_run(tmp_path, tiny_bert_dir, "d", method="subspace-random")
    at.run()
    assert not errors(at)
    assert at.selectbox(key="sub_run").value == first
    assert len(at.selectbox(key="sub_run").options) == 4
    at.switch_page("views/data.py").run()
    at.switch_page(PAGE).run()
    assert at.selectbox(key="sub_run").value == first  # and across page switches
    # Its trajectory gone (deleted on the Runs page): a message, and another run.
    shutil.rmtree(tmp_path / "a")
    at.run()
    assert any(f"Run {first} is no longer available" in w.value for w in at.warning)
    assert at.selectbox(key="sub_run").value != first


def test_a_link_names_the_run_and_the_launch_form_shows_its_disk_size(
    tiny_bert_dir, monkeypatch, tmp_path
):
    first = recorded_run(tmp_path, tiny_bert_dir, "a")
    recorded_run(tmp_path, tiny_bert_dir, "b")
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["run"] = first
    at.switch_page(PAGE).run()
    assert not errors(at) and at.selectbox(key="sub_run").value == first
    estimate = next(c.value for c in at.caption if "on disk" in c.value)
    # 200 steps → k = 7, t = 28; 2 layers of the tiny BERT: θ₀ in float32 + 28 float16 moves.
    params = sum(p.numel() for p in AutoModel.from_pretrained(tiny_bert_dir).encoder.parameters())
    size = params * 4 + params * 28 * 2
    assert "k = 7 → θ₀ and t = 28 snapshots of 2 layers" in estimate
    assert f"about **{size / 1e6:,.1f} MB** on disk" in estimate
    at.number_input(key="sub_every").set_value(1).run()
    assert any("t = 200 snapshots" in c.value for c in at.caption)
    assert any("far more than the spectrum needs" in w.value for w in at.warning)

    bad = make_app(tiny_bert_dir, monkeypatch)
    bad.query_params["run"] = "nope"
    bad.switch_page(PAGE).run()
    assert not bad.exception
    assert any("run='nope' is not a finished run" in w.value for w in bad.main.warning)


def test_the_trajectory_run_is_queued_with_the_automatic_interval(tiny_bert_dir, monkeypatch):
    import analysis.runs.worker

    monkeypatch.setattr(analysis.runs.worker, "ensure_worker", lambda *a, **k: 4242)
    at = open_page(make_app(tiny_bert_dir, monkeypatch), PAGE)
    at.number_input(key="sub_steps").set_value(150).run()
    next(b for b in at.button if b.label == "Queue a run with trajectory capture").click().run()
    assert not errors(at)
    config = json.loads(RunsDB().list_runs()["config_json"].iloc[0])
    assert config["trajectory_every"] == 5 and config["trajectory_dtype"] == "float16"


def test_the_runs_page_and_this_page_keep_their_own_run(tiny_bert_dir, monkeypatch, tmp_path):
    with_trajectory = recorded_run(tmp_path, tiny_bert_dir)
    db = RunsDB()
    plain = db.enqueue({"model": {"name": str(tiny_bert_dir)}, "method": "full"})
    db.claim_next(worker_pid=1)
    db.finish(plain, {"score": 0.6, "metric": "accuracy"})  # the newest run, no trajectory
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.switch_page("views/runs.py").run()
    assert widget(at.selectbox, "Run").value == plain
    at.switch_page(PAGE).run()
    assert not errors(at)
    assert not any("no longer available" in w.value for w in at.warning)
    assert widget(at.selectbox, "Trajectory run").value == with_trajectory
    # A run picked on the Runs page does not become this page's run, nor the other way round.
    at.switch_page("views/runs.py").run()
    widget(at.selectbox, "Run").set_value(with_trajectory).run()
    widget(at.selectbox, "Run").set_value(plain).run()
    at.switch_page(PAGE).run()
    assert widget(at.selectbox, "Trajectory run").value == with_trajectory
    at.switch_page("views/runs.py").run()
    assert widget(at.selectbox, "Run").value == plain


def test_the_trajectory_run_goes_where_train_on_says(tiny_bert_dir, monkeypatch):
    """The Subspaces page launches through the one launch path: the Ray choice reaches the
    workers (one worker per device otherwise), as on the Fine-tune page."""
    import analysis.runs.worker
    import ui.finetune.executor
    from analysis.runs.executor import ExecutorChoice

    started: list[ExecutorChoice] = []

    def fake_start(choice, root=None, idle_timeout=None):
        started.append(choice)
        return "Ray worker pid 4242"

    monkeypatch.setattr(analysis.runs.worker, "start_workers", fake_start)
    monkeypatch.setattr(ui.finetune.executor, "cluster_summary", lambda a, c, r: f"at {a}")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), PAGE)
    next(r for r in at.radio if r.label == "Train on").set_value("ray").run()
    next(b for b in at.button if b.label == "Queue a run with trajectory capture").click().run()
    assert not errors(at), errors(at)
    assert started == [ExecutorChoice("ray", None, cpus_per_run=1)]
    assert any("on the Ray cluster" in s.value for s in at.success)
    assert len(RunsDB().list_runs(status="queued")) == 1


def test_the_page_follows_its_queued_run_live(tiny_bert_dir, monkeypatch, tmp_path):
    import analysis.runs.worker

    monkeypatch.setattr(analysis.runs.worker, "ensure_worker", lambda *a, **k: 4242)
    at = open_page(make_app(tiny_bert_dir, monkeypatch), PAGE)
    next(b for b in at.button if b.label == "Queue a run with trajectory capture").click().run()
    assert any("follows them live" in s.value for s in at.success)
    at.run()
    live = [i.value for i in at.info if "queued" in i.value and "as soon as it finishes" in i.value]
    assert live and "0 runs" in live[0] and "1 queued" in live[0]
    # The run finishes (here: another recorded run); the fragment's next check redraws the page.
    import ui.subspace.live as live_module

    seen = at.session_state["sub_live_done"]
    assert seen[1] == frozenset()  # the page was drawn with no finished run
    db = RunsDB()
    queued = db.list_runs(status="queued")["id"].iloc[0]
    db.claim_next(worker_pid=1)
    db.finish(queued, {"score": 0.7, "metric": "accuracy"})
    recorded_run(tmp_path, tiny_bert_dir)
    assert live_module._done_ids(str(tiny_bert_dir)) != seen[1]  # what triggers the rerun
    at.run()
    assert not any("No completed run" in i.value for i in at.info)
    assert at.session_state["sub_live_done"][1] == live_module._done_ids(str(tiny_bert_dir))
