"""The Recommend page's hold on the comparison's runs: "Cancel the rest" of those still queued or
training (`ui.cancel`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ui.cancel import cancel_rest

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB


def cancel_rest_view(db: RunsDB, status: Mapping[str, Mapping[int, tuple[str, str]]]) -> None:
    """``status``: arm → seed → (status, run id) of the runs that stand for the comparison
    (`analysis.recommend.outcome.run_status`)."""
    statuses = {run_id: state for by_seed in status.values() for state, run_id in by_seed.values()}
    cancel_rest(db, statuses, "rec_cancel_rest")
