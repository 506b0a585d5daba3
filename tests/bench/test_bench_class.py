"""bench/bench_class.py's reading of the compute log: the server's part of each session's wait."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_class


def test_served_times_pair_each_sessions_first_view_with_its_first_table():
    t0 = 1000.0
    rows = [
        ("view", "0", "990.0", "script run", "alone"),
        ("computed", "5", "1002.0", "Layer metrics", "alone"),  # the alone session: 12 s
        ("view", "0", "1003.0", "script run", "aaaa"),
        ("view", "0", "1004.0", "script run", "aaaa"),  # a rerun: the first view counts
        ("asked", "0", "1003.5", "Layer metrics", "aaaa"),
        ("computed", "2", "1010.0", "Layer metrics", "aaaa"),  # 7 s
        ("computed", "2", "1030.0", "Layer metrics", "aaaa"),  # a later table: not the first
        ("view", "0", "1005.0", "script run", "bbbb"),
        ("computed", "1", "1025.0", "Extracting hidden states", "bbbb"),
        ("computed", "2", "1026.0", "Layer metrics", "bbbb"),  # 21 s
        ("view", "0", "1006.0", "script run", "cccc"),  # no figure yet: not counted
        ("computed", "2", "1040.0", "Layer metrics", "-"),  # outside a session
    ]
    served, alone = bench_class.served_times([list(r) for r in rows], t0)
    assert served == [7.0, 21.0]
    assert alone == 12.0
