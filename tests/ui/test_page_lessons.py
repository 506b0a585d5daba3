"""Lessons in the app: "Add this view to a lesson" on a page, the Lessons page (edit, reorder,
duplicate, delete, import, export, status), a lesson link's presenter bar and note, the
presenter's position, a follower moved to it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from apptest_utils import errors, make_app, open_page

from analysis.lessons.lesson import Lesson, Lessons, Step


def lessons_here() -> Lessons:
    return Lessons(Path(os.environ["TUNESCOPE_CACHE"]) / "lessons")


def demo(model) -> Lesson:
    view = {"model": str(model), "n": "40"}
    return Lesson("demo", "Demo", (
        Step("data", view, "The data", "Look at the **classes**: $C = 2$."),
        Step("layers", {**view, "layers_repeats": "1", "layers_tab": "Layer picture",
                        "layer": "1"}, "Layer 1"),
        Step("", view, "Back home"),
    ))  # fmt: skip


def test_add_this_view_records_the_whole_view_and_the_note(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(data="trec6", n="60", layers_repeats="1", layers_tab="Layer picture")
    at.run()
    at.switch_page("views/layers.py").run()
    assert not errors(at), errors(at)
    at.text_input(key="add_view_title").set_value("Week 3")
    at.text_input(key="add_view_step_title").set_value("TREC at layer 2")
    at.text_area(key="add_view_note").set_value("Watch the **six** classes: $\\nu$ falls.")
    at.button(key="add_view_go").click().run()
    assert not errors(at), errors(at)
    lesson = lessons_here().load("week-3")
    (step,) = lesson.steps
    assert step.page == "layers" and step.title == "TREC at layer 2"
    assert step.note == "Watch the **six** classes: $\\nu$ falls."
    view = step.view
    assert view["data"] == "trec6" and view["n"] == "60" and view["layers_tab"] == "Layer picture"
    assert view["model"] == str(tiny_bert_dir) and view["pooling"] == "mean"  # written out
    assert not {"lesson", "step", "mode"} & set(view)
    at.switch_page("views/heads.py").run()
    at.button(key="add_view_go").click().run()  # the same lesson is offered next
    assert [s.page for s in lessons_here().load("week-3").steps] == ["layers", "heads"]


def test_the_lessons_page_edits_reorders_and_exports(tiny_bert_dir, monkeypatch):
    lessons_here().save(demo(tiny_bert_dir))
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["edit"] = "demo"
    at = open_page(at, "views/lessons.py")
    assert not errors(at), errors(at)
    table = next(d.value for d in at.dataframe if "status" in d.value.columns)
    assert list(table["status"]) == ["nothing to prepare", "not prepared", "nothing to prepare"]
    assert any("present" in m.value and "mode=present" in m.value for m in at.markdown)
    assert any("mode=follow" in c.value for c in at.code)
    next(b for b in at.button if b.label == "Down" and not b.disabled).click().run()
    assert [s.title for s in lessons_here().load("demo").steps] == ["Layer 1", "The data",
                                                                     "Back home"]  # fmt: skip
    next(b for b in at.button if b.label == "Duplicate").click().run()
    assert len(lessons_here().load("demo")) == 4
    next(b for b in at.button if b.label == "Delete").click().run()
    assert len(lessons_here().load("demo")) == 3
    note = next(t for t in at.text_area if t.value == "Look at the **classes**: $C = 2$.")
    note.set_value("A new note.").run()
    assert "A new note." in [s.note for s in lessons_here().load("demo").steps]
    exported = next(b for b in at.get("download_button") if "Export" in b.proto.label)
    assert exported.proto.label.startswith("Export this lesson")
    assert not errors(at), errors(at)


def test_the_prepare_button_computes_the_steps_and_says_they_are_prepared(tiny_bert_dir,
                                                                          monkeypatch):  # fmt: skip
    lessons_here().save(demo(tiny_bert_dir))
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["edit"] = "demo"
    at = open_page(at, "views/lessons.py")
    assert any("3 results to have ready, 3 not in the cache yet" in m.value for m in at.markdown)
    at.button(key="lesson_prepare").click().run()
    assert not errors(at), errors(at)
    assert any("Prepared in" in s.value for s in at.success)
    table = next(d.value for d in at.dataframe if "status" in d.value.columns)
    assert list(table["status"]) == ["nothing to prepare", "prepared", "nothing to prepare"], table


def test_a_lesson_link_opens_its_step_with_the_bar_and_the_note(tiny_bert_dir, monkeypatch):
    lessons_here().save(demo(tiny_bert_dir))
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(dict(lesson="demo", step="1", mode="present", model=str(tiny_bert_dir),
                                n="40"))  # fmt: skip
    at.run()
    at.switch_page("views/data.py").run()
    assert not errors(at), errors(at)
    bar = " ".join(m.value for m in at.markdown)
    assert "step 1 of 3" in bar and "Next ▶" in bar and "Previous" not in bar
    assert "step=2" in bar and "mode=present" in bar  # the next step keeps presenting
    assert "Look at the **classes**: $C = 2$." in [m.value for m in at.markdown]  # the note
    assert lessons_here().position("demo") == 1  # followers move here


def test_a_follower_is_moved_to_the_presenters_step(tiny_bert_dir, monkeypatch):
    lessons_here().save(demo(tiny_bert_dir))
    lessons_here().set_position("demo", 3)
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(dict(lesson="demo", step="1", mode="follow", n="40"))
    first = at.run()  # opened on Home: the step's own page is asked for
    (home,) = [h.proto.body for h in first.get("html") if "location.replace" in h.proto.body]
    assert '"/data?' in home and "step=1" in home
    at.switch_page("views/data.py").run()
    scripts = [h.proto.body for h in at.get("html") if "location.replace" in h.proto.body]
    assert (
        scripts
        and json.dumps(demo(tiny_bert_dir).link(3, "follow"))[1:-1].split("?")[0] in (scripts[0])
    )
    assert "step=3" in scripts[0] and "mode=follow" in scripts[0]
    lessons_here().set_position("demo", 1)
    assert not any("location.replace" in h.proto.body for h in at.run().get("html"))


def test_the_built_in_lesson_is_offered_and_opens(tiny_bert_dir, monkeypatch):
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/lessons.py")
    assert not errors(at), errors(at)
    assert at.selectbox(key="lessons_pick").value == "papers-story"  # the first lesson
    assert any("A built-in lesson" in c.value for c in at.caption)


def test_the_presenter_is_told_when_a_step_is_not_prepared(tiny_bert_dir, monkeypatch):
    lessons_here().save(demo(tiny_bert_dir))
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(dict(lesson="demo", step="2", mode="present", model=str(tiny_bert_dir),
                                n="40", layers_repeats="1", layers_tab="Layer picture",
                                layer="1"))  # fmt: skip
    at.switch_page("views/layers.py").run()
    assert not errors(at), errors(at)
    assert any("This step is **not prepared**: never prepared" in w.value for w in at.warning)


def test_each_step_is_named_once_its_page_beside_a_title_that_does_not_name_it(
    tiny_bert_dir, monkeypatch
):
    view = {"model": str(tiny_bert_dir), "n": "40"}
    lessons_here().save(Lesson("named", "Named", (
        Step("layers", view), Step("data", view, "Data"), Step("heads", view, "Two heads"),
    )))  # fmt: skip
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params["edit"] = "named"
    at = open_page(at, "views/lessons.py")
    assert not errors(at), errors(at)
    headings = [e.label for e in at.expander if e.label[:1].isdigit()]
    assert headings == ["1. Layers", "2. Data", "3. Two heads — Heads"], headings
