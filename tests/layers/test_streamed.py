"""The streamed layer metrics equal the in-memory route (analysis/layers/streamed.py docstring)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

from analysis.cache import DiskCache, TensorSpec
from analysis.layers import streamed, table

# Tolerances justified in analysis/layers/streamed.py's docstring: ν and ϱ relative, CCA absolute;
# the probe is the same fit on the same rows.
NU_RTOL, RANK_RTOL, CCA_ATOL = 1e-8, 1e-8, 1e-8


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with threadpool_limits(1):
        yield


def bert_like(n=900, d=24, n_layers=3, n_classes=2, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """(L+1, N, d) float32 states with a large shared offset, outlier dimensions, anisotropic
    noise and a class signal that varies by layer (the conditions where a one-pass second moment
    would lose digits); labels (N,)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n)
    offset = rng.standard_normal(d) * 3.0
    offset[:2] = [40.0, -25.0]
    directions = rng.standard_normal((n_classes, d))
    mixing = rng.standard_normal((d, d)) * np.linspace(0.05, 1.0, d)
    states = np.empty((n_layers + 1, n, d), dtype=np.float32)
    for layer in range(n_layers + 1):
        states[layer] = (
            offset + rng.standard_normal((n, d)) @ mixing + 0.4 * layer * directions[labels]
        )
    return states, labels


def assert_same(memory: pd.DataFrame, stream: pd.DataFrame) -> None:
    np.testing.assert_allclose(stream["nu"], memory["nu"], rtol=NU_RTOL)
    np.testing.assert_allclose(stream["rank"], memory["rank"], rtol=RANK_RTOL)
    np.testing.assert_allclose(stream["cca"], memory["cca"], rtol=0, atol=CCA_ATOL)
    np.testing.assert_array_equal(stream["probe"], memory["probe"])
    np.testing.assert_array_equal(stream["probe_c"], memory["probe_c"])


@pytest.mark.parametrize("n_classes", [2, 3])
def test_streamed_equals_in_memory(n_classes):
    states, labels = bert_like(n_classes=n_classes, seed=n_classes)
    memory = table.layer_metrics(states, labels, "accuracy", seed=1)
    stream = streamed.streamed_layer_metrics(states, labels, "accuracy", seed=1, chunk_rows=128)
    assert_same(memory, stream)
    assert stream.attrs["route"] == "streamed" and stream.attrs["probe_n"] == len(labels)
    assert {k: stream.attrs[k] for k in ("n", "seed", "n_classes", "task_type")} == {
        k: memory.attrs[k] for k in ("n", "seed", "n_classes", "task_type")
    }


def test_streamed_regression_equals_in_memory():
    states, _ = bert_like(n=500)
    scores = states[2, :, 0].astype(np.float64) + np.random.default_rng(3).normal(size=500)
    memory = table.layer_metrics(states, scores, "spearman", which=("nu", "cca", "rank"))
    stream = streamed.streamed_layer_metrics(
        states, scores, "spearman", which=("nu", "cca", "rank"), chunk_rows=100
    )
    assert_same(memory, stream)
    assert stream.attrs["label_note"] == memory.attrs["label_note"]


def test_streamed_from_the_cache_file_equals_from_memory(tmp_path):
    """States read from a cache entry in chunks (plain file reads) give the same numbers."""
    states, labels = bert_like(n=700)
    specs = {"states": TensorSpec("F32", states.shape, row_dim=1)}

    def write(writer):
        for layer in range(states.shape[0]):
            for start in range(0, 700, 300):
                writer.write("states", states[layer, start : start + 300], start, index=layer)
        return {}

    cache = DiskCache(tmp_path)
    cache.get_or_write("states", {"r": 1}, specs, write)
    stored = cache.stored("states", {"r": 1})["states"]
    which = ("nu", "cca", "rank")
    from_file = streamed.streamed_layer_metrics(stored, labels, which=which, chunk_rows=256)
    from_memory = streamed.streamed_layer_metrics(states, labels, which=which, chunk_rows=256)
    pd.testing.assert_frame_equal(from_file, from_memory)


def test_index_with_repeats_is_the_resampled_sample():
    """index = a bootstrap resample: the same as the in-memory route on states[:, index]."""
    states, labels = bert_like(n=400)
    index = np.random.default_rng(5).integers(0, 400, 400)  # repeats, and some rows left out
    which = ("nu", "cca", "rank")
    memory = table.layer_metrics(states[:, index], labels[index], which=which, seed=2)
    stream = streamed.streamed_layer_metrics(
        states, labels, which=which, seed=2, index=index, chunk_rows=96
    )
    assert_same(memory, stream)


