"""A lesson: an ordered list of steps a teacher presents, each one page's whole view and a note.

A step's *view* is what a link to it holds: the page (its address, ``layers``) and the query
parameters that page and the sidebar read (settings, tab, controls, selected layer / heads /
examples). Opening a step is opening that link, so a step restores exactly what a copied link
restores, and a lesson needs no second way of setting a page up. The note is Markdown (formulas
as ``$…$``).

A lesson is a small JSON file, written so that a diff reads well: one parameter per line, the
note as a list of its lines. Lessons live in the workspace (``<cache>/lessons/<name>.json``)
next to two small files of their own: where the presenter is (``<name>.position.json``, which
the students who follow poll) and what was prepared (``<name>.prepared.json``,
`analysis.lessons.prepare`). The built-in lessons ship in ``analysis/lessons/builtin/``; a
workspace lesson of the same name (an edited copy) takes the built-in's place.

See docs/tutorials/teach-a-lesson.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from analysis.io import atomic_write_json, atomic_write_text, parse_json, read_json
from analysis.words import counted

FORMAT = 1
BUILTIN = Path(__file__).resolve().parent / "builtin"
SUFFIX = ".json"
# The lesson's own link parameters: where a step sits in its lesson, never part of a step's view.
LESSON_PARAMS = ("lesson", "step", "mode", "large")
MODES = ("self", "follow", "present")  # at one's own pace, following the presenter, presenting
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_PAGE = re.compile(r"[a-z0-9_-]{0,40}")


@dataclass(frozen=True)
class Step:
    """One page's whole view and the teacher's note about it.

    page: the page's address (``layers``; ``""`` is Home); params: its query parameters, as a
    link holds them (texts; a tuple of texts for a parameter given several times, as a
    multiselect writes it), kept sorted so that equal views compare equal."""

    page: str
    params: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    title: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.page, str) or not _PAGE.fullmatch(self.page):
            raise ValueError(
                f"A step's page must be a page address such as 'layers' (got {self.page!r})."
            )
        params = dict(self.params.items() if isinstance(self.params, Mapping) else self.params)
        for key, value in params.items():
            if isinstance(value, list):
                value = params[key] = tuple(value)
            texts = value if isinstance(value, tuple) else (value,)
            if not isinstance(key, str) or not key or not all(isinstance(v, str) for v in texts):
                raise ValueError(
                    f"A step's parameters are names and texts, as in a link (got {key!r}: {value!r})."
                )
        own = sorted(set(params) & set(LESSON_PARAMS))
        if own:
            raise ValueError(
                f"A step's view cannot hold the lesson's own parameters ({', '.join(own)})."
            )
        object.__setattr__(self, "params", tuple(sorted(params.items())))
        object.__setattr__(self, "title", str(self.title or "").strip())
        object.__setattr__(self, "note", str(self.note or "").strip("\n"))

    @property
    def view(self) -> dict[str, str | tuple[str, ...]]:
        return dict(self.params)

    def label(self, index: int) -> str:
        """How lists name this step: its title, else its page."""
        return self.title or f"Step {index + 1}: {page_title(self.page)}"

    def link(self, **lesson: str | int) -> str:
        """The step's address (relative to the server), with the lesson's own parameters."""
        query = {**self.view, **{k: str(v) for k, v in lesson.items() if v not in (None, "")}}
        return f"/{self.page}" + (f"?{urlencode(query, doseq=True)}" if query else "")


PAGE_TITLES = {
    "": "Home", "data": "Data", "layers": "Layers", "heads": "Heads", "finetune": "Fine-tune",
    "subspace": "Subspaces", "runs": "Runs", "claims": "Paper check", "recommend": "Recommend",
    "lessons": "Lessons",
}  # fmt: skip


def page_title(page: str) -> str:
    return PAGE_TITLES.get(page, page)


@dataclass(frozen=True)
class Lesson:
    """An ordered list of steps under a title; ``name`` is its file's name (a slug)."""

    name: str
    title: str
    steps: tuple[Step, ...] = ()
    builtin: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"A lesson's name is lower-case letters, digits and dashes (got {self.name!r})."
            )
        object.__setattr__(self, "title", str(self.title or "").strip() or self.name)
        object.__setattr__(self, "steps", tuple(self.steps))

    def __len__(self) -> int:
        return len(self.steps)

    def step(self, number: int) -> Step:
        """Step ``number``, counted from 1 as the bar shows it."""
        if not 1 <= number <= len(self.steps):
            raise ValueError(
                f"The lesson '{self.title}' has {counted(len(self.steps), 'step')}; there is no step "
                f"{number}."
            )
        return self.steps[number - 1]

    def link(self, number: int = 1, mode: str = "self") -> str:
        """The lesson's link: step ``number`` with the lesson's parameters (one link to share)."""
        return self.step(number).link(
            lesson=self.name, step=number, mode="" if mode == "self" else mode
        )

    # -- editing (each returns a new lesson) ------------------------------------------------------

    def _with(self, steps: Iterable[Step]) -> Lesson:
        return dataclasses.replace(self, steps=tuple(steps), builtin=False)

    def _index(self, index: int) -> int:
        if not 0 <= index < len(self.steps):
            raise ValueError(f"There is no step {index + 1} in '{self.title}'.")
        return index

    def add(self, step: Step) -> Lesson:
        return self._with([*self.steps, step])

    def replace(self, index: int, **changes: Any) -> Lesson:
        """Step ``index`` (from 0) with its title, note or view changed."""
        steps = list(self.steps)
        steps[self._index(index)] = dataclasses.replace(steps[index], **changes)
        return self._with(steps)

    def move(self, index: int, by: int) -> Lesson:
        """Step ``index`` moved ``by`` places (−1: one up), kept within the lesson."""
        steps = list(self.steps)
        step = steps.pop(self._index(index))
        steps.insert(min(max(index + by, 0), len(steps)), step)
        return self._with(steps)

    def duplicate(self, index: int) -> Lesson:
        steps = list(self.steps)
        steps.insert(self._index(index) + 1, steps[index])
        return self._with(steps)

    def delete(self, index: int) -> Lesson:
        steps = list(self.steps)
        del steps[self._index(index)]
        return self._with(steps)

    def retitled(self, title: str) -> Lesson:
        return dataclasses.replace(self, title=title, builtin=False)


