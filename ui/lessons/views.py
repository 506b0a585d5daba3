"""The view a page shows, as a lesson step holds it, and the lesson a session is in.

A view is the page's link (`analysis.lessons.lesson.Step`): opening a step opens that link, so
every page restores a step exactly as it restores a copied link (`ui.links`). The lesson a
session is in comes from the link's own parameters (``lesson``, ``step``, ``mode``, ``large``)
and stays with the session while its student clicks through other pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from analysis.lessons.lesson import LESSON_PARAMS, MODES, Lesson, Lessons, Step
from analysis.workspace import Workspace
from ui import links

SIDEBAR = ("model", "data", "n", "seed", "pooling", "max_length")  # always written out in a step
_STATE = "lesson_in_class"


def store() -> Lessons:
    """The lessons of the app's workspace (and the built-in ones)."""
    return Lessons(Workspace.current().lessons)


def current_view(page: str) -> Step:
    """This page's whole view as a step: every parameter of its link, and the sidebar's settings
    written out (a link leaves out defaults, which another server may not share)."""
    params: dict[str, str | tuple[str, ...]] = {}
    for key in st.query_params:
        if key in LESSON_PARAMS:
            continue
        values = st.query_params.get_all(key)
        params[key] = values[0] if len(values) == 1 else tuple(values)
    state = st.session_state
    for key in SIDEBAR:
        value = state.get(key)
        if key not in params and value not in (None, "") and not str(value).startswith("upload a"):
            params[key] = str(value)
    return Step(page, tuple(params.items()))


@dataclass(frozen=True)
class InClass:
    """The lesson this session follows: its name, the step (from 1), how, large text or not."""

    name: str
    step: int
    mode: str = "self"
    large: bool = False

    def link(self, lesson: Lesson, step: int | None = None, mode: str | None = None,
             large: bool | None = None) -> str:  # fmt: skip
        """The address of a step of this lesson, keeping this session's mode and text size."""
        number = self.step if step is None else step
        big = self.large if large is None else large
        mode = self.mode if mode is None else mode
        return lesson.step(number).link(
            lesson=lesson.name, step=number, mode="" if mode == "self" else mode,
            large="1" if big else "",
        )  # fmt: skip


def in_class() -> InClass | None:
    """The lesson of this session: from the link on a session's first run, else as it was."""
    state = st.session_state
    params = st.query_params
    if links.first_run() and "lesson" in params:
        number = links.whole(params.get("step", "1"), 1, 10_000)
        mode = params.get("mode", "self")
        state[_STATE] = InClass(
            params["lesson"], number or 1, mode if mode in MODES else "self",
            params.get("large") == "1",
        )  # fmt: skip
    return state.get(_STATE)


def leave_class() -> None:
    st.session_state.pop(_STATE, None)
    for key in LESSON_PARAMS:
        if key in st.query_params:
            del st.query_params[key]


def keep_in_link(where: InClass) -> None:
    """The lesson's parameters stay in the address bar (a reload or a copied link keeps them)."""
    links.publish("lesson", where.name)
    links.publish("step", where.step)
    links.publish("mode", where.mode, "self")
    links.publish("large", "1" if where.large else None)
