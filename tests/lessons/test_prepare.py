"""Preparing a lesson: what each page's view needs, computed once into the cache; then every
step served from it; a step whose inputs changed says so; the CLI."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from analysis.lessons.lesson import Lesson, Lessons, Step, to_json
from analysis.lessons.library import LibraryRunner
from analysis.lessons.prepare import (
    describe_estimate,
    needs_of,
    prepare,
    statuses,
    step_settings,
    unique_needs,
)
from analysis.runs.db import RunsDB
from analysis.workspace import Workspace
from tunescope.cli import main


@pytest.fixture
def csv_data(tmp_path):
    path = tmp_path / "reviews.csv"
    words = ["good fun", "awful plot", "great music", "dull script", "loved it", "hated it"]
    pd.DataFrame(
        {"text": [f"{words[i % 6]} {i}" for i in range(90)], "label": [i % 2 for i in range(90)]}
    ).to_csv(path, index=False)
    return path


def demo(model, data) -> Lesson:
    view = {"model": str(model), "data": str(data), "n": "40", "seed": "1"}
    return Lesson("demo", "Demo", (
        Step("layers", {**view, "layers_repeats": "3", "layer": "0"}, "ν per layer", "ν = …"),
        Step("layers", {**view, "layers_repeats": "3", "layers_tab": "Layer picture"}),
        Step("heads", {**view, "heads_n": "12", "example": "2"}, "Heads"),
        Step("data", view, "The data"),
    ))  # fmt: skip


def test_each_page_needs_what_its_view_asks_for(tmp_path):
    uploads = tmp_path / "uploads"
    layers = Step("layers", {"data": "trec6", "n": "300", "layers_repeats": "1", "layer": "3"})
    kinds = [n.kind for n in needs_of(layers, uploads)]
    assert kinds == ["states", "layer table", "picture"]  # R = 1: no repeats
    assert needs_of(layers, uploads)[2].settings["layer"] == 3
    default = needs_of(Step("layers", {}), uploads)
    assert [n.kind for n in default] == ["states", "layer table", "repeats", "picture"]
    assert default[2].settings["repeats"] == 50 and default[3].settings["layer"] == -1  # ℓ*
    heads = needs_of(Step("heads", {"heads_n": "30", "heads_xi": "0.8"}), uploads)
    assert (
        heads[0].settings["stats"].extract.sample.n == 30 and heads[0].settings["stats"].xi == 0.8
    )
    claims = needs_of(Step("claims", {"claims_only": ("X4", "S1"), "claims_seeds": "3"}), uploads)
    assert claims[1].kind == "claim runs" and claims[1].settings["claims"].only == ("X4", "S1")
    (recommendation,) = needs_of(Step("recommend", {"n": "300"}), uploads)
    assert recommendation.kind == "recommendation" and recommendation.settings["rec"].n == 300
    assert needs_of(Step("finetune", {}), uploads) == needs_of(Step("runs", {}), uploads) == []
    with pytest.raises(ValueError, match="n='many' is not a whole number"):
        needs_of(Step("layers", {"n": "many"}), uploads)


def test_a_link_names_data_as_the_sidebar_does(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNESCOPE_DATA_DIR", str(tmp_path / "data"))
    uploads = tmp_path / "uploads"
    (uploads / "0123456789abcdef").mkdir(parents=True)
    (uploads / "0123456789abcdef" / "my reviews.csv").write_text("text,label\n")
    assert step_settings(Step("data", {"data": "trec6"}), uploads).data.name == "trec6"
    assert step_settings(Step("data", {"data": "sub/a.csv"}), uploads).data.name == str(
        tmp_path / "data" / "sub" / "a.csv"
    )
    upload = step_settings(
        Step("data", {"data": "upload:0123456789abcdef/my reviews.csv"}), uploads
    )
    assert upload.data.name.endswith("0123456789abcdef/my reviews.csv")
    with pytest.raises(ValueError, match="not in this workspace"):
        step_settings(Step("data", {"data": "upload:0123456789abcdef/gone.csv"}), uploads)


def test_prepare_computes_each_result_once_then_serves_every_step(
    tiny_bert_dir, csv_data, tmp_path
):
    workspace = Workspace(tmp_path / "cache")
    lessons, lesson = Lessons(workspace.lessons), demo(tiny_bert_dir, csv_data)
    lessons.save(lesson)
    runner = LibraryRunner(workspace)
    needs, per_step = unique_needs(lesson, workspace.uploads)
    assert [n.kind for n in needs].count("states") == 1  # both Layers steps share their states
    assert per_step[3] == []
    with workspace.active():
        before = statuses(lesson, lessons, runner.digest, runner.cached, workspace.uploads)
        assert [s.state for s in before] == ["not prepared"] * 3 + ["nothing to prepare"]
        seen = []
        first = prepare(lesson, lessons, runner.compute, runner.digest, workspace.uploads,
                        lambda f, m="": seen.append(f))  # fmt: skip
        assert not first.failed and first.computed == len(needs)
        assert seen[-1] == 1.0 and seen == sorted(seen)  # progress only moves forward
        assert all(runner.cached(n) for n in needs)
        again = prepare(lesson, lessons, runner.compute, runner.digest, workspace.uploads)
        assert again.computed == 0  # everything served from the cache
        after = statuses(lesson, lessons, runner.digest, runner.cached, workspace.uploads)
        assert [s.state for s in after] == ["prepared"] * 3 + ["nothing to prepare"]

        # The data file changes: its steps say so.
        frame = pd.read_csv(csv_data)
        frame.loc[0, "text"] = "an edited example"
        frame.to_csv(csv_data, index=False)
        fresh = LibraryRunner(workspace)  # (a new process: the data is read again)
        changed = statuses(lesson, lessons, fresh.digest, fresh.cached, workspace.uploads)
        assert [s.state for s in changed][:3] == ["changed"] * 3
        assert "inputs changed since preparing" in changed[0].why

        # The cache is cleared: prepared steps are prepared no more.
        prepare(lesson, lessons, fresh.compute, fresh.digest, workspace.uploads)
        for entry in workspace.root.iterdir():
            if entry.is_dir() and entry.name not in ("lessons", "uploads"):
                shutil.rmtree(entry)
        cleared = statuses(lesson, lessons, fresh.digest, fresh.cached, workspace.uploads)
        assert cleared[0].state == "not prepared" and "missing from the cache" in cleared[0].why


def test_a_step_that_cannot_be_prepared_is_reported_and_the_rest_go_on(tiny_bert_dir, csv_data,
                                                                     tmp_path):  # fmt: skip
    workspace = Workspace(tmp_path / "cache")
    lessons = Lessons(workspace.lessons)
    good = demo(tiny_bert_dir, csv_data).steps[2]
    bad = Step("layers", {"model": str(tiny_bert_dir), "data": str(tmp_path / "missing.csv")})
    lesson = Lesson("mixed", "Mixed", (bad, good))
    runner = LibraryRunner(workspace)
    with workspace.active():
        done = prepare(lesson, lessons, runner.compute, runner.digest, workspace.uploads)
    assert done.failed and "missing.csv" in done.failed[0][1]
    assert {n.kind for n, _, _ in done.done} == {"head statistics", "attention"}
    record = json.loads(lessons.prepared_file("mixed").read_text())
    assert list(record) == ["1"]  # only the step whose needs were all met


def test_the_cli_prepares_a_lesson_file_and_reports_each_step(tiny_bert_dir, csv_data, tmp_path,
                                                            capsys):  # fmt: skip
    cache = tmp_path / "cache"
    path = tmp_path / "Demo Lesson.json"
    path.write_text(to_json(demo(tiny_bert_dir, csv_data)))
    assert main(["lesson", "status", str(path), "--cache", str(cache)]) == 1  # not prepared
    assert main(["lesson", "prepare", str(path), "--cache", str(cache),
                 "--json", str(tmp_path / "out.json")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    # A fresh cache holds no rates: what has none says so, never a figure of another machine.
    assert "4 steps, 7 results to have ready; estimate at least" in out
    assert "have no rate measured on this machine yet" in out
    assert "computed" in out and "0 failed" in out
    payload = json.loads((tmp_path / "out.json").read_text())
    assert payload["lesson"] == "demo-lesson" and len(payload["done"]) == 7
    assert main(["lesson", "prepare", "demo-lesson", "--cache", str(cache)]) == 0
    assert "0 computed, 7 already cached" in capsys.readouterr().out
    assert main(["lesson", "status", "demo-lesson", "--cache", str(cache)]) == 0
    assert "prepared" in capsys.readouterr().out
    assert main(["lesson", "list", "--cache", str(cache)]) == 0
    assert "demo-lesson" in capsys.readouterr().out
    assert main(["lesson", "prepare", "nope", "--cache", str(cache)]) == 2
    assert "no lesson named 'nope'" in capsys.readouterr().err


def test_no_runs_prepares_the_analyses_and_queues_no_fine_tuning(tiny_bert_dir, csv_data, tmp_path,
                                                                 capsys):  # fmt: skip
    cache = tmp_path / "cache"
    view = {"model": str(tiny_bert_dir), "data": str(csv_data), "n": "40"}
    claims = {**view, "claims_only": "X4", "claims_repeats": "2", "claims_seeds": "1",
              "claims_steps": "2"}  # fmt: skip
    lessons = Lessons(Workspace(cache).lessons)
    lessons.save(Lesson("runs", "Runs", (Step("claims", claims, "X4"),)))
    assert main(["lesson", "prepare", "runs", "--no-runs", "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "Paper check inputs (X4)" in out and "0 failed" in out
    assert RunsDB(Workspace(cache)).list_runs().empty  # nothing queued
    assert main(["lesson", "status", "runs", "--cache", str(cache)]) == 1
    assert "fine-tuning runs of X4" in capsys.readouterr().out  # what is missing


def test_a_recommend_step_is_prepared_into_the_cache_and_the_recommendation_then_reads_it(
    tiny_bert_dir, tmp_path, monkeypatch
):
    """A Recommend step needs its recommendation: the analyses and every choice's measured cost.
    Prepared, computing the recommendation again adds no cache entry and times nothing."""
    import dataclasses

    from analysis.cache import DiskCache
    from analysis.lessons import prepare as prepare_module
    from analysis.recommend import budget
    from analysis.recommend.recommendation import recommend

    page_defaults = prepare_module.recommend_settings
    # the page's defaults at a tiny size (R = 50, 5 timed steps of 16 examples take minutes here)
    monkeypatch.setattr(prepare_module, "recommend_settings", lambda cfg: dataclasses.replace(
        page_defaults(cfg), repeats=2, heads_n=12, lora_r=2, timed_steps=1, batch_size=4))  # fmt: skip
    workspace = Workspace(tmp_path / "cache")
    lessons = Lessons(workspace.lessons)
    view = {"model": str(tiny_bert_dir), "n": "40", "max_length": "32"}
    lesson = Lesson("rec", "Rec", (Step("recommend", view, "What to tune"),))
    (need,) = needs_of(lesson.steps[0], workspace.uploads)
    assert need.kind == "recommendation" and need.settings["rec"].n == 40
    runner = LibraryRunner(workspace)
    with workspace.active():
        assert not runner.cached(need)
        done = prepare(lesson, lessons, runner.compute, runner.digest, workspace.uploads)
        assert not done.failed and done.computed == 1
        assert runner.cached(need)
        assert [s.state for s in statuses(lesson, lessons, runner.digest, runner.cached,
                                          workspace.uploads)] == ["prepared"]  # fmt: skip
        entries = {p for p in DiskCache().root.glob("*/*") if p.is_dir()}
        assert {p.parent.name for p in entries} >= {"states", "layer_metrics", "layer_repeats",
                                                    "heads", "costs"}  # fmt: skip

        def timing(*args):
            raise AssertionError("a prepared recommendation timed its choices again")

        monkeypatch.setattr(budget, "time_steps", timing)
        rec = recommend(need.settings["rec"], runner.model(need.settings["rec"].model))
        assert {p for p in DiskCache().root.glob("*/*") if p.is_dir()} == entries
        assert rec.costs["full fine-tuning"].step_time_ratio == 1.0


def test_the_recommend_pages_settings_are_what_a_step_prepares(tiny_bert_dir, monkeypatch):
    """The page builds, from its defaults and the sidebar, the very config `needs_of` prepares
    for a Recommend step with the same sidebar (the form is not in the link)."""
    from apptest_utils import make_app, open_page

    from analysis.lessons.prepare import recommend_settings
    from ui.recommend import state

    asked = []

    def stop(cfg, progress):
        asked.append(cfg)
        raise ValueError("stopped here")

    monkeypatch.setattr(state, "_recommend", stop)
    at = open_page(make_app(tiny_bert_dir, monkeypatch, n=40), "views/recommend.py")
    assert any("stopped here" in e.value for e in at.error)
    step = Step("recommend", {"model": str(tiny_bert_dir), "n": "40"})
    assert asked == [recommend_settings(step_settings(step, Workspace.current().uploads))]


def test_after_one_preparation_every_analysis_has_an_estimate_from_this_machine(
    tiny_bert_dir, csv_data, tmp_path
):
    workspace = Workspace(tmp_path / "cache")
    lesson = demo(tiny_bert_dir, csv_data)
    runner = LibraryRunner(workspace)
    needs, _ = unique_needs(lesson, workspace.uploads)
    kinds = {"states", "layer table", "head statistics"}
    assert {n.kind for n in needs if runner.estimate(n) is None} >= {"states", "layer table"}
    with workspace.active():
        prepare(lesson, Lessons(workspace.lessons), runner.compute, runner.digest,
                workspace.uploads)  # fmt: skip
    estimates = {n.kind: runner.estimate(n) for n in needs if n.kind in kinds}
    assert set(estimates) == kinds and all(e and e > 0 for e in estimates.values()), estimates
    assert describe_estimate(list(estimates.values())).startswith("about ")
    assert describe_estimate([2.0, None]) == (
        "at least 2 s (1 of the results has no rate measured on this machine yet: each says "
        "its time once it starts)"
    )


def test_the_pages_runner_prepares_a_recommend_step(tiny_bert_dir, tmp_path):
    """What the server's background preparation runs (`ui.lessons.prepare.PageRunner`): the
    recommendation's analyses and costs through the page's cached call, then found cached."""
    from ui.lessons.prepare import PageRunner

    workspace = Workspace(tmp_path / "cache")
    data = tmp_path / "reviews.csv"  # the step's head statistics read the page's 300 examples
    pd.DataFrame({"text": [f"review {i} was {'good' if i % 2 else 'bad'}" for i in range(500)],
                  "label": [i % 2 for i in range(500)]}).to_csv(data, index=False)  # fmt: skip
    view = {"model": str(tiny_bert_dir), "data": str(data), "n": "40", "seed": "1"}
    lesson = Lesson("rec", "Rec", (Step("recommend", view),))
    with workspace.active():
        runner = PageRunner(workspace)
        needs, _ = unique_needs(lesson, workspace.uploads)
        assert [n.kind for n in needs] == ["recommendation"]
        assert [runner.compute(n) for n in needs] == [False]  # computed, not found
        assert all(runner.cached(n) for n in needs)
