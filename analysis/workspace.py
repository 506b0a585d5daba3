"""The folder tunescope works in (`Workspace`): the disk cache, the runs database, each run's
files, the disable experiment's files, uploads, the workers' locks and log — the layout, spelled
out once.

The entry points build it once — `tunescope.cli.main` (from ``--cache``), ``app.py`` and the
worker (``python -m analysis.runs.worker --cache``) — with `Workspace.from_env`, the one place
that reads ``TUNESCOPE_CACHE``, and make it current for what they run (`Workspace.active`): the
library's defaults (`analysis.cache.default_root`, ``RunsDB()``) then name this workspace. A
worker this process starts gets the root explicitly.

It names places and opens nothing: the runs database (``RunsDB(workspace)``) and the disk cache
(``DiskCache(workspace.root)``) are built by the code above it, which imports this module, never
the other way round.

    <root>/                    the disk cache's entries (`analysis.cache.DiskCache`)
    <root>/runs.sqlite         the runs database
    <root>/runs/<run id>/      the files a run writes (its trajectory)
    <root>/subspace/<run id>/  the zero-weights files of the disable experiment made from a run
    <root>/uploads/            files uploaded on the pages
    <root>/lessons/            lessons, where their presenter is, what was prepared (analysis.lessons)
    <root>/worker-<device>.lock, worker.log   the background workers' locks and their log
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV = "TUNESCOPE_CACHE"
DATA_ENV = "TUNESCOPE_DATA_DIR"
PACKAGES = Path(__file__).resolve().parent.parent  # the folder holding `analysis` (and `ui`)
_current: contextvars.ContextVar[Workspace | None] = contextvars.ContextVar(
    "tunescope_workspace", default=None
)


def home() -> Path:
    """Where the default ``cache/`` and ``data/`` folders sit: the checkout tunescope runs from
    (its pyproject.toml beside the packages), else the working folder (an installed tunescope,
    started from any folder)."""
    return PACKAGES if (PACKAGES / "pyproject.toml").is_file() else Path.cwd()


def default_cache() -> Path:
    return (home() / "cache").resolve()


def data_folder() -> Path:
    """The data folder the dashboard lists and typed relative paths start from:
    ``$TUNESCOPE_DATA_DIR``, else ``data/`` in `home`."""
    return Path(os.environ.get(DATA_ENV, home() / "data")).expanduser().resolve()


class MissingCacheWarning(UserWarning):
    """A command that only reads was pointed at a cache folder that does not exist."""


@dataclass(frozen=True)
class Workspace:
    """One cache root and the folder layout under it (module docstring)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).expanduser().resolve())

    @classmethod
    def from_env(cls, cache: str | Path | None = None, writes: bool = True) -> Workspace:
        """``cache`` when given (``--cache``), else ``$TUNESCOPE_CACHE``, else `default_cache`.

        Nothing is created here; what writes creates the folder. For a command that only reads
        (``writes=False``) a missing folder other than the default ``cache/`` is most likely a
        mistyped path: one `MissingCacheWarning` names it, and the command reads an empty
        workspace without creating one."""
        env = os.environ.get(ENV)
        workspace = cls(Path(cache) if cache else Path(env) if env else default_cache())
        if not writes and not workspace.root.exists() and workspace.root != default_cache():
            source = "--cache" if cache else ENV
            warnings.warn(
                f"the cache folder {workspace.root} ({source}) does not exist: nothing was "
                "computed or recorded there. Check the path; nothing is created.",
                MissingCacheWarning,
                stacklevel=2,
            )
        return workspace

    @classmethod
    def current(cls) -> Workspace:
        """The workspace an entry point made current, else the environment's."""
        return _current.get() or cls.from_env()

    @contextlib.contextmanager
    def active(self) -> Iterator[Workspace]:
        """Make this the current workspace while the block runs (this thread's context)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    # -- the layout ------------------------------------------------------------------------------

    @property
    def runs_db(self) -> Path:
        return self.root / "runs.sqlite"

    def run_folder(self, run_id: str) -> Path:
        """The files a run writes (its trajectory snapshots)."""
        return self.root / "runs" / run_id

    def disable_folder(self, run_id: str) -> Path:
        """The zero-weights files of the disable experiment made from run ``run_id``: they go
        with that run (the Runs page and ``runs delete --files-only`` delete them with it)."""
        return self.root / "subspace" / run_id

    def outlier_file(self, run_id: str) -> Path:
        """The zero-weights file of run ``run_id``'s outlier weights."""
        return self.disable_folder(run_id) / "zero-outliers.json"

    def random_file(self, run_id: str, seed: int) -> Path:
        """The zero-weights file of as many random weights, drawn with ``seed``."""
        return self.disable_folder(run_id) / f"zero-random-seed{seed}.json"

    def random_files(self, run_id: str) -> list[Path]:
        return sorted(self.disable_folder(run_id).glob("zero-random-seed*.json"))

    @property
    def uploads(self) -> Path:
        return self.root / "uploads"

    @property
    def lessons(self) -> Path:
        return self.root / "lessons"

    def lock(self, device: str) -> Path:
        """The lock file of the worker serving ``device`` (``cpu``, ``cuda:0``, ``ray``)."""
        return self.root / f"worker-{device.replace(':', '')}.lock"

    @property
    def worker_log(self) -> Path:
        return self.root / "worker.log"

    def environment(self) -> dict[str, str]:
        """What a child process needs in its environment to work here."""
        return {ENV: str(self.root)}
