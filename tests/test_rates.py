"""Estimates before the work (`analysis.rates`): rates read back from what the disk cache's
entries stored of their computation, an extraction that says its time before it starts, and the
time left as the work goes."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from analysis.cache import DiskCache
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
from analysis.extract import extract_states
from analysis.models import load_model
from analysis.rates import (
    NEWEST,
    announce,
    duration,
    estimate,
    measured_rate,
    work_meta,
)


def _entry(cache: DiskCache, kind: str, i: int, work: float, seconds: float, device="cpu"):
    cache.save(kind, {"i": i}, {"x": torch.zeros(1)}, work_meta(kind, work, seconds, device))


def test_a_rate_is_the_median_over_the_newest_entries_of_its_kind(tmp_path):
    cache = DiskCache(tmp_path)
    assert measured_rate("layer_metrics", tmp_path) is None
    for i, per in enumerate([2.0, 3.0, 100.0]):  # seconds per unit
        _entry(cache, "layer_metrics", i, 10.0, 10.0 * per)
    _entry(cache, "layer_metrics", 9, 10.0, 1e6, device="cuda:0")  # another device: not read
    cache.save("layer_metrics", {"i": 99}, {"x": torch.zeros(1)}, {"seconds": 5.0})  # no work
    assert measured_rate("layer_metrics", tmp_path, "cpu") == (3.0, 3)
    planned = estimate("layer_metrics", 7.0, tmp_path, "cpu")
    assert planned.seconds == pytest.approx(21.0)
    assert (
        planned.text()
        == "about 21 s on this machine (from the rate of 3 earlier layer tables here)"
    )
    # Only the newest NEWEST entries count: a machine that got faster is believed.
    for i in range(NEWEST):
        _entry(cache, "layer_metrics", 100 + i, 1.0, 0.5)
    assert measured_rate("layer_metrics", tmp_path, "cpu") == (0.5, NEWEST)


def test_without_a_rate_of_its_own_a_kind_uses_its_stand_in_then_a_timed_piece(tmp_path):
    cache = DiskCache(tmp_path)
    assert estimate("heads", 10.0, tmp_path) is None
    timed = estimate("heads", 10.0, tmp_path, calibrate=lambda: (2.0, 4.0))
    assert timed.seconds == pytest.approx(5.0) and "timed just now" in timed.source
    _entry(cache, "states", 0, 4.0, 8.0)
    assert estimate("heads", 10.0, tmp_path).seconds == pytest.approx(20.0)
    assert "1 earlier extraction here" in estimate("heads", 10.0, tmp_path).source
    with pytest.raises(ValueError, match="No unit of work"):
        work_meta("pictures", 1.0, 1.0, "cpu")


@pytest.mark.parametrize(
    "seconds, words", [(0.2, "1 s"), (40, "40 s"), (600, "10 min"), (9000, "2.5 h")]
)
def test_durations_in_words(seconds, words):
    assert duration(seconds) == words


def test_the_time_left_comes_from_the_estimate_then_from_the_share_done(monkeypatch):
    import analysis.rates as rates

    clock = iter([0.0, 20.0, 30.0])
    monkeypatch.setattr(rates.time, "perf_counter", lambda: next(clock))
    seen = []
    told = announce(lambda f, m: seen.append((f, m)), rates.Estimate(100.0, "a test"), "work")
    told(0.01, "started")  # too little done to extrapolate: the estimate less the time spent
    told(0.5, "half")  # half done in 30 s: 30 s left
    assert seen == [
        (0.0, "work: about 2 min on this machine (a test)"),
        (0.01, "started · about 80 s left"),
        (0.5, "half · about 30 s left"),
    ]


def test_an_extraction_says_its_time_before_it_starts_and_stores_its_rate(tmp_path, tiny_bert_dir):
    path = tmp_path / "data.csv"
    pd.DataFrame({"text": [f"review number {i} is fine" for i in range(24)],
                  "label": [i % 2 for i in range(24)]}).to_csv(path, index=False)  # fmt: skip
    loaded = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
    cache = DiskCache(tmp_path / "cache")

    def cfg(seed):
        return ExtractConfig(ModelSpec(str(tiny_bert_dir)), DataSpec(str(path)),
                             SampleSpec(n=20, seed=seed), max_length=32, batch_size=4)  # fmt: skip

    seen = []
    extract_states(cfg(0), progress=lambda f, m: seen.append(m), cache=cache, loaded=loaded)
    assert "timed just now on a small part of the states" in seen[0], seen[0]
    entry = next(e for e in cache.entries() if e["kind"] == "states")
    meta = json.loads((Path(entry["path"]) / "meta.json").read_text())["meta"]
    assert meta["work"] > 0 and meta["seconds"] > 0 and meta["work_unit"] == "tokens × M parameters"
    seen.clear()  # the next extraction here is estimated from the first one's rate
    extract_states(cfg(1), progress=lambda f, m: seen.append(m), cache=cache, loaded=loaded)
    assert "from the rate of 1 earlier extraction here" in seen[0], seen[0]
