"""The Lessons page's parts: the title, the links to present and to follow, the Prepare panel
(estimate, progress, each step's status) and one editor per step."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.lessons.lesson import Lesson, Lessons, Step, page_title
from analysis.lessons.prepare import describe_estimate, statuses, unique_needs
from analysis.words import counted
from analysis.workspace import Workspace


def _save(lessons: Lessons, lesson: Lesson) -> None:
    lessons.save(lesson)


def header(lessons: Lessons, lesson: Lesson) -> None:
    title = st.text_input("Title", lesson.title, key=f"lesson_title_{lesson.name}")
    if title.strip() and title.strip() != lesson.title:
        _save(lessons, lesson.retitled(title.strip()))
        st.rerun()


def present_links(lesson: Lesson) -> None:
    """The lesson's one link, three ways: present, follow (for the students), own pace."""
    if not lesson.steps:
        return
    c1, c2, c3 = st.columns(3)
    c1.markdown(
        f'<a href="{lesson.link(1, "present")}" target="_self">▶ Present from step 1</a>',
        unsafe_allow_html=True,
    )
    c2.markdown("Students' link (they follow you):")
    c2.code(lesson.link(1, "follow"), language=None)
    c3.markdown("At their own pace:")
    c3.code(lesson.link(1), language=None)
    st.caption("The links are relative to this server's address (e.g. http://127.0.0.1:8501).")


def _runner():
    from ui.lessons.prepare import PageRunner

    return PageRunner(Workspace.current())


def prepare_panel(lessons: Lessons, lesson: Lesson) -> None:
    """Prepare: an estimate first, then every step's results with a progress bar; each step's
    status (prepared, not prepared, or changed since preparing)."""
    st.subheader("Prepare for class")
    runner = _runner()
    uploads = Workspace.current().uploads
    try:
        needs, _ = unique_needs(lesson, uploads)
        todo = [n for n in needs if not runner.cached(n)]
        estimates = [runner.estimate(n) for n in todo if n.kind != "claim runs"]
    except ValueError as exc:
        st.error(f"This lesson cannot be prepared: {exc}", icon="⚠️")
        return
    runs = [n for n in todo if n.kind == "claim runs"]
    st.markdown(
        f"{counted(len(needs), 'result')} to have ready, {len(todo)} not in the cache yet: "
        f"{describe_estimate(estimates)} of computing on this machine"
        + (f", plus the fine-tuning runs of {counted(len(runs), 'Paper check step')}, queued for "
           "the background workers (their estimate is said when they are queued)" if runs else "")
        + ". Keep this page open while it runs (`tunescope lesson prepare` does the same from a "
        "terminal)."
    )  # fmt: skip
    if st.button("Prepare", key="lesson_prepare", type="primary", disabled=not needs):
        bar = st.progress(0.0, text="Preparing…")
        from ui.lessons.prepare import prepare_lesson

        done = prepare_lesson(
            lesson.name, lambda f, m="": bar.progress(min(max(f, 0.0), 1.0), text=m)
        )
        bar.empty()
        st.success(
            f"Prepared in {done.seconds:.0f} s: {done.computed} computed, "
            f"{len(done.done) - done.computed} already in the cache."
        )
        for need, why in done.failed:
            st.error(f"{need.label}: {why}", icon="⚠️")
    found = statuses(lesson, lessons, runner.digest, runner.cached, uploads)
    table = pd.DataFrame(
        {
            "step": range(1, len(lesson) + 1),
            "title": [s.label(i) for i, s in enumerate(lesson.steps)],
            "page": [page_title(s.page) for s in lesson.steps],
            "status": [s.state for s in found],
            "why": [s.why for s in found],
        }
    )
    st.dataframe(table, hide_index=True, width="stretch")


def heading(step: Step, index: int) -> str:
    """A step's expander: its number and title, and its page where the title does not name it
    ("2. Layers", "3. TREC at layer 2 — Layers"; never "Step 1: Layers — Layers")."""
    page, title = page_title(step.page), step.title.strip()
    return f"{index + 1}. {title} — {page}" if title and title != page else f"{index + 1}. {page}"


def step_editor(lessons: Lessons, lesson: Lesson, index: int) -> None:
    """One step: its title and note (saved as typed), its view, open / move / copy / delete."""
    step = lesson.steps[index]
    with st.expander(heading(step, index), expanded=len(lesson) <= 3):
        key = f"lesson_{lesson.name}_{index}_{hash(step) & 0xFFFFFF:x}"
        title = st.text_input("Step title", step.title, key=f"{key}_title")
        note = st.text_area("Note (Markdown, formulas between dollar signs)", step.note, key=f"{key}_note",
                            height=120)  # fmt: skip
        if title != step.title or note != step.note:
            _save(lessons, lesson.replace(index, title=title, note=note))
            st.rerun()
        if step.note:
            with st.container(border=True):
                st.markdown(step.note)
        st.markdown(
            f'<a href="{step.link()}" target="_self">Open this view</a> · '
            f'<a href="{lesson.link(index + 1, "present")}" target="_self">present from here</a>',
            unsafe_allow_html=True,
        )
        st.caption("View: " + (", ".join(f"{k}={v}" for k, v in step.params) or "the defaults"))
        c1, c2, c3, c4 = st.columns(4)
        edits = (
            (c1, "Up", lambda: lesson.move(index, -1), index == 0),
            (c2, "Down", lambda: lesson.move(index, 1), index == len(lesson) - 1),
            (c3, "Duplicate", lambda: lesson.duplicate(index), False),
            (c4, "Delete", lambda: lesson.delete(index), False),
        )
        for column, label, edit, disabled in edits:
            if column.button(label, key=f"{key}_{label}", disabled=disabled):
                _save(lessons, edit())
                st.rerun()
