"""Lessons: a teacher's sequences of views — reorder, edit, duplicate, delete, import, export,
prepare ahead of class, present."""

import streamlit as st

from analysis.lessons.lesson import from_json, page_title, slug, to_json
from analysis.words import counted
from ui.lessons import editor
from ui.lessons.views import store
from ui.links import publish, take_link
from ui.nav import next_step

st.title("Lessons")
st.markdown(
    "A lesson is an ordered list of steps; a step is one page with its whole view (the sidebar's "
    "settings, the tab, the controls, the chosen layer, heads or examples) and your note. Add "
    "steps from any page with **Add this view to a lesson** in the sidebar; here you put them "
    "in order, write the notes, **prepare** the lesson (every step's results computed into the "
    "cache before class, so that nothing computes while the class follows) and **present** it: "
    "students who open the students' link follow your steps, or go at their own pace."
)
lessons = store()
names = lessons.names()
if not names:
    st.info("No lesson yet: open a page, set it up, and press *Add this view to a lesson* in the "
            "sidebar.")  # fmt: skip

with st.expander("Import a lesson file", icon=":material/upload_file:"):
    upload = st.file_uploader("A lesson exported from tunescope (.json)", type=["json"],
                              key="lessons_import")  # fmt: skip
    if upload is not None and st.button("Import", key="lessons_import_go"):
        try:
            lesson = from_json(upload.getvalue(), slug(upload.name.removesuffix(".json")))
        except ValueError as exc:
            st.error(str(exc), icon="⚠️")
        else:
            lesson = type(lesson)(lessons.free_name(lesson.title), lesson.title, lesson.steps)
            lessons.save(lesson)
            st.session_state["lessons_pick"] = lesson.name
            st.rerun()
if not names:
    st.stop()

take_link("lessons_pick", lambda text: text if text in names else None,
          "is not a lesson here", "the first lesson", param="edit")  # fmt: skip
name = st.selectbox(
    "Lesson", names, key="lessons_pick",
    format_func=lambda n: f"{lessons.load(n).title} ({n}{', built-in' if lessons.load(n).builtin else ''})",
)  # fmt: skip
publish("edit", name, names[0])
lesson = lessons.load(name)

if lesson.builtin:
    st.caption("A built-in lesson: any edit saves your own copy in the workspace, under the same "
               "name (deleting it brings the built-in one back).")  # fmt: skip
editor.header(lessons, lesson)
editor.present_links(lesson)
editor.prepare_panel(lessons, lesson)
st.subheader(counted(len(lesson), "step"))
for index in range(len(lesson)):
    editor.step_editor(lessons, lesson, index)
left, right = st.columns(2)
left.download_button("Export this lesson (.json)", to_json(lesson), f"{lesson.name}.json",
                     "application/json", key="lessons_export")  # fmt: skip
if not lesson.builtin and right.button("Delete this lesson", key="lessons_delete"):
    lessons.delete(lesson.name)
    st.session_state.pop("lessons_pick", None)
    st.rerun()
st.caption(
    "Pages: " + ", ".join(sorted({page_title(s.page) for s in lesson.steps})) + ". "
    "The file is small JSON, one setting per line: keep it next to your course material."
)
next_step("views/lessons.py")
