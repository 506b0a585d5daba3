"""The layer table's rows (and the layer repeats) as one task per layer: the same numbers bit for
bit in worker processes as in this one, from an array or from the cache file, rows in layer
order with their progress, and a killed worker costing only its own table."""

from __future__ import annotations

import itertools
import os
import signal
import threading

import numpy as np
import pytest

from analysis import compute
from analysis.cache import DiskCache, TensorSpec
from analysis.layers import rows
from analysis.layers.metrics import encode_classes, split_indices
from analysis.layers.probe import outer_folds
from analysis.layers.table import layer_metrics


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


def stored(tmp_path, states: np.ndarray):
    """``states`` written to a cache entry: the `StoredTensor` a table reads from its file."""
    specs = {"states": TensorSpec("F32", states.shape, row_dim=1)}

    def write(writer):
        for layer in range(states.shape[0]):
            writer.write("states", states[layer], 0, index=layer)
        return {}

    cache = DiskCache(tmp_path)
    cache.get_or_write("states", {"r": 1}, specs, write)
    return cache.stored("states", {"r": 1})["states"]


@pytest.fixture(scope="module")
def workers():
    pool = compute.Workers(2)
    yield pool
    pool.shutdown()


def test_a_table_fitted_in_two_workers_equals_one_process_bit_for_bit(workers, tmp_path):
    states, labels = states_and_labels()
    alone = layer_metrics(states, labels, seed=3)
    for source in (states, stored(tmp_path, states)):  # the layers sent, or read from the file
        shared = layer_metrics(source, labels, seed=3, executor=workers)
        assert shared.equals(alone)
        np.testing.assert_array_equal(
            shared.attrs["probe_predictions"], alone.attrs["probe_predictions"]
        )
        assert shared.attrs["probe_c_folds"] == alone.attrs["probe_c_folds"]
    assert workers.started == 2 and workers.completed >= 10
    assert alone["probe"].notna().all() and alone["nu"].nunique() == 5


def test_a_stored_layer_is_read_memory_mapped_from_its_file(tmp_path, monkeypatch):
    states, _ = states_and_labels(n_layers=3)
    monkeypatch.chdir(tmp_path)
    entry = stored("cache", states)  # a relative path: a task gets it absolute
    assert not entry.path.is_absolute()
    source = rows.layer_source(entry, 2)
    assert isinstance(source, rows.StoredLayer) and source.stored.path.is_absolute()
    layer = rows.read_layer(source)
    assert isinstance(layer, np.memmap) and not layer.flags.writeable
    np.testing.assert_array_equal(layer, states[2])


def test_progress_counts_up_to_every_layer_and_rows_come_in_layer_order(workers):
    states, labels = states_and_labels(n_layers=6)
    classes = encode_classes(labels)[0]
    arguments = (classes, labels, split_indices(classes, 0), "accuracy", ("nu",), 0,
                 outer_folds(classes, 0))  # fmt: skip
    for executor in (compute.IN_PROCESS, workers):
        seen = []
        fitted = rows.layer_rows(
            states, arguments, executor=executor,
            done=lambda finished, total, seen=seen: seen.append((finished, total)),
        )  # fmt: skip
        assert [row["layer"] for row, _ in fitted] == list(range(6))
        assert seen[-1] == (6, 6) and all(b[0] >= a[0] for a, b in itertools.pairwise(seen))


def test_a_killed_worker_fails_its_table_clearly_and_the_next_table_is_whole(workers):
    states, labels = states_and_labels()
    expected = layer_metrics(states, labels, seed=1)
    victim = workers.submit(os.getpid).result()
    killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))  # mid-table
    killer.start()
    with pytest.raises(compute.WorkerDied, match="ended before it finished"):
        layer_metrics(np.repeat(states, 8, axis=1), np.repeat(labels, 8), seed=1,
                      executor=workers)  # fmt: skip
    killer.join()
    again = layer_metrics(states, labels, seed=1, executor=workers)  # a new worker took its place
    assert again.equals(expected)


def test_an_error_in_a_worker_reaches_the_caller(workers):
    states, labels = states_and_labels()
    classes = encode_classes(labels)[0]
    with pytest.raises(ValueError, match="Unknown metric"):
        rows.layer_rows(
            states, (classes, labels, split_indices(classes, 0), "no-such-metric", ("probe",), 0,
                     outer_folds(classes, 0)), executor=workers,
        )  # fmt: skip


def test_layer_repeats_in_two_workers_equal_one_process_bit_for_bit(workers, tmp_path):
    from analysis.layers.repeats import layer_repeats

    states, labels = states_and_labels(n_layers=4, n=240)
    alone = layer_repeats(states, labels, seed=2, repeats=6)
    shared = layer_repeats(stored(tmp_path, states), labels, seed=2, repeats=6, executor=workers)
    np.testing.assert_array_equal(shared.values, alone.values)
    np.testing.assert_array_equal(shared.jackknife, alone.jackknife)
    assert np.isfinite(shared.values[:, :, :3]).all()
    assert shared.attrs["jackknife_groups"] == alone.attrs["jackknife_groups"] == 20
