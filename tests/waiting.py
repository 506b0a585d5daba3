"""Polling for what a background process (worker, Ray task, browser) will do: one helper for
every test that waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str = "", log: Path | None = None
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; after ``timeout``
    seconds an AssertionError naming ``what``, with the tail of ``log`` when there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    detail = log.read_text()[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")
