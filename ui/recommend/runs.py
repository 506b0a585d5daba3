"""The Recommend page's hold on the comparison's runs: "Cancel the rest" of those still queued or
training (`ui.cancel`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ui.cancel import cancel_rest

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB
    from analysis.runs.planner import Stand


def cancel_rest_view(db: RunsDB, stands: Mapping[str, Mapping[int, Stand]]) -> None:
    """``stands``: arm → seed → the run that stands for it in the comparison
    (`analysis.runs.planner.standings`). Cancelling stops its rounds too."""
    statuses = {s.run_id: s.status for by_seed in stands.values() for s in by_seed.values()}
    cancel_rest(db, statuses, "rec_cancel_rest")
