"""AppTest of the Fine-tune and Runs pages on a tiny model, with a real background worker."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import waiting
from apptest_utils import cancel_the_rest, errors, make_app, open_page

from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
from analysis.heads.selection_file import FORMAT
from analysis.runs.db import RunsDB
from analysis.runs.worker import worker_pid
from analysis.strategies import middle_layer
from ui.finetune.form import layer_key
from ui.suggestions import heads_key

pytestmark = pytest.mark.usefixtures("stop_leftover_worker")


def widget(elements, label: str):
    return next(w for w in elements if w.label == label)


def wait_for(condition, timeout: float = 90.0, what: str = ""):
    log = Path(os.environ["TUNESCOPE_CACHE"]) / "worker.log"
    return waiting.wait_for(condition, timeout, what, log)


def fill_form(at, steps: int, seeds: str = "0") -> None:
    widget(at.radio, "What to launch").set_value("One run per seed")
    widget(at.selectbox, "Method (one run)").set_value("layers")
    widget(at.number_input, "ℓ_bottom").set_value(1)
    widget(at.number_input, "ℓ_top").set_value(1)
    widget(at.number_input, "ℓ_cls").set_value(2)
    widget(at.number_input, "Steps").set_value(steps)
    widget(at.number_input, "Batch size").set_value(4)
    widget(at.number_input, "Train examples (0 = all)").set_value(32)
    widget(at.number_input, "Dev/test examples scored").set_value(16)
    widget(at.number_input, "Dev score every k steps").set_value(1000)
    widget(at.text_input, "Seeds").set_value(seeds)


def test_finetune_page_launches_runs_that_outlive_reruns(tiny_bert_dir, monkeypatch):
    monkeypatch.setenv("TUNESCOPE_WORKER_IDLE_S", "2")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert not errors(at)
    assert any("No finished run" in i.value for i in at.info)

    # Estimate before anything ran: a quick timing in this process, and it says so.
    fill_form(at, steps=4)
    widget(at.button, "Estimate time").click().run()
    assert not errors(at)
    assert any("timed just now" in i.value for i in at.info)
    db = RunsDB()
    assert db.list_runs().empty  # estimating starts nothing

    fill_form(at, steps=4)
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    assert any("Queued 1 run" in s.value for s in at.success)
    # Right after an estimate, queueing estimates from that timing (no stale "No earlier run").
    assert not any("No earlier" in i.value for i in at.info)
    assert any("timed earlier in this session" in i.value for i in at.info)
    run_id = db.list_runs()["id"].iloc[0]
    # The worker is its own process: reruns and page switches do not touch it.
    at.run()
    at.switch_page("views/data.py").run()
    at.switch_page("views/finetune.py").run()
    wait_for(lambda: db.get_run(run_id)["status"] == "done", what="the queued run")
    at.run()
    assert not errors(at)
    table = next(d.value for d in at.dataframe if "n_tuned_layers" in d.value.columns)
    assert table["id"].tolist() == [run_id] and table["n_tuned_layers"].tolist() == [1]
    assert len(at.get("plotly_chart")) >= 3  # score vs layers, vs parameters, costs
    assert any("Peak memory is measured per process" in m.value for m in at.markdown)

    # A second estimate now comes from the measured run.
    fill_form(at, steps=4)
    widget(at.button, "Estimate time").click().run()
    assert any("measured: median of 1 earlier run of (1, 1, 2)" in i.value for i in at.info)

    # A long run, cancelled from the live queue.
    fill_form(at, steps=100_000)
    widget(at.button, "Queue").click().run()
    long_id = db.list_runs(status=["queued", "running"])["id"].iloc[0]
    wait_for(lambda: len(db.steps(long_id)) > 0, what="steps of the long run")
    at.run()
    next(b for b in at.button if b.key == f"ft_cancel_{long_id}").click().run()
    wait_for(lambda: db.get_run(long_id)["status"] == "cancelled", what="the cancel")
    assert db.get_run(long_id)["result"] is None

    # The Runs page lists both, shows one, exports.
    at.switch_page("views/runs.py").run()
    assert not errors(at)
    assert set(at.dataframe[0].value["id"]) == {run_id, long_id}
    assert [m.value for m in at.metric][:1] == ["cancelled"]  # newest first
    labels = [b.proto.label for b in at.get("download_button")]
    assert len([label for label in labels if label.startswith("Download")]) == 2
    assert "This run as a recipe (zip)" in labels  # ui/export.py
    wait_for(lambda: worker_pid() is None, what="the idle worker to exit")
    with contextlib.suppress(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_sweep_estimate_expands_strategies_and_queues_nothing(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=10, seeds="0,1")
    widget(at.radio, "What to launch").set_value("A sweep of strategies")
    widget(at.multiselect, "Strategies (sweep)").set_value(["down", "bitfit"])
    widget(at.number_input, "ℓ* (best-specialised layer)").set_value(1)
    widget(at.button, "Estimate time").click().run()
    assert not errors(at), errors(at)
    # ℓ*-down of ℓ* = 1 on L = 2: (1, 1, 1) and (1, 1, 2); plus BitFit; × 2 seeds.
    estimate = next(i.value for i in at.info if "Estimated training time" in i.value)
    assert "for 6 runs" in estimate and "timed just now" in estimate
    assert RunsDB().list_runs().empty


def test_bad_form_input_is_a_clear_message(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=10)
    widget(at.text_input, "Learning rate").set_value("fast")
    widget(at.button, "Queue").click().run()
    assert not at.exception
    assert any("learning rate" in e.lower() for e in errors(at))
    widget(at.selectbox, "Method (one run)").set_value("heads")
    widget(at.text_input, "Learning rate").set_value("")
    widget(at.button, "Queue").click().run()
    assert any("head selection" in e for e in errors(at))
    assert RunsDB().list_runs().empty


def sidebar_config(model_dir, data: str = "movie-snippets") -> ExtractConfig:
    """The extraction the sidebar of `make_app` names (N = 40, seed 0, mean, 128 tokens)."""
    return ExtractConfig(model=ModelSpec(str(model_dir)), data=DataSpec(data),
                         sample=SampleSpec(n=40))  # fmt: skip


def cache_layers_analysis(cfg: ExtractConfig) -> int:
    """Compute the Layers analysis of ``cfg`` into the disk cache (as the Layers page or the CLI
    would, in another session); returns its ℓ*."""
    from analysis.extract import extract_states
    from analysis.layers.table import cached_layer_metrics, summary

    df, _ = cached_layer_metrics(extract_states(cfg), seed=cfg.sample.seed)
    return summary(df)["l_star"]


def cached_l_star_is(monkeypatch, value: int) -> None:
    """Pretend the cached Layers analysis found ``value`` (the tiny model's own ℓ* may equal the
    middle layer, the default without one)."""
    import ui.suggestions

    real = ui.suggestions.cached_l_star
    monkeypatch.setattr(ui.suggestions, "cached_l_star", lambda cfg: real(cfg) and value)


def test_l_star_comes_from_the_cached_layers_analysis_in_a_new_session(tiny_bert_dir, monkeypatch):
    cfg = sidebar_config(tiny_bert_dir)
    found = cache_layers_analysis(cfg)  # on disk; this session never opens the Layers page
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert not errors(at), errors(at)
    assert any(f"ℓ* = {found}, from the Layers analysis" in i.value for i in at.info)
    assert "suggested_l_star" not in at.session_state  # not from the browser session
    for label in ("ℓ* (best-specialised layer)", "ℓ_top", "ℓ_cls"):
        assert widget(at.number_input, label).value == found


def test_layer_fields_follow_l_star_until_edited_and_then_say_so(tiny_bert_dir, monkeypatch):
    cfg = sidebar_config(tiny_bert_dir)
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert any("No ℓ* found yet" in c.value for c in at.caption)
    assert widget(at.number_input, "ℓ_top").value == middle_layer(2)
    cache_layers_analysis(cfg)
    cached_l_star_is(monkeypatch, 1)  # the Layers analysis now says 1 (the middle of L = 2 is 2)
    at.run()
    for label in ("ℓ* (best-specialised layer)", "ℓ_top", "ℓ_cls"):
        assert widget(at.number_input, label).value == 1  # followed: none was edited
    widget(at.number_input, "ℓ* (best-specialised layer)").set_value(2)
    widget(at.button, "Estimate time").click().run()
    assert any("You set ℓ* = 2; the Layers analysis says 1" in w.value for w in at.warning)
    assert widget(at.number_input, "ℓ* (best-specialised layer)").value == 2  # kept
    assert widget(at.number_input, "ℓ_top").value == 1  # not edited: still follows


def test_l_star_and_heads_from_other_pages_are_used_for_their_data_only(tiny_bert_dir, monkeypatch):
    cfg = sidebar_config(tiny_bert_dir)
    cache_layers_analysis(cfg)
    cached_l_star_is(monkeypatch, 1)
    at = make_app(tiny_bert_dir, monkeypatch)
    at.session_state["suggested_heads"] = {
        heads_key(cfg): {"format": FORMAT, "layers": {"1": [0, 2], "2": [3]}}
    }
    open_page(at, "views/finetune.py")
    assert any("ℓ* = 1, from the Layers analysis" in i.value for i in at.info)
    assert widget(at.number_input, "ℓ* (best-specialised layer)").value == 1
    fill_form(at, steps=10)
    widget(at.selectbox, "Method (one run)").set_value("heads")
    widget(at.button, "Estimate time").click().run()
    assert not errors(at), errors(at)
    assert any("one heads run" in i.value for i in at.info)

    # Another data set: neither ℓ* nor the heads of movie snippets are offered.
    at.sidebar.selectbox(key="data").set_value("trec6").run()
    assert not any("from the Layers analysis" in i.value for i in at.info)
    assert any("No ℓ* found yet" in c.value for c in at.caption)
    field = widget(at.number_input, "ℓ* (best-specialised layer)")
    assert field.value == middle_layer(2) and field.key != layer_key(cfg, "l_star")  # its own field
    widget(at.selectbox, "Method (one run)").set_value("heads")
    widget(at.button, "Estimate time").click().run()
    assert any("for this model and data" in e for e in errors(at))


def test_the_form_keeps_its_values_across_page_switches(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=77, seeds="3,4")
    widget(at.number_input, "ℓ* (best-specialised layer)").set_value(2)
    widget(at.button, "Estimate time").click().run()
    at.switch_page("views/data.py").run()
    at.switch_page("views/finetune.py").run()
    assert widget(at.number_input, "Steps").value == 77
    assert widget(at.text_input, "Seeds").value == "3,4"
    assert widget(at.selectbox, "Method (one run)").value == "layers"
    assert widget(at.number_input, "ℓ_cls").value == 2
    assert widget(at.number_input, "ℓ* (best-specialised layer)").value == 2


def test_a_bad_file_is_refused_on_the_page_and_never_queued(tiny_bert_dir, monkeypatch, tmp_path):
    bad = tmp_path / "latin1.csv"
    bad.write_bytes("text,label\nna\xefve caf\xe9,1\n".encode("latin-1") * 20)
    monkeypatch.setenv("TUNESCOPE_ALLOWED_ROOTS", str(tmp_path))
    at = open_page(make_app(tiny_bert_dir, monkeypatch, data=str(bad)), "views/finetune.py")
    assert not at.exception
    assert errors(at) == [
        "latin1.csv is not valid UTF-8 (byte 0xef on line 2): re-save it as UTF-8 (e.g. 'CSV "
        "UTF-8' in a spreadsheet program)."
    ]
    assert not [b for b in at.button if b.label == "Queue"]  # no form to queue from
    at.switch_page("views/data.py").run()
    assert errors(at)[0].startswith("latin1.csv is not valid UTF-8")  # the same message
    assert RunsDB().list_runs().empty


def test_sweep_learning_rate_grid_triples_the_runs(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=10, seeds="0,1")
    widget(at.radio, "What to launch").set_value("A sweep of strategies")
    widget(at.multiselect, "Strategies (sweep)").set_value(["down", "frozen"])
    widget(at.number_input, "ℓ* (best-specialised layer)").set_value(1)
    widget(at.checkbox, "Sweep: learning-rate grid ×½, ×1, ×2").check()
    widget(at.button, "Estimate time").click().run()
    assert not errors(at), errors(at)
    # (1, 1, 1) and (1, 1, 2) at three rates, frozen (no body) at one; × 2 seeds.
    estimate = next(i.value for i in at.info if "Estimated training time" in i.value)
    assert "for 14 runs" in estimate


def test_layers_one_to_l_is_queued_as_full_and_the_form_shows_one_methods_fields(
    tiny_bert_dir, monkeypatch
):
    import analysis.runs.worker as worker

    monkeypatch.setattr(worker, "start_workers", lambda executor, root: "no worker in this test")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=3)
    widget(at.number_input, "ℓ_top").set_value(2)  # (1, 2, 2) on a 2-layer model: everything
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    (run,) = RunsDB().list_runs().itertuples()
    assert run.method == "full" and run.label == "full"
    # Each method shows its own options, and every option of LoRA is on the page.
    labels = {w.label for w in [*at.number_input, *at.multiselect]}
    assert "LoRA r" not in labels and "Adapter size" not in labels
    widget(at.selectbox, "Method (one run)").set_value("lora").run()
    labels = {w.label for w in [*at.number_input, *at.multiselect]}
    assert {"LoRA layers", "LoRA r", "LoRA alpha"} <= labels and "Adapter size" not in labels
    widget(at.number_input, "LoRA alpha").set_value(4.0)
    widget(at.number_input, "LoRA r").set_value(2)
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    lora = RunsDB().list_runs(method="lora")
    config = RunsDB().get_run(lora["id"].iloc[0])["config"]
    options = config["options"]  # the stored config holds LoRA's options only
    assert (options["alpha"], options["r"], options["layers_to_transform"]) == (4.0, 2, [2])


def test_the_form_lists_every_bad_field_at_once(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=10, seeds="0,x")
    widget(at.text_input, "Learning rate").set_value("fast")
    widget(at.button, "Estimate time").click().run()
    assert len(at.error) == 1  # one message…
    message = at.error[0].value
    assert "2 problems in the form" in message  # …naming both bad fields, not the first only
    assert "Seeds" in message and "learning rate must be a number" in message
    assert RunsDB().list_runs().empty


def test_runs_at_chance_are_flagged_and_get_no_verdict(tiny_bert_dir, monkeypatch):
    import numpy as np

    from analysis.finetune.config import FinetuneConfig
    from analysis.predictions import encode_predictions

    db = RunsDB()
    labels = np.array([0, 1] * 10)  # balanced: majority 0.5
    for method, seed in (("full", 0), ("full", 1), ("bitfit", 0), ("bitfit", 1)):
        cfg = FinetuneConfig(model=ModelSpec(str(tiny_bert_dir)), data=DataSpec("movie-snippets"),
                             method=method, steps=20, seed=seed)  # fmt: skip
        run_id = db.enqueue(cfg)
        db.claim_next(worker_pid=1)
        db.finish(run_id, {"score": 0.45 + seed / 100, "metric": "accuracy", "n_trainable": 10,
                           "layers_forward": 2, "wall_s": 1.0, "test_predictions":
                           encode_predictions(np.zeros(20), labels, "fp", regression=False)})  # fmt: skip
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert not errors(at), errors(at)
    assert any("4 of 4 runs are at chance level" in w.value for w in at.warning)
    assert any("No verdict between" in i.value and "both are at chance" in i.value
               for i in at.info)  # fmt: skip
    assert not any("verdict" in d.value.columns for d in at.dataframe)  # no verdict table
    assert any("majority class 0.500" in c.value for c in at.caption)
    latest = next(d.value for d in at.dataframe if list(d.value.columns[:2]) == ["method", "label"])
    assert set(latest["flag"]) == {"predicts one class only"}  # the live queue's cards too


def test_the_rest_of_a_sweep_is_cancelled_from_the_live_queue(tiny_bert_dir, monkeypatch):
    import analysis.runs.worker as worker

    monkeypatch.setattr(worker, "start_workers", lambda executor, root: "no worker in this test")
    db = RunsDB()
    cfg = {"model": {"name": str(tiny_bert_dir)}, "data": {"name": "movie-snippets"},
           "method": "full", "steps": 3}  # fmt: skip
    done, running, *queued = (db.enqueue({**cfg, "seed": s}, sweep_id="sweep-a") for s in range(4))
    other = db.enqueue({**cfg, "seed": 9}, sweep_id="sweep-b")
    db.claim_next(worker_pid=1)
    db.finish(done, {"score": 0.6, "metric": "accuracy"})
    db.claim_next(worker_pid=1)  # pid 1 is alive: never reaped
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert not errors(at), errors(at)
    assert at.button(key="ft_cancel_rest_sweep-b").label == (
        "Cancel the rest of sweep-b (1 queued, 0 running)"
    )
    at.button(key="ft_cancel_rest_sweep-a").click().run()
    assert any("Cancel 2 queued runs and stop 1 running one" in w.value for w in at.warning)
    at.button(key="ft_cancel_rest_sweep-a_no").click().run()  # kept: nothing changes
    assert db.list_runs(status="queued")["id"].tolist() == [other, *queued[::-1]]

    label = cancel_the_rest(at, "ft_cancel_rest_sweep-a")
    assert label == "Cancel the rest of sweep-a (2 queued, 1 running)"
    assert not errors(at), errors(at)
    assert [db.get_run(i)["status"] for i in queued] == ["cancelled"] * 2
    assert db.cancel_requested(running) and db.get_run(running)["status"] == "running"
    assert db.get_run(done)["result"]["score"] == 0.6  # finished: left alone
    assert db.get_run(other)["status"] == "queued"  # the other sweep
    assert any("2 queued runs cancelled, 1 running asked to stop" in t.value for t in at.toast)


def test_queueing_the_same_runs_again_reuses_them(tiny_bert_dir, monkeypatch):
    """The form's runs are a planned grid (`analysis.runs.planner`): a run of the same setting
    and seed that is done, training or queued stands for it, so a second press queues only what
    is new."""
    import analysis.runs.worker as worker

    monkeypatch.setattr(worker, "start_workers", lambda executor, root: "no worker in this test")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    fill_form(at, steps=3, seeds="0,1,2")
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    first = RunsDB().list_runs()
    assert len(first) == 3  # one run per seed
    widget(at.text_input, "Seeds").set_value("0,1,2,3")
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    after = RunsDB().list_runs()
    assert len(after) == 4 and sorted(after["seed"]) == [0, 1, 2, 3]
    assert any("3 runs already trained or training: reused" in s.value for s in at.success)
