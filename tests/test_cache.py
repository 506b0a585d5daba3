import json
import threading

import pytest
import torch

from analysis.cache import DiskCache, recipe_key


@pytest.fixture
def cache(tmp_path):
    return DiskCache(tmp_path / "c")


def test_round_trip(cache):
    recipe = {"a": 1, "b": [1, 2]}
    cache.save("states", recipe, {"x": torch.arange(6.0).reshape(2, 3)}, {"note": "hi"})
    tensors, meta = cache.load("states", recipe)
    assert torch.equal(tensors["x"], torch.arange(6.0).reshape(2, 3))
    assert meta == {"note": "hi"}


def test_key_is_order_independent_and_recipe_sensitive():
    assert recipe_key({"a": 1, "b": 2}) == recipe_key({"b": 2, "a": 1})
    assert recipe_key({"a": 1}) != recipe_key({"a": 2})


def test_missing_entry_is_a_miss(cache):
    assert cache.load("states", {"nothing": True}) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "meta"])
def test_corrupt_entry_is_detected_removed_and_recomputed(cache, damage):
    recipe = {"r": damage}
    folder = cache.save("states", recipe, {"x": torch.ones(100)})
    data = folder / "data.safetensors"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:50])
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[-1] ^= 0xFF
        data.write_bytes(bytes(raw))
    else:
        (folder / "meta.json").write_text("{not json")
    assert cache.load("states", recipe) is None
    assert not folder.exists()
    calls = []

    def compute():
        calls.append(1)
        return {"x": torch.zeros(3)}, {}

    tensors, _, hit = cache.get_or_compute("states", recipe, compute)
    assert not hit and calls == [1] and torch.equal(tensors["x"], torch.zeros(3))
    assert cache.get_or_compute("states", recipe, compute)[2] is True


def test_entry_of_another_recipe_is_not_used(cache):
    folder = cache.save("states", {"r": 1}, {"x": torch.ones(2)})
    meta = json.loads((folder / "meta.json").read_text())
    meta["recipe_key"] = "0" * 64
    (folder / "meta.json").write_text(json.dumps(meta))
    assert cache.load("states", {"r": 1}) is None


def test_failed_compute_leaves_nothing(cache):
    def compute():
        raise RuntimeError("cancelled half way")

    with pytest.raises(RuntimeError):
        cache.get_or_compute("states", {"r": "x"}, compute)
    assert list(cache.entries()) == []
    assert not any(cache.root.rglob("*.safetensors"))


def test_concurrent_requests_compute_once(cache):
    calls = []
    barrier = threading.Barrier(4)

    def compute():
        calls.append(1)
        return {"x": torch.ones(4)}, {}

    def worker():
        barrier.wait()
        cache.get_or_compute("states", {"same": 1}, compute)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]


def test_entries_lists_valid_ones(cache):
    cache.save("states", {"r": 1}, {"x": torch.ones(2)})
    (cache.root / "states" / ".tmp-dead").mkdir()
    listed = list(cache.entries())
    assert len(listed) == 1 and listed[0]["kind"] == "states" and listed[0]["recipe"] == {"r": 1}


def test_stale_temp_folders_are_cleared_only_when_old(cache):
    import os
    import time

    young = cache.root / "states" / ".tmp-young"
    old = cache.root / "states" / ".tmp-old"
    young.mkdir(parents=True)
    old.mkdir()
    past = time.time() - 7200
    os.utime(old, (past, past))
    assert cache.clear_stale_temp() == 1
    assert young.exists() and not old.exists()
