"""The presenter bar (step i of n, previous / next, the note beside the view, large text), the
students' "follow the presenter", and "Add this view to a lesson" on every page.

Moving to a step opens its link in the same tab (an ordinary link, or, for a follower, the
browser told to open it), so the step's page starts as a copied link starts it. The presenter's
position lives in the workspace (`analysis.lessons.lesson.Lessons.set_position`); a follower's
page polls it with a fragment every `POLL_S` seconds — a small file read — and moves when the
presenter has.
"""

from __future__ import annotations

import html
import json
from contextlib import nullcontext

import streamlit as st

from analysis.lessons.lesson import Lesson, page_title
from ui import links
from ui.lessons.views import InClass, current_view, in_class, keep_in_link, leave_class, store

POLL_S = 2.0
NEW = "a new lesson…"
LARGE_CSS = """<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 135% !important; }
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 1.35rem; }
[data-testid="stMetricValue"] { font-size: 3rem; }
h1 { font-size: 3.2rem !important; }
</style>"""


def _anchor(text: str, url: str, primary: bool = False) -> str:
    """A link that opens ``url`` in this tab (a fresh view, as a copied link opens it)."""
    style = (
        "display:inline-block;padding:0.25rem 0.8rem;margin-right:0.4rem;border-radius:0.5rem;"
        "text-decoration:none;border:1px solid #d0d0d8;"
        + ("background:#ff4b4b;color:white;" if primary else "color:inherit;")
    )
    return f'<a href="{html.escape(url)}" target="_self" style="{style}">{html.escape(text)}</a>'


def lesson_bar(page: str):
    """Draw the bar of the lesson this session is in (nothing outside a lesson); return the
    container the page draws into (a column beside the note), or a no-op context. A lesson's
    link opened on another page than its step's (``/?lesson=…``) goes to the step's own link."""
    where = in_class()
    if where is None:
        return nullcontext()
    try:
        lesson = store().load(where.name)
        step = lesson.step(where.step)
    except ValueError as exc:
        st.warning(f"{exc} The link's lesson is left.", icon=":material/school:")
        leave_class()
        return nullcontext()
    if links.first_run() and page != step.page:
        _go(where.link(lesson))
        return nullcontext()
    keep_in_link(where)
    if where.mode == "present" and store().position(lesson.name) != where.step:
        store().set_position(lesson.name, where.step)
    if where.large:
        st.html(LARGE_CSS)
    _bar(lesson, where)
    if where.mode == "follow":
        _follow(lesson, where)
    page, note = st.columns([3, 1], gap="large")
    with note:
        st.markdown(f"**{step.label(where.step - 1)}**")
        if step.note:
            st.markdown(step.note)
    return page


def _bar(lesson: Lesson, where: InClass) -> None:
    n = len(lesson)
    parts = [f"<b>{html.escape(lesson.title)}</b> · step {where.step} of {n}"]
    own = "self" if where.mode == "follow" else None  # a follower who steps goes at their pace
    if where.step > 1:
        parts.append(_anchor("◀ Previous", where.link(lesson, where.step - 1, mode=own)))
    if where.step < n:
        parts.append(_anchor("Next ▶", where.link(lesson, where.step + 1, mode=own), primary=True))
    if where.mode == "follow":
        parts.append(_anchor("Go at my own pace", where.link(lesson, mode="self")))
    elif where.mode == "self":
        parts.append(_anchor("Follow the presenter", where.link(lesson, mode="follow")))
    parts.append(_anchor("Normal text" if where.large else "Large text",
                         where.link(lesson, large=not where.large)))  # fmt: skip
    mode = {
        "present": "presenting",
        "follow": "following the presenter",
        "self": "at your own pace",
    }
    parts.append(f"<i>{mode[where.mode]}</i>")
    parts.append(_anchor("Leave the lesson", lesson.step(where.step).link()))
    with st.container(border=True, key="lesson_bar"):
        st.markdown(" ".join(parts), unsafe_allow_html=True)
        if where.mode == "present":
            st.caption(
                "Students follow you from this link: "
                f"`{lesson.link(where.step, mode='follow')}` (after this server's address)."
            )
            _readiness(lesson, where.step)


