"""Preparing a lesson from the dashboard: the Prepare button, and the built-in lessons on the
server's first start, in the background.

Each need (`analysis.lessons.prepare.needs_of`) is computed through the very cached call its
page makes (`get_states`, `get_layer_metrics`, …): it takes its turn in the server's compute
queue, runs in a compute worker, and a page asking for the same result meanwhile waits for it
instead of computing it again. Fine-tuning runs are queued for the background workers, not
waited for.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from analysis.lessons.library import ANALYSES, LibraryRunner
from analysis.lessons.prepare import Need, prepare
from analysis.progress import Progress, no_progress
from analysis.rates import duration
from analysis.workspace import Workspace

ENV = "TUNESCOPE_PREPARE_LESSONS"  # 0: the server does not prepare the built-in lessons


class PageRunner(LibraryRunner):
    """`LibraryRunner` whose computations go through the pages' cached calls."""

    def __init__(self, workspace: Workspace, kinds: tuple[str, ...] | None = None) -> None:
        from ui.loaders import get_data, get_model

        super().__init__(workspace, wait_runs=False, say=lambda text: None,
                         load_model=get_model, load_data=get_data, kinds=kinds)  # fmt: skip

    def compute(self, need: Need, progress: Progress = no_progress) -> bool:
        if self.kinds is not None and need.kind not in self.kinds:
            return self.cached(need)
        s = need.settings
        if need.kind in ("states", "layer table", "repeats", "picture"):
            return self._layers(need, progress)
        if need.kind == "head statistics":
            from ui.heads.state import get_head_stats

            return bool(get_head_stats(s["stats"])[1]["cache_hit"])
        if need.kind == "attention":
            from ui.heads.attention import _pattern

            extract = s["stats"].extract
            hit = self.cached(need)
            loaded = self.model(extract.model)
            _pattern(loaded.fingerprint, *self.attention_text(s), extract.max_length, loaded)
            return hit
        if need.kind == "claim inputs":
            from ui.claims.state import get_inputs

            get_inputs(s["claims"])
            return False
        if need.kind == "recommendation":
            from ui.recommend.state import get_recommendation

            hit = self.lookup.recommendation_cached(s["rec"])
            get_recommendation(s["rec"])
            return hit
        if need.kind == "trajectory":
            from ui.subspace.state import get_report

            hit = self.lookup.trajectory_cached(s)
            run = self.trajectory_run(s)
            if run is None:
                return super().compute(need, progress)  # says why
            get_report(str(self.runs.db().trajectory_dir(run)), s["centre"])
            return hit
        return super().compute(need, progress)  # claim runs: queued

    def _layers(self, need: Need, progress: Progress) -> bool:
        from analysis.layers.metrics import DEFAULT_BINS
        from ui.layers.state import get_layer_metrics, get_layer_repeats, has_projection
        from ui.layers.state import projection as picture
        from ui.loaders import get_states

        s = need.settings
        states = get_states(s["cfg"])
        if need.kind == "states":
            return bool(states.meta.get("cache_hit"))
        if need.kind == "layer table":
            return get_layer_metrics(states, s["seed"], DEFAULT_BINS)[1]
        if need.kind == "repeats":
            return get_layer_repeats(states, s["seed"], s["repeats"], DEFAULT_BINS)[1]
        layer = self.picture_layer(s)
        hit = has_projection(states, layer, s["method"], s["seed"])
        picture(states, layer, s["method"], s["seed"])
        return hit


def prepare_lesson(name: str, progress: Progress = no_progress, kinds=None):
    """Prepare the workspace's lesson ``name`` through the pages' calls (`PageRunner`)."""
    workspace = Workspace.current()
    from ui.lessons.views import store

    lessons = store()
    lesson = lessons.load(name)
    runner = PageRunner(workspace, kinds)
    return prepare(lesson, lessons, runner.compute, runner.digest, workspace.uploads, progress,
                   runner.weight)  # fmt: skip


_STARTED = threading.Event()
# What the background preparation is doing now (`preparing_note`): the lesson's title while one is
# being prepared, the share done, the current need and when it started.
_NOW: dict = {"title": None, "fraction": 0.0, "message": "", "start": 0.0}


def prepare_builtin_in_background() -> None:
    """On the server's first page: prepare the built-in lessons' analyses in a thread (their
    fine-tuning runs are left to the Prepare button and `tunescope lesson prepare`: hours of
    training nobody asked for would slow every page). Each computation takes its turn in the
    compute queue like a page's, so the first visitor's page shares what it also needs."""
    if _STARTED.is_set() or os.environ.get(ENV, "1").strip() in ("0", "false", "no", "off"):
        return
    _STARTED.set()
    workspace = Workspace.current()
    threading.Thread(target=_prepare_builtin, args=(workspace,), daemon=True,
                     name="tunescope-prepare-lessons").start()  # fmt: skip


def preparing_note() -> str | None:
    """While a built-in lesson is being prepared: what that is and what it means for the first
    pages, with the share done and the time left once some of it is done; else None."""
    title = _NOW["title"]
    if title is None:
        return None
    fraction = _NOW["fraction"]
    elapsed = time.perf_counter() - _NOW["start"]
    left = (f", about {duration(elapsed * (1 - fraction) / fraction)} left"
            if 0.05 <= fraction < 1 else "")  # fmt: skip
    return (
        f"**Preparing the built-in lesson “{title}”** ({100 * fraction:.0f} % done{left}; now: "
        f"{_NOW['message'] or 'starting'}). This server computes the default session's analyses "
        "once and keeps them in its cache: a page that needs one of them waits for it the first "
        "time, then every page and every visitor gets it at once."
    )


def _note(fraction: float, message: str = "") -> None:
    _NOW.update(fraction=min(max(fraction, 0.0), 1.0), message=message)


def _prepare_builtin(workspace: Workspace) -> None:
    from analysis.lessons.lesson import Lessons

    log = logging.getLogger("tunescope.lessons")
    with workspace.active():
        lessons = Lessons(workspace.lessons)
        for name in lessons.names():
            try:
                lesson = lessons.load(name)
                if lesson.builtin:
                    _NOW.update(title=lesson.title, fraction=0.0, message="",
                                start=time.perf_counter())  # fmt: skip
                    done = prepare_lesson(name, _note, kinds=ANALYSES)
                    log.info("built-in lesson %s prepared in %.0f s", name, done.seconds)
            except Exception as exc:  # a lesson that cannot be prepared must not stop the server
                log.warning("the built-in lesson %s was not prepared: %s", name, exc)
            finally:
                _NOW["title"] = None
