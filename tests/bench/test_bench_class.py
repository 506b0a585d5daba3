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
        ("computed", "1", "991.0", "Extracting hidden states", "alone"),
        ("view", "0", "1003.0", "script run", "aaaa"),
        ("computed", "1", "1003.2", "Extracting hidden states", "aaaa"),
        ("view", "0", "1004.0", "script run", "aaaa"),  # a rerun: the first view counts
        ("asked", "0", "1003.5", "Layer metrics", "aaaa"),
        ("computed", "2", "1010.0", "Layer metrics", "aaaa"),  # 7 s
        ("computed", "2", "1030.0", "Layer metrics", "aaaa"),  # a later table: not the first
        ("view", "0", "1005.0", "script run", "bbbb"),
        ("computed", "1", "1025.0", "Extracting hidden states", "bbbb"),
        ("computed", "2", "1026.0", "Layer metrics", "bbbb"),  # 21 s
        ("view", "0", "1006.0", "script run", "cccc"),  # no figure yet: not counted
        ("computed", "2", "1040.0", "Layer metrics", "-"),  # outside a session
        ("view", "0", "1050.0", "script run", "heads"),  # a Heads page: both from the cache
        ("computed", "0.01", "1050.1", "Extracting hidden states", "heads"),
        ("computed", "0.0", "1050.1", "Layer metrics", "heads"),
    ]
    served, alone, ready = bench_class.served_times([list(r) for r in rows], t0)
    assert served == [7.0, 21.0]
    assert alone == 12.0
    assert ready == [10.0, 26.0]


def test_unfinished_counts_asked_computations_without_an_end(tmp_path):
    log = tmp_path / "compute.log"
    assert bench_class.unfinished(log) == 0
    log.write_text(
        "asked\t0\t1\tLayer metrics\taaaa\n"
        "asked\t0\t1\tRepeats\taaaa\n"
        "computed\t1\t2\tLayer metrics\taaaa\n"
        "asked\t0\t1\tRepeats\tbbbb\n"
        "failed\t1\t2\tRepeats\tbbbb\n"
    )
    assert bench_class.unfinished(log) == 1  # aaaa's repeats are still running
