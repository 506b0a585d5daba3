"""Progress reporting shared by the app (st.progress) and the CLI (a tqdm bar).

Every long computation in `analysis/` takes an optional ``progress`` callable and calls it
with a fraction in [0, 1] and a short message. It never knows who is listening.
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[float, str], None]


def no_progress(fraction: float, message: str = "") -> None:
    """The default listener: ignore progress."""


def scaled(progress: Progress | None, start: float, stop: float) -> Progress:
    """Map a sub-task's [0, 1] progress onto [start, stop] of the caller's bar."""
    outer = progress or no_progress

    def inner(fraction: float, message: str = "") -> None:
        outer(start + (stop - start) * min(max(fraction, 0.0), 1.0), message)

    return inner


class Cancelled(RuntimeError):
    """Raised inside a computation when the user asked it to stop."""
