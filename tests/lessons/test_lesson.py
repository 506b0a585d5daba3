"""The lesson format: steps as links, editing, the file (round trip, diff-friendly, bad files),
the workspace's lessons beside the built-in ones, the presenter's position."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from analysis.lessons.lesson import BUILTIN, Lesson, Lessons, Step, from_json, slug, to_json


def lesson() -> Lesson:
    steps = (
        Step("layers", {"data": "trec6", "layer": "4", "layers_tab": "Layer picture"}, "Picture",
             "At layer $\\ell^*$ the classes\npull apart."),
        Step("heads", {"heads_k": "2", "claims_only": ("X4", "S1")}, "", ""),
        Step("", {}, "Home"),
    )  # fmt: skip
    return Lesson("story", "The story", steps)


def test_a_step_is_its_link_and_the_lesson_link_carries_the_lesson():
    step = lesson().steps[0]
    url = urlparse(step.link())
    assert url.path == "/layers"
    assert parse_qs(url.query) == {
        "data": ["trec6"],
        "layer": ["4"],
        "layers_tab": ["Layer picture"],
    }
    shared = parse_qs(urlparse(lesson().link(2, "follow")).query)
    assert (
        shared["lesson"] == ["story"] and shared["step"] == ["2"] and shared["mode"] == ["follow"]
    )
    assert shared["claims_only"] == ["X4", "S1"]  # a multiselect's values, repeated
    assert "mode" not in parse_qs(urlparse(lesson().link(1)).query)  # own pace: the default


def test_equal_views_compare_equal_whatever_the_order_of_their_parameters():
    assert Step("layers", {"a": "1", "b": "2"}) == Step("layers", (("b", "2"), ("a", "1")))


@pytest.mark.parametrize(
    "page, params, message",
    [
        ("../etc", {}, "page address"),
        ("layers", {"lesson": "x"}, "lesson's own parameters"),
        ("layers", {"n": 3}, "names and texts"),
    ],
)
def test_a_bad_step_is_refused_with_a_reason(page, params, message):
    with pytest.raises(ValueError, match=message):
        Step(page, params)


def test_editing_returns_new_lessons_in_the_right_order():
    base = lesson()
    first, second, third = base.steps
    assert base.move(0, 1).steps == (second, first, third)
    assert base.move(2, -5).steps == (third, first, second)  # kept within the lesson
    assert base.duplicate(1).steps == (first, second, second, third)
    assert base.delete(0).steps == (second, third)
    assert base.replace(1, note="new").steps[1].note == "new"
    assert base.add(first).steps[-1] == first
    with pytest.raises(ValueError, match="no step 9"):
        base.delete(8)
    with pytest.raises(ValueError, match="there is no step 4"):
        base.step(4)


def test_the_file_round_trips_and_diffs_line_by_line():
    text = to_json(lesson())
    assert from_json(text, "story") == lesson()
    payload = json.loads(text)
    assert payload["format"] == 1
    assert payload["steps"][0]["note"] == ["At layer $\\ell^*$ the classes", "pull apart."]
    assert '    "view": {\n' in text and '"layer": "4",\n' in text  # one parameter per line
    changed = to_json(lesson().replace(0, note="At layer $\\ell^*$ the classes\nmove apart."))
    diff = [a for a, b in zip(text.splitlines(), changed.splitlines(), strict=True) if a != b]
    assert diff == ['        "pull apart."']  # a changed note line is one changed line


@pytest.mark.parametrize(
    "text, message",
    [
        ("not json", "not valid JSON"),
        ('{"title": "x"}', "list of 'steps'"),
        ('{"format": 9, "steps": []}', "format 9"),
        ('{"steps": [{"view": {}}]}', "Step 1 of the lesson file has no 'page'"),
        ('{"steps": [{"page": "layers", "view": {"step": "2"}}]}', "Step 1 of the lesson file"),
    ],
)
def test_a_malformed_file_gets_one_clear_message(text, message):
    with pytest.raises(ValueError, match=message):
        from_json(text, "x")


def test_the_workspace_lessons_sit_beside_the_built_in_ones(tmp_path):
    store = Lessons(tmp_path / "lessons", builtin=tmp_path / "shipped")
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / "story.json").write_text(to_json(lesson()))
    assert store.names() == ["story"] and store.load("story").builtin
    edited = store.load("story").retitled("My story")
    store.save(edited)
    assert not store.load("story").builtin and store.load("story").title == "My story"
    assert store.names() == ["story"]  # the workspace's copy takes the built-in's place
    store.set_position("story", 3)
    assert store.names() == ["story"]  # the position file is no lesson
    assert store.position("story") == 3
    store.delete("story")
    assert store.load("story").builtin and store.position("story") is None
    assert store.free_name("The story") == "the-story"
    store.save(Lesson("the-story", "The story"))
    assert store.free_name("The story") == "the-story-2"
    with pytest.raises(ValueError, match="lower-case letters"):
        store.load("../secrets")


def test_slugs_are_file_names():
    assert slug("Teach ν: the Papers' Story!") == "teach-the-papers-story"
    assert slug("???") == "lesson"


def test_the_built_in_lessons_load_and_name_pages_of_the_app():
    views = Path(__file__).resolve().parents[2] / "ui" / "dashboard" / "views"
    pages = {"", *(p.stem for p in views.glob("*.py") if p.stem != "home")}  # their addresses
    assert "recommend" in pages and "layers" in pages
    store = Lessons(BUILTIN / "none", builtin=BUILTIN)
    assert store.names()
    for name in store.names():
        shipped = store.load(name)
        assert shipped.builtin and len(shipped) >= 3
        assert {s.page for s in shipped.steps} <= pages
        assert all(s.note for s in shipped.steps)  # every step says what to look at
