"""AppTest of the Recommend page on a tiny model: candidates with their cost and evidence, "Test
these" queueing every arm × seed through the one launch path, the comparison and the sentence
filling in from finished runs, the take-home downloads; bad input gets one message."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from apptest_utils import cancel_the_rest, errors, make_app, open_page, record_pool

from analysis.predictions import encode_predictions
from analysis.rates import duration
from analysis.recommend.budget import Costs
from analysis.runs.db import RunsDB
from analysis.runs.executor import ExecutorChoice
from analysis.runs.worker import parallel_runs

pytestmark = pytest.mark.usefixtures("stop_leftover_worker")
PAGE = "views/recommend.py"
SMALL = {"rec_repeats": 2, "rec_heads_n": 40, "rec_timed_steps": 1, "rec_steps": 2,
         "rec_batch_size": 8, "rec_n_train": 64, "rec_n_eval": 40, "rec_eval_every": 2,
         "rec_lora_r": 2}  # fmt: skip


WALL_S = 600.0  # a finished run's wall time in the toy comparison


def recommend_page(tiny_bert_dir, monkeypatch, **state):
    at = make_app(tiny_bert_dir, monkeypatch, n=40)
    for key, value in {**SMALL, **state}.items():
        at.session_state[key] = value
    return open_page(at, PAGE)


def frame(at, column: str):
    """The table that has ``column`` (choice: the candidates; arm: the comparison)."""
    return next(t.value for t in at.table if column in getattr(t.value, "columns", []))


def test_the_page_proposes_candidates_with_cost_and_evidence_and_queues_the_comparison(
    tiny_bert_dir, monkeypatch
):
    import analysis.runs.worker as worker

    monkeypatch.setattr(worker, "start_workers", lambda executor, root: "no worker in this test")
    at = recommend_page(tiny_bert_dir, monkeypatch)
    assert not errors(at), errors(at)
    choices = frame(at, "choice")
    assert choices["role"].iloc[0] == "reference" and "candidate" in set(choices["role"])
    assert {"BitFit", "EVA LoRA r=2", "uniform LoRA r=2"} <= set(choices["choice"])
    assert any("PageRank heads" in c for c in choices["choice"])
    assert (choices.loc[choices["role"] == "reference", "step time ×full"] == "1.00").all()
    shown = " ".join(m.value for m in at.markdown) + " ".join(i.value for i in at.info)
    assert "Not tested yet" in shown
    n_arms = len(choices)
    db = RunsDB()
    assert db.list_runs().empty  # nothing is queued before the button
    next(b for b in at.button if b.key == "rec_test").click().run()
    assert not errors(at), errors(at)
    queued = db.list_runs()
    # the first round: 3 seeds of full and of every arm cheaper than full (the default design)
    answers = _cached_recommendation().experiment().answers
    assert len(queued) == 3 * (1 + len(answers)) and len(answers) <= n_arms - 1
    # independent seeds: full fine-tuning's are 0, 1, 2; every other arm has three of its own
    by_arm = queued.groupby("label")["seed"].apply(set)
    assert sum(seeds == {0, 1, 2} for seeds in by_arm) == 1 and all(len(s) == 3 for s in by_arm)
    assert any("Queued" in s.value for s in at.success)
    sweep = queued["sweep_id"].iloc[0]
    assert db.experiment_spec(sweep) is not None  # its later rounds are queued as runs end
    # "Cancel the rest", confirmed: every run of the comparison is cancelled, its rounds stop.
    label = cancel_the_rest(at.run(), "rec_cancel_rest")
    assert label == f"Cancel the rest ({len(queued)} queued, 0 running)"
    after = db.list_runs()
    assert len(after) == len(queued) and set(after["status"]) == {"cancelled"}
    assert db.experiment_spec(sweep) is None
    assert not any(b.key == "rec_cancel_rest" for b in at.button)  # nothing left to cancel
    assert not errors(at), errors(at)
    assert [link.proto.label for link in at.get("page_link")][-1].startswith("Next: **Runs**")


def test_the_pages_computation_goes_to_the_compute_workers(tiny_bert_dir, monkeypatch):
    """With the compute pool on, the extraction and then the rest of the recommendation (head
    statistics, choices, costs) are jobs for the workers, not computations in the server's
    script thread; the page shows what it shows in-process."""
    sent = record_pool(monkeypatch)
    at = recommend_page(tiny_bert_dir, monkeypatch)
    assert not errors(at), errors(at)
    assert sent == ["extract_job", "recommendation_job"]
    choices = frame(at, "choice")
    assert choices["role"].iloc[0] == "reference" and "candidate" in set(choices["role"])
    assert {"BitFit", "EVA LoRA r=2", "uniform LoRA r=2"} <= set(choices["choice"])


def test_finished_runs_fill_in_the_table_and_the_sentence(tiny_bert_dir, monkeypatch):
    at = recommend_page(tiny_bert_dir, monkeypatch, rec_seeds=3)
    assert not errors(at), errors(at)

    choices = frame(at, "choice")
    rec = _cached_recommendation()
    # Step times of a 2-layer toy are noise: fix them, so that BitFit is the cheapest arm.
    rec.costs = Costs({name: dataclasses.replace(cost, step_time_ratio=1.0 if name ==
                       "full fine-tuning" else 0.3 if name == "BitFit" else 0.6)
                       for name, cost in rec.costs.by_name.items()}, 0.0)  # fmt: skip
    db = RunsDB()
    labels = np.array([0, 1] * 50)
    planned = _planned(rec)
    for done, (name, config) in enumerate(planned):
        if done == len(planned) - 1:  # one left: the button counts it in the singular, and
            at.run()  # says how long it takes: its arm's finished runs took WALL_S each
            (button,) = [b for b in at.button if b.key == "rec_test"]
            parallel = parallel_runs(
                ExecutorChoice(), rec.costs.by_name["full fine-tuning"].n_params
            )
            took = duration(WALL_S / parallel)
            assert button.label == f"Test these: 1 run to queue (the first round), about {took}"
            assert "1 run from finished runs' times" in button.help, button.help
        accuracy = 0.9 if name == "BitFit" else 0.8 if name == "full fine-tuning" else 0.6
        accuracy += 0.01 * (done % 3)  # the seed's index (planned three seeds an arm)
        preds = np.where(np.arange(100) < accuracy * 100, labels, 1 - labels)
        run_id = db.enqueue(config, running_pid=os.getpid())
        if done == len(planned) - 1:  # while it trains, the page shows its step and curves
            db.log_step(run_id, 5, {"loss": 0.5, "eta_s": 30.0})
            db.log_step(run_id, 5, {"dev": 0.7}, kind="dev")
            at.run()
            assert any(
                f"seed {config.seed} · step 5/{config.steps}" in m.value for m in at.markdown
            )
            assert any(b.key == f"rec_cancel_{run_id}" for b in at.button)
            curve = next(c for c in at.get("plotly_chart") if c.proto.id.endswith(run_id) or
                         run_id in str(c.proto))  # fmt: skip
            assert "dev score" in str(curve.proto)
        db.finish(run_id, {"score": float(np.mean(preds == labels)), "metric": "accuracy",
                           "peak_mem_mb": 12.0, "wall_s": WALL_S,
                           "test_predictions": encode_predictions(preds, labels, "t", False)})  # fmt: skip
    at.run()
    assert not errors(at), errors(at)
    table = frame(at, "arm").set_index("arm")
    assert set(table.index) == set(choices["choice"])
    assert table.loc["BitFit", "verdict"] == "held up" and table.loc["BitFit", "test"] == "welch"
    assert table.loc["BitFit", "diff vs full (points)"] == "+10.0"
    assert table.loc["full fine-tuning", "diff vs full (points)"] == "–"
    assert table.loc["full fine-tuning", "verdict"] == "reference"
    sentence = next(s.value for s in at.success if "BitFit" in s.value)
    assert (
        sentence.startswith("Tune every bias")
        and "+10.0 ±" in sentence
        and "δ = 1 point" in sentence
    )
    assert len(at.get("plotly_chart")) >= 2  # the costs and the comparison
    picker = next(s for s in at.selectbox if s.label == "Recipe of")
    assert picker.value == "BitFit"  # the recommended one, to take home


def _cached_recommendation():
    """This test's recommendation: the memo keeps every test's of this process, each under its
    cache folder."""
    from analysis.workspace import Workspace
    from ui.recommend.state import _RECOMMENDATIONS

    root = str(Workspace.current().root)
    return next(rec for (where, _), rec in _RECOMMENDATIONS._items.items() if where == root)


def _planned(rec):
    from analysis.recommend.outcome import planned_runs

    return planned_runs(rec.cfg, rec.proposal)


def test_a_sample_too_small_for_the_analyses_gets_one_message(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch, n=6)
    at = open_page(at, PAGE)
    assert not at.exception
    assert len(at.error) == 1 and "at least 5 examples of every class" in at.error[0].value
    assert not at.dataframe  # no candidates from a sample that cannot support them


def test_the_fine_tune_page_launches_three_seeds_by_default(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert next(w for w in at.text_input if w.label == "Seeds").value == "0,1,2"
