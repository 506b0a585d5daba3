"""``python -m tunescope <subcommand>`` (or ``tunescope <subcommand>`` once installed): the
headless face of tunescope.

Subcommands are discovered from ``tunescope/commands/``: every module there that defines ``NAME``
also defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` (``options`` holds the
code they share).
A ValueError (bad input, unknown model, malformed file…) or a `CacheError` (not enough disk
space, an entry that cannot be read) prints one clear line and exits 2. A warning meant for the
user (a category tunescope defines: a text column of numbers, a cache folder that is not there)
prints one ``warning: …`` line on stderr. Every command computes with
`analysis.compute.default_executor` (its layer tables fan out over child processes).

A subcommand (or one of its actions) that only reads sets ``writes=False`` as a parser default:
it is then never the one to create a missing cache folder (`Workspace.from_env`). One whose
options come from a library module that imports torch (``claims``: `ClaimsConfig`'s defaults
and help) sets ``LAZY = True``: its options are added when it parses or shows its help, so that
building the command line (``--help``, every other command) imports no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys
import warnings
from collections.abc import Callable, Iterator

import tunescope.commands
from analysis import compute
from analysis.cache import CacheError
from analysis.progress import Cancelled
from analysis.workspace import Workspace


def build_parser(prog: str = "python -m tunescope") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="tunescope: which layers and heads of an encoder should you tune for your task?",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser
    )
    for info in sorted(pkgutil.iter_modules(tunescope.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tunescope.commands.{info.name}")
        if not hasattr(module, "NAME"):  # shared code (options), not a subcommand
            continue
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        if getattr(module, "LAZY", False):
            command.add_arguments = module.add_arguments
        else:
            module.add_arguments(command)
        command.set_defaults(handler=module.run)
    return parser


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser; a ``LAZY`` one's options are added on first use."""

    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None

    def _ready(self) -> None:
        add, self.add_arguments = self.add_arguments, None
        if add is not None:
            add(self)

    def parse_known_args(self, args=None, namespace=None):
        self._ready()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._ready()
        return super().format_help()


def main(argv: list[str] | None = None, prog: str = "python -m tunescope") -> int:
    parser = build_parser(prog)
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "passed_on"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # a subcommand that hands what it does not know on (``app``: to Streamlit)
        args.passed_on = [*args.passed_on, *extra]
    try:
        with _user_warnings():
            # The command's one workspace (``--cache``, else $TUNESCOPE_CACHE, else ./cache).
            args.workspace = Workspace.from_env(
                getattr(args, "cache", None), writes=getattr(args, "writes", True)
            )
            with (
                args.workspace.active(),
                compute.default_executor() as executor,
                compute.using(executor),
            ):
                return int(args.handler(args) or 0)
    except Cancelled as exc:
        print(f"cancelled: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("cancelled by the user", file=sys.stderr)
        return 130
    except (CacheError, ValueError) as exc:  # the user's input, or the cache's disk: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory — try a smaller N, batch size or max length", file=sys.stderr)
        return 3


@contextlib.contextmanager
def _user_warnings() -> Iterator[None]:
    """Show tunescope's own warnings (categories defined under ``analysis``) as one line each,
    once per message; other warnings as Python shows them."""
    with warnings.catch_warnings():
        python_shows = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            if category.__module__.startswith("analysis."):
                print(f"warning: {message}", file=sys.stderr)
            else:
                python_shows(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def entry_point() -> None:
    """The ``tunescope`` command (``[project.scripts]`` in pyproject.toml)."""
    sys.exit(main(prog="tunescope"))