def _readiness(lesson: Lesson, number: int) -> None:
    """For the presenter: whether this step is served from the cache, or will compute (never
    prepared, or its inputs changed since preparing) — said once per step and session."""
    from analysis.lessons.prepare import step_status
    from analysis.workspace import Workspace
    from ui.lessons.prepare import PageRunner

    key = f"lesson_ready_{lesson.name}_{number}"
    if key not in st.session_state:
        workspace = Workspace.current()
        runner = PageRunner(workspace)
        try:
            st.session_state[key] = step_status(lesson, number - 1, store(), runner.digest,
                                                runner.cached, workspace.uploads)  # fmt: skip
        except ValueError as exc:
            st.session_state[key] = None
            st.caption(f"Whether this step is prepared is unknown: {exc}")
    status = st.session_state[key]
    if status is not None and not status.ready:
        st.warning(f"This step is **{status.state}**: {status.why}. It computes now; prepare the "
                   "lesson on the Lessons page before class.", icon=":material/hourglass:")  # fmt: skip


@st.fragment(run_every=POLL_S)
def _follow(lesson: Lesson, where: InClass) -> None:
    """Move this page to the presenter's step as soon as the presenter moves."""
    at = store().position(lesson.name)
    if at is None:
        st.caption("Waiting for the presenter to start.")
        return
    if at != where.step and 1 <= at <= len(lesson):
        _go(where.link(lesson, at))


def _go(url: str) -> None:
    """Open ``url`` in this tab, as a copied link opens (the browser is told to)."""
    st.html(f"<script>window.location.replace({json.dumps(url)})</script>",
            unsafe_allow_javascript=True)  # fmt: skip


# -- "Add this view to a lesson" -------------------------------------------------------------


def add_view_button(page: str) -> None:
    """The sidebar's "Add this view to a lesson": the lesson, a step title and a note."""
    lessons = store()
    with st.sidebar.popover("Add this view to a lesson", icon=":material/playlist_add:",
                            width="stretch"):  # fmt: skip
        names = lessons.names()
        choice = st.selectbox("Lesson", [NEW, *names], key="add_view_lesson")
        if choice == NEW:
            st.text_input("New lesson's title", key="add_view_title", placeholder="My lesson")
        st.text_input(f"Step title (default: {page_title(page)})", key="add_view_step_title")
        st.text_area(
            "Teacher's note (Markdown, formulas between dollar signs)", key="add_view_note"
        )
        st.button("Add this view", key="add_view_go", on_click=_add, args=(page,),
                  type="primary")  # fmt: skip
        done = st.session_state.get("add_view_done")
        if done:
            st.caption(done)


def _add(page: str) -> None:
    """The button's callback (it runs before the script, while the link is this view's)."""
    state = st.session_state
    lessons = store()
    choice = state.get("add_view_lesson")
    if choice == NEW or not choice:
        title = (state.get("add_view_title") or "").strip() or "My lesson"
        lesson = Lesson(lessons.free_name(title), title)
    else:
        lesson = lessons.load(choice)
    step = current_view(page)
    step = type(step)(step.page, step.params, state.get("add_view_step_title") or "",
                      state.get("add_view_note") or "")  # fmt: skip
    lesson = lesson.add(step)
    lessons.save(lesson)
    state["add_view_last"] = state["add_view_lesson"] = lesson.name  # offered for the next view
    for key in ("add_view_step_title", "add_view_note", "add_view_title"):
        state[key] = ""
    state["add_view_done"] = (
        f"Added as step {len(lesson)} of '{lesson.title}': the Lessons page orders, edits and "
        "presents it."
    )
