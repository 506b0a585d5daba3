"""The layer table's rows (and the layer repeats) fitted side by side in helper processes: the
same numbers bit for bit as one process, the work shared, a killed helper costing nothing, and
helpers ending with their parent."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from analysis.layers import rows
from analysis.layers.metrics import encode_classes, split_indices
from analysis.layers.probe import outer_folds
from analysis.layers.table import layer_metrics

ROOT = Path(__file__).resolve().parents[2]


def states_and_labels(n_layers=5, n=300, d=24, seed=0):
    """Layers whose class separation grows then falls (so the layers' rows differ)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    direction = rng.standard_normal((3, d))
    states = np.stack(
        [
            rng.standard_normal((n, d)) + (0.2 + np.sin(np.pi * k / n_layers)) * direction[labels]
            for k in range(n_layers)
        ]
    ).astype(np.float32)
    return states, labels


@pytest.fixture
def parallel(monkeypatch):
    """Layer rows always shared with one helper, however small the table."""
    monkeypatch.setattr(rows, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setenv(rows.PROCESSES_ENV, "2")


def test_a_table_fitted_in_two_processes_equals_one_process_bit_for_bit(parallel, monkeypatch):
    states, labels = states_and_labels()
    shared = layer_metrics(states, labels, seed=3)
    assert rows.last_share["helpers"] and rows.last_share["here"]  # both processes fitted layers
    assert sorted(rows.last_share["helpers"] + rows.last_share["here"]) == list(range(5))
    monkeypatch.setenv(rows.PROCESSES_ENV, "1")
    alone = layer_metrics(states, labels, seed=3)
    assert rows.last_share == {"here": list(range(5)), "helpers": []}
    assert shared.equals(alone)
    np.testing.assert_array_equal(
        shared.attrs["probe_predictions"], alone.attrs["probe_predictions"]
    )
    assert shared.attrs["probe_c_folds"] == alone.attrs["probe_c_folds"]
    assert shared["probe"].notna().all() and shared["nu"].nunique() == 5


def test_progress_counts_up_to_every_layer_and_rows_come_in_layer_order(parallel):
    states, labels = states_and_labels(n_layers=6)
    classes = encode_classes(labels)[0]
    seen = []
    fitted = rows.layer_rows(
        states,
        (
            classes,
            labels,
            split_indices(classes, 0),
            "accuracy",
            ("nu",),
            0,
            outer_folds(classes, 0),
        ),
        done=lambda finished, total: seen.append((finished, total)),
    )
    assert [row["layer"] for row, _ in fitted] == list(range(6))
    assert seen[-1] == (6, 6) and all(b[0] >= a[0] for a, b in itertools.pairwise(seen))


def test_a_killed_helper_loses_nothing_and_is_replaced(parallel):
    states, labels = states_and_labels()
    expected = layer_metrics(states, labels, seed=1)
    (pid,) = rows.start_helpers()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not getattr(rows._HELPERS, "_broken", False) and time.monotonic() < deadline:
        time.sleep(0.05)  # (the pool notices its process gone)
    again = layer_metrics(states, labels, seed=1)  # a new helper: the old pool broke
    assert again.equals(expected)
    assert rows.start_helpers() != [pid]


def test_an_error_in_a_helper_reaches_the_caller(parallel):
    states, labels = states_and_labels()
    classes = encode_classes(labels)[0]
    with pytest.raises(ValueError, match="Unknown metric"):
        rows.layer_rows(
            states, (classes, labels, split_indices(classes, 0), "no-such-metric", ("probe",), 0,
                     outer_folds(classes, 0)),
        )  # fmt: skip


def test_the_process_count_setting(monkeypatch):
    monkeypatch.setenv(rows.PROCESSES_ENV, "3")
    assert rows.processes() == 3
    monkeypatch.setenv(rows.PROCESSES_ENV, "0")
    assert rows.processes() == 1
    monkeypatch.setenv(rows.PROCESSES_ENV, "many")
    with pytest.raises(ValueError, match="whole number"):
        rows.processes()
    monkeypatch.delenv(rows.PROCESSES_ENV)
    assert rows.processes() == len(os.sched_getaffinity(0))


def test_helpers_end_with_the_process_that_started_them(tmp_path):
    """A parent killed outright (SIGKILL: no clean-up runs) leaves no helper behind."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"os.environ[{rows.PROCESSES_ENV!r}] = '2'\n"
        "from analysis.layers import rows\n"
        "if __name__ == '__main__':\n"
        "    print(rows.start_helpers()[0], flush=True)\n"
        "    time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(parent.stdout.readline())
        os.kill(helper, 0)  # alive
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(helper, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(helper, signal.SIGKILL)
    pytest.fail("the helper outlived its parent by 10 s")


def test_layer_repeats_shared_with_a_helper_equal_one_process_bit_for_bit(parallel, monkeypatch):
    from analysis.layers.repeats import layer_repeats

    states, labels = states_and_labels(n_layers=4, n=240)
    shared = layer_repeats(states, labels, seed=2, repeats=6)
    assert rows.last_share["helpers"] and rows.last_share["here"]
    monkeypatch.setenv(rows.PROCESSES_ENV, "1")
    alone = layer_repeats(states, labels, seed=2, repeats=6)
    np.testing.assert_array_equal(shared.values, alone.values)
    np.testing.assert_array_equal(shared.jackknife, alone.jackknife)
    assert np.isfinite(shared.values[:, :, :3]).all()