def test_probe_cap_is_a_stratified_subsample():
    states, labels = bert_like(n=1000, n_layers=1)
    labels = np.where(np.arange(1000) < 200, 1, 0)  # 20% positives
    stream = streamed.streamed_layer_metrics(states, labels, which=("probe",), probe_cap=100)
    assert stream.attrs["probe_n"] == 100
    assert "cross-validated predictions on 100 of them" in stream.attrs["route_note"]
    assert stream["probe"].between(0, 1).all() and stream["nu"].isna().all()
    assert (stream["probe_se"] > 0).all()
    chosen = streamed.stratified_subset(np.arange(1000), labels, 100, 0)
    assert len(chosen) == 100 and labels[chosen].sum() == 20  # the class shares kept
    # the streamed probe is the in-memory estimator on the subsample: same folds, same fits
    memory = table.layer_metrics(states[:, chosen], labels[chosen], which=("probe",))
    np.testing.assert_array_equal(memory["probe"], stream["probe"])
    assert labels[chosen].sum() == 20  # the class shares of the train part
    rare = np.r_[np.zeros(999, int), 1]  # one example of class 1: still in the subsample
    assert np.sum(rare[streamed.stratified_subset(np.arange(1000), rare, 10, 0)]) == 1


def test_probe_cap_follows_the_width():
    assert streamed.probe_rows(384) == 10_000 and streamed.probe_rows(64) == 10_000
    assert streamed.probe_rows(768) == 5_000 and streamed.probe_rows(1024) == 3_750


