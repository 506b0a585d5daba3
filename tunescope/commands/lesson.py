"""``lesson``: a teacher's lessons — prepare one ahead of class, see whether it is ready, list.

    tunescope lesson prepare FILE_OR_NAME [--no-wait | --no-runs]   every step's results, cached
    tunescope lesson status NAME                         each step: prepared, not, or changed
    tunescope lesson list                                the workspace's and the built-in lessons

A FILE (a lesson exported from the Lessons page, ``*.json``) is imported into the workspace
under its file name first, so that the dashboard presents what was prepared. See
docs/tutorials/teach-a-lesson.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.words import counted
from tunescope.commands.options import TqdmProgress, add_cache, write_json

NAME = "lesson"
HELP = "prepare a lesson ahead of class (every step into the cache), its status, the lessons"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    prepare = sub.add_parser("prepare", help="compute every step's results into the cache")
    prepare.add_argument("lesson", help="a lesson file (.json) or the name of a lesson here")
    prepare.add_argument(
        "--no-wait", action="store_true",
        help="queue the fine-tuning runs a step needs and return (the background workers train "
        "them) instead of waiting for them",
    )  # fmt: skip
    prepare.add_argument(
        "--no-runs", action="store_true",
        help="prepare the analyses only: no fine-tuning runs (what ./tasks.sh setup and a "
        "server's first start prepare)",
    )  # fmt: skip
    prepare.add_argument("--json", default=None, help="write what was done as JSON ('-': stdout)")
    status = sub.add_parser("status", help="whether each step is prepared")
    status.add_argument("lesson", help="a lesson file (.json) or the name of a lesson here")
    status.add_argument("--json", default=None, help="write the statuses as JSON ('-': stdout)")
    sub.add_parser("list", help="the lessons of the workspace and the built-in ones")
    for command in (prepare, status, *sub.choices.values()):
        if not any(a.dest == "cache" for a in command._actions):
            add_cache(command)


def open_lesson(text: str, store, save: bool):
    """The lesson ``text`` names: a file (imported into the workspace when ``save``) or a name."""
    from analysis.lessons.lesson import from_json, slug

    path = Path(text)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise ValueError(f"The lesson file {text} does not exist.")
        lesson = from_json(path.read_bytes(), slug(path.name.removesuffix(".json")))
        if save:
            store.save(lesson)
        return lesson
    return store.load(text)


def run(args: argparse.Namespace) -> int:
    from analysis.lessons.lesson import Lessons

    store = Lessons(args.workspace.lessons)
    if args.action == "list":
        for name in store.names():
            lesson = store.load(name)
            where = "built-in" if lesson.builtin else "workspace"
            print(f"{name:<28} {counted(len(lesson), 'step'):>9}  {where:<9}  {lesson.title}")
        return 0
    lesson = open_lesson(args.lesson, store, save=args.action == "prepare")
    if args.action == "status":
        return _status(args, store, lesson)
    return _prepare(args, store, lesson)


def _runner(args, wait: bool, runs: bool = True):
    from analysis.lessons.library import ANALYSES, LibraryRunner

    return LibraryRunner(args.workspace, wait_runs=wait, kinds=None if runs else ANALYSES)


def _prepare(args, store, lesson) -> int:
    from analysis.lessons.prepare import describe_estimate, prepare, unique_needs

    runner = _runner(args, wait=not args.no_wait, runs=not args.no_runs)
    uploads = args.workspace.uploads
    needs, _ = unique_needs(lesson, uploads)
    estimates = [
        runner.estimate(n) for n in needs if not runner.cached(n) and n.kind != "claim runs"
    ]
    out = sys.stderr if args.json == "-" else sys.stdout
    print(
        f"lesson '{lesson.title}' ({lesson.name}): {counted(len(lesson), 'step')}, "
        f"{counted(len(needs), 'result')} to have ready; estimate {describe_estimate(estimates)} "
        "of computing for what is not cached yet (fine-tuning runs: said when they are queued)",
        file=out,
    )
    bar = TqdmProgress("preparing")
    try:
        done = prepare(lesson, store, runner.compute, runner.digest, uploads, bar, runner.weight)
    finally:
        bar.close()
    for need, hit, sec in done.done:
        print(f"  {'cached  ' if hit else 'computed'} {sec:8.1f} s  {need.label}", file=out)
    for need, why in done.failed:
        print(f"  FAILED             {need.label}: {why}", file=out)
    print(
        f"prepared in {done.seconds:.1f} s: {done.computed} computed, "
        f"{len(done.done) - done.computed} already cached, {len(done.failed)} failed",
        file=out,
    )
    write_json(args.json, {
        "lesson": lesson.name, "seconds": done.seconds,
        "done": [{"need": n.label, "kind": n.kind, "cached": h, "seconds": s}
                 for n, h, s in done.done],
        "failed": [{"need": n.label, "error": why} for n, why in done.failed],
    })  # fmt: skip
    return 1 if done.failed else 0


def _status(args, store, lesson) -> int:
    from analysis.lessons.prepare import statuses

    runner = _runner(args, wait=False)
    found = statuses(lesson, store, runner.digest, runner.cached, args.workspace.uploads)
    if args.json != "-":
        for number, (step, state) in enumerate(zip(lesson.steps, found, strict=True), start=1):
            print(f"{number:>3}. {step.label(number - 1):<40} {state.state:<18} {state.why}")
    write_json(args.json, {"lesson": lesson.name, "steps": [
        {"step": i + 1, "state": s.state, "why": s.why} for i, s in enumerate(found)
    ]})  # fmt: skip
    return 0 if all(s.ready for s in found) else 1
