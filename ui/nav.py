"""The path through the dashboard, Data → Layers → Heads → Fine-tune → Subspaces → Runs, and
the link to the next step that every page shows at its bottom (the Paper check, off the path,
leads to Runs, where the runs it queues are followed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from analysis.words import counted

DASHBOARD = Path(__file__).resolve().parent / "dashboard"  # app.py and views/


def page_path(page: str) -> str:
    """The absolute path of a page's script from its id (``views/layers.py``, relative to
    ``ui/dashboard/``): what app.py registers and the links name, whichever main script Streamlit
    runs (``ui/dashboard/app.py``, or the checkout's ``app.py`` that runs it)."""
    return str(DASHBOARD / page)


@dataclass(frozen=True)
class Step:
    page: str  # the page's id (its script, relative to ui/dashboard/)
    title: str
    does: str  # what to do there, for the default demo


PATH = (
    Step("views/data.py", "Data", "look at the data set and what the analyses will cache"),
    Step("views/layers.py", "Layers", "find ℓ*, the layer that separates the classes best"),
    Step("views/heads.py", "Heads", "pick the most informative heads (PageRank)"),
    Step("views/finetune.py", "Fine-tune", "train only what they suggest, against the baselines"),
    Step(
        "views/subspace.py", "Subspaces", "see in how few directions fine-tuning moves the weights"
    ),
    Step("views/runs.py", "Runs", "compare, annotate and export every run"),
)
# Pages off the path, and the page each leads to.
AFTER = {
    "views/claims.py": "views/runs.py",
    "views/recommend.py": "views/runs.py",
    "views/lessons.py": "views/data.py",
}
RECOMMEND = "views/recommend.py"  # every other page links to it too: the answer in one place
ICONS = {
    "Data": ":material/table_view:",
    "Layers": ":material/layers:",
    "Heads": ":material/hub:",
    "Fine-tune": ":material/model_training:",
    "Subspaces": ":material/scatter_plot:",
    "Runs": ":material/list_alt:",
}


def next_of(page: str) -> Step:
    """The step after ``page`` (Home leads to Data; Runs back to Fine-tune, to launch more; a
    page off the path to its step in `AFTER`)."""
    pages = [step.page for step in PATH]
    if page in AFTER:
        return PATH[pages.index(AFTER[page])]
    if page not in pages:
        return PATH[0]
    if page == PATH[-1].page:
        return PATH[3]
    return PATH[pages.index(page) + 1]


def next_step(page: str) -> None:
    """The link to the next step, at the bottom of ``page`` (the sidebar settings come along)."""
    step = next_of(page)
    st.divider()
    if page != RECOMMEND:
        st.page_link(
            page_path(RECOMMEND), icon=":material/recommend:",
            label="The answer in one place: **Recommend** — what to tune, its cost and evidence, "
            "tested against the alternatives at the same budget",
        )  # fmt: skip
    verb = "Launch more runs" if page == PATH[-1].page else "Next"
    st.page_link(
        page_path(step.page),
        label=f"{verb}: **{step.title}** — {step.does}",
        icon=ICONS[step.title],
    )


def path_links() -> None:
    """The whole path, one numbered link per step (the Home page)."""
    for number, step in enumerate(PATH, start=1):
        st.page_link(
            page_path(step.page),
            label=f"{number}. **{step.title}** — {step.does}",
            icon=ICONS[step.title],
        )


BUILTIN_LESSON = "papers-story"


def lesson_link() -> None:
    """The built-in lesson, at one's own pace (the Home page): a link that opens its first step
    (a full page load, as a copied link opens it), and where it is presented from."""
    from analysis.lessons.lesson import BUILTIN, Lessons

    try:
        lesson = Lessons(BUILTIN / "none", builtin=BUILTIN).load(BUILTIN_LESSON)
    except ValueError:
        return
    st.markdown(
        f'<a href="{lesson.link(1)}" target="_self">▶ Take the lesson: {lesson.title}</a> '
        f"({counted(len(lesson), 'step')}; a teacher presents it from the **Lessons** page)",
        unsafe_allow_html=True,
    )