def test_cell_moments_weights_are_repeats():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4)) + 10
    w = rng.integers(0, 3, 50)
    weighted = streamed.CellMoments(w[None, :])
    for start in range(0, 50, 7):
        weighted.add(start, x[start : start + 7])
    repeated = np.repeat(x, w, axis=0) - weighted.shift
    np.testing.assert_allclose(weighted.sums[0], repeated.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(weighted.grams[0], repeated.T @ repeated, rtol=1e-12)
    assert weighted.count[0] == w.sum()


def test_non_finite_states_are_refused():
    states, labels = bert_like(n=200)
    states[1, 5, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        streamed.streamed_layer_metrics(states, labels, which=("nu",))


def test_route_is_chosen_by_the_size_of_one_layer(monkeypatch):
    assert not streamed.use_streamed(20_000, 384)  # MiniLM, 20k: 59 MiB per float64 layer
    assert streamed.use_streamed(100_000, 1024)  # BERT-large, 100k: 781 MiB
    monkeypatch.setenv("TUNESCOPE_STREAM_METRICS_MB", "0")
    assert streamed.use_streamed(10, 4)


def test_layer_table_routes_large_states_and_says_so(monkeypatch, tmp_path):
    import torch

    from analysis.config import ExtractConfig
    from analysis.extract import LayerStates

    states, labels = bert_like(n=300, n_layers=2)
    layer_states = LayerStates(
        states=torch.from_numpy(states),
        labels=torch.from_numpy(labels),
        rows=torch.arange(300),
        label_names=("a", "b"),
        task_type="classification",
        metric="accuracy",
        config=ExtractConfig(),
        meta={"cache_path": str(tmp_path / "states" / "abc")},
    )
    cache = DiskCache(tmp_path)
    memory, _ = table.cached_layer_metrics(layer_states, cache=cache)
    monkeypatch.setenv("TUNESCOPE_STREAM_METRICS_MB", "0")
    assert table.metrics_recipe(layer_states, 0)["route"] == "streamed"
    stream, hit = table.cached_layer_metrics(layer_states, cache=cache)
    assert not hit  # another cache entry than the in-memory route's
    assert_same(memory, stream)
    report = table.report(ExtractConfig(), stream)
    assert report["route"] == "streamed" and report["probe_n"] == 300
    assert "route" not in table.report(ExtractConfig(), memory)


def test_repeats_refuse_states_that_stream_and_say_what_to_do(monkeypatch, tmp_path):
    import torch

    from analysis.config import ExtractConfig
    from analysis.extract import LayerStates
    from analysis.layers.repeats import cached_layer_repeats

    states, labels = bert_like(n=300, n_layers=2)
    layer_states = LayerStates(
        states=torch.from_numpy(states), labels=torch.from_numpy(labels), rows=torch.arange(300),
        label_names=("a", "b"), task_type="classification", metric="accuracy",
        config=ExtractConfig(), meta={"cache_path": str(tmp_path / "states" / "abc")},
    )  # fmt: skip
    monkeypatch.setenv("TUNESCOPE_STREAM_METRICS_MB", "0.01")  # 10,486 bytes: N ≤ 54 at d = 24
    cache = DiskCache(tmp_path)
    with pytest.raises(ValueError, match=r"Use R = 1 \(the single table\), or a sample of N ≤ 54"):
        cached_layer_repeats(layer_states, repeats=3, cache=cache)
    assert list(tmp_path.rglob("meta.json")) == []  # nothing computed, nothing cached


@pytest.mark.parametrize("stage_rows", [3, 1000])
def test_cell_moments_stage_flushes_and_reads_midway(stage_rows):
    """Stages smaller than a chunk flush several times per chunk; reading the Grams midway
    (which mirrors the triangle dsyrk fills) and adding more still gives Σ w h̃ h̃ᵀ."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 5)) * 3 + 7
    w = np.stack([rng.integers(0, 2, 40), rng.integers(0, 3, 40)])
    m = streamed.CellMoments(w, stage_rows=stage_rows)
    for start in range(0, 20, 7):
        m.add(start, x[start : min(start + 7, 20)])
    half = [np.repeat(x[:20], wk[:20], axis=0) - m.shift for wk in w]
    for k in range(2):
        np.testing.assert_allclose(m.grams[k], half[k].T @ half[k], rtol=1e-12)
    for start in range(20, 40, 6):
        m.add(start, x[start : min(start + 6, 40)])
    for k in range(2):
        full = np.repeat(x, w[k], axis=0) - m.shift
        np.testing.assert_allclose(m.grams[k], full.T @ full, rtol=1e-12)
        np.testing.assert_array_equal(m.grams[k], m.grams[k].T)
    assert m.rows_staged == int((w > 0).sum())


@pytest.fixture(scope="module")
def workers():
    from analysis import compute

    pool = compute.Workers(2)
    yield pool
    pool.shutdown()


def _kill_one(workers) -> None:
    """Kill one of the workers between two tables, and wait until the pool has seen it."""
    pid = workers.submit(os.getpid).result()
    os.kill(pid, signal.SIGKILL)
    time.sleep(1.0)  # (the pool notices)


def test_layers_in_worker_processes_give_the_same_table(workers):
    """Each layer a task, sent its layer's array alone: the same table as in this process, bit
    for bit; a worker killed between two tables is replaced."""
    states, labels = bert_like(n=300, n_layers=5)
    here = streamed.streamed_layer_metrics(states, labels, seed=3, chunk_rows=64)
    there = streamed.streamed_layer_metrics(states, labels, seed=3, chunk_rows=64, executor=workers)
    pd.testing.assert_frame_equal(there, here, check_exact=True)
    assert there["probe"].notna().all() and there.attrs["gram_gflop"] > 0
    _kill_one(workers)
    again = streamed.streamed_layer_metrics(states, labels, seed=3, chunk_rows=64, executor=workers)
    pd.testing.assert_frame_equal(again, here, check_exact=True)


def stored_states(tmp_path, states: np.ndarray):
    """``states`` written to a cache entry: the `StoredTensor` the streamed route reads (its path
    as the cache root gives it: relative for a relative root)."""
    specs = {"states": TensorSpec("F32", states.shape, row_dim=1)}

    def write(writer):
        for layer in range(states.shape[0]):
            writer.write("states", states[layer], 0, index=layer)
        return {}

    cache = DiskCache(tmp_path)
    cache.get_or_write("states", {"r": 2}, specs, write)
    return cache.stored("states", {"r": 2})["states"]


def test_stored_layers_read_by_worker_processes_give_the_same_table(workers, monkeypatch, tmp_path):
    """Stored states: each worker reads its layers from the file (its path made absolute: the
    workers started in another working folder than the cache's): the same table as one process,
    the phases' seconds summed over the layers; a worker killed between two tables loses
    nothing."""
    states, labels = bert_like(n=300, n_layers=5, n_classes=3, seed=7)
    workers.submit(os.getpid).result()  # workers started before the change of folder
    monkeypatch.chdir(tmp_path)
    stored = stored_states("cache", states)
    assert not stored.path.is_absolute()
    alone = streamed.streamed_layer_metrics(stored, labels, seed=3, chunk_rows=64)
    seen = []
    shared = streamed.streamed_layer_metrics(
        stored, labels, seed=3, chunk_rows=64, executor=workers,
        progress=lambda share, text: seen.append((share, text)),
    )  # fmt: skip
    pd.testing.assert_frame_equal(shared, alone, check_exact=True)
    assert set(shared.attrs["timing"]) == {"read_and_moments", "nu_cca_rank", "probe"}
    assert seen[-1][0] == 1.0 and any("of 6 layers" in text for _, text in seen)
    _kill_one(workers)
    again = streamed.streamed_layer_metrics(stored, labels, seed=3, chunk_rows=64, executor=workers)
    pd.testing.assert_frame_equal(again, alone, check_exact=True)