# -- the file ----------------------------------------------------------------------------------


def to_json(lesson: Lesson) -> str:
    """The lesson's file: indented JSON, one parameter per line, each note as its lines."""
    payload = {
        "format": FORMAT,
        "title": lesson.title,
        "steps": [
            {
                "title": step.title,
                "page": step.page,
                "view": {k: list(v) if isinstance(v, tuple) else v for k, v in step.params},
                "note": step.note.split("\n") if step.note else [],
            }
            for step in lesson.steps
        ],
    }
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"


def from_json(text: str | bytes, name: str) -> Lesson:
    """A lesson from its file's text; one clear ValueError for anything malformed."""
    payload = parse_json(text, "lesson file")
    if not isinstance(payload, dict) or not isinstance(payload.get("steps"), list):
        raise ValueError("A lesson file is a JSON object with a list of 'steps'.")
    if payload.get("format", FORMAT) != FORMAT:
        raise ValueError(
            f"This lesson file has format {payload.get('format')!r}; this tunescope reads format {FORMAT}."
        )
    steps = []
    for number, raw in enumerate(payload["steps"], start=1):
        if not isinstance(raw, dict) or "page" not in raw:
            raise ValueError(f"Step {number} of the lesson file has no 'page'.")
        note = raw.get("note", "")
        if isinstance(note, list):
            note = "\n".join(str(line) for line in note)
        view = raw.get("view", {})
        if not isinstance(view, dict):
            raise ValueError(f"Step {number}'s 'view' must map parameter names to texts.")
        try:
            params = tuple(
                (str(k), tuple(map(str, v)) if isinstance(v, list) else str(v))
                for k, v in view.items()
            )
            steps.append(Step(str(raw["page"]), params, str(raw.get("title", "")), str(note)))
        except ValueError as exc:
            raise ValueError(f"Step {number} of the lesson file: {exc}") from exc
    return Lesson(name, str(payload.get("title", name)), tuple(steps))


def slug(title: str) -> str:
    """A file name for a lesson titled ``title``: lower-case words joined by dashes."""
    words = re.findall(r"[a-z0-9]+", title.lower())
    return "-".join(words)[:64].strip("-") or "lesson"


class Lessons:
    """The lessons of one folder of the workspace, with the built-in ones underneath."""

    def __init__(self, folder: Path, builtin: Path = BUILTIN) -> None:
        self.folder = Path(folder)
        self.builtin = Path(builtin)

    def _own(self, name: str) -> Path:
        Lesson(name, name)  # checks the name: nothing outside the folder is ever named
        return self.folder / f"{name}{SUFFIX}"

    def names(self) -> list[str]:
        """Every lesson's name: the workspace's, then the built-in ones it does not replace."""
        own = self._stems(self.folder)
        return own + [n for n in self._stems(self.builtin) if n not in own]

    @staticmethod
    def _stems(folder: Path) -> list[str]:
        if not folder.is_dir():
            return []
        return sorted(
            p.stem for p in folder.glob(f"*{SUFFIX}")
            if _NAME.fullmatch(p.stem) and not p.stem.endswith((".position", ".prepared"))
        )  # fmt: skip

    def load(self, name: str) -> Lesson:
        own = self._own(name)
        if own.is_file():
            return from_json(own.read_bytes(), name)
        shipped = self.builtin / f"{name}{SUFFIX}"
        if shipped.is_file():
            return dataclasses.replace(from_json(shipped.read_bytes(), name), builtin=True)
        raise ValueError(f"There is no lesson named '{name}' here.")

    def save(self, lesson: Lesson) -> Path:
        return atomic_write_text(self._own(lesson.name), to_json(lesson))

    def delete(self, name: str) -> bool:
        """Delete the workspace's lesson ``name`` (a built-in one comes back in its place)."""
        path = self._own(name)
        for extra in (path, self.position_file(name), self.prepared_file(name)):
            extra.unlink(missing_ok=True)
        return True

    def free_name(self, title: str) -> str:
        """A name for a new lesson titled ``title`` that no lesson here has."""
        base, taken = slug(title), set(self.names())
        name, k = base, 2
        while name in taken:
            name = f"{base[:60]}-{k}"
            k += 1
        return name

    # -- where the presenter is ------------------------------------------------------------------

    def position_file(self, name: str) -> Path:
        return self.folder / f"{name}.position{SUFFIX}"

    def prepared_file(self, name: str) -> Path:
        return self.folder / f"{name}.prepared{SUFFIX}"

    def set_position(self, name: str, step: int) -> None:
        """The presenter is at ``step`` (from 1): followers move there."""
        atomic_write_json(self._position(name), {"step": int(step), "at": time.time()})

    def _position(self, name: str) -> Path:
        self._own(name)
        return self.position_file(name)

    def position(self, name: str) -> int | None:
        """The step the presenter is at, or None when nobody presents this lesson."""
        try:
            step = read_json(self._position(name), "position file").get("step")
        except (OSError, ValueError, AttributeError):
            return None
        return step if isinstance(step, int) and step >= 1 else None
