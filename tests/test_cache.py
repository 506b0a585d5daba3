import json
import threading

import numpy as np
import pytest
import torch

from analysis.cache import DiskCache, TensorSpec, entry_key


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
    assert entry_key({"a": 1, "b": 2}) == entry_key({"b": 2, "a": 1})
    assert entry_key({"a": 1}) != entry_key({"a": 2})


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


def test_entry_of_other_inputs_is_not_used(cache):
    folder = cache.save("states", {"r": 1}, {"x": torch.ones(2)})
    meta = json.loads((folder / "meta.json").read_text())
    meta["key"] = "0" * 64
    (folder / "meta.json").write_text(json.dumps(meta))
    assert cache.load("states", {"r": 1}) is None


def test_an_entry_written_under_the_old_names_is_read_and_listed(cache):
    """meta.json said ``recipe`` / ``recipe_key`` before it said ``inputs`` / ``key``: such an
    entry keeps its folder (its key) and is read and listed as any other."""
    folder = cache.save("states", {"r": 1}, {"x": torch.ones(2)}, {"n": 2})
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["inputs"] == {"r": 1} and meta["key"] == folder.name
    assert "recipe" not in meta and "recipe_key" not in meta
    old = {("recipe" if k == "inputs" else "recipe_key" if k == "key" else k): v
           for k, v in meta.items()}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(old))
    tensors, extra = cache.load("states", {"r": 1})
    assert torch.equal(tensors["x"], torch.ones(2)) and extra == {"n": 2}
    assert [e["inputs"] for e in cache.entries()] == [{"r": 1}]
    old["recipe_key"] = "0" * 64  # the old name is the key that is checked
    (folder / "meta.json").write_text(json.dumps(old))
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
    assert len(listed) == 1 and listed[0]["kind"] == "states" and listed[0]["inputs"] == {"r": 1}


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


# --- streamed entries ----------------------------------------------------------------------------


def _stream(cache, recipe, values, rows_per_write=3):
    """Write (A, R, D) float32 ``values`` as a streamed entry, ``rows_per_write`` rows at a time."""
    specs = {
        "x": TensorSpec("F32", values.shape, row_dim=1),
        "ids": TensorSpec("I64", (values.shape[1],)),
    }

    def write(writer):
        for a in range(values.shape[0]):
            for start in range(0, values.shape[1], rows_per_write):
                writer.write("x", values[a, start : start + rows_per_write], start, index=a)
        writer.write("ids", torch.arange(values.shape[1]))
        return {"note": "streamed"}

    return cache.get_or_write("states", recipe, specs, write)


def test_streamed_entry_round_trip_is_memory_mapped_and_copy_on_write(cache):
    values = torch.randn(3, 10, 4)
    tensors, meta, hit = _stream(cache, {"s": 1}, values)
    assert not hit and meta == {"note": "streamed"}
    assert torch.equal(tensors["x"], values) and torch.equal(tensors["ids"], torch.arange(10))
    folder = cache.entry_dir("states", {"s": 1})
    record = json.loads((folder / "meta.json").read_text())
    assert len(record["content"]["segments"]) == 1 + 3 + 1  # header, one per slice, ids
    # A safetensors file like any other.
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(folder / "data.safetensors"))["x"], values)
    again, _, hit = _stream(cache, {"s": 1}, values)
    assert hit
    again["x"][0, 0, 0] = 1e6  # private mapping: the file is not changed
    assert float(cache.load("states", {"s": 1})[0]["x"][0, 0, 0]) == float(values[0, 0, 0])
    stored = cache.stored("states", {"s": 1})["x"]
    np.testing.assert_array_equal(stored.read_rows(2, 4, 9), values[2, 4:9].numpy())


def test_streamed_writes_must_be_in_order_and_complete(cache):
    specs = {"x": TensorSpec("F32", (2, 6, 3), row_dim=1)}

    def out_of_order(writer):
        writer.write("x", np.zeros((2, 3), np.float32), 2, index=0)
        return {}

    with pytest.raises(ValueError, match="in order"):
        cache.get_or_write("states", {"bad": 1}, specs, out_of_order)

    def incomplete(writer):
        writer.write("x", np.zeros((6, 3), np.float32), 0, index=0)
        return {}

    with pytest.raises(ValueError, match="incomplete"):
        cache.get_or_write("states", {"bad": 2}, specs, incomplete)
    assert list(cache.entries()) == [] and not any(cache.root.rglob("*.safetensors"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "extend"])
def test_damaged_streamed_entry_is_detected_removed_and_rewritten(cache, damage):
    from analysis.cache import forget_verified

    values = torch.randn(3, 50, 8)
    _stream(cache, {"d": damage}, values)
    data = cache.entry_dir("states", {"d": damage}) / "data.safetensors"
    raw = bytearray(data.read_bytes())
    if damage == "truncate":
        data.write_bytes(bytes(raw[: len(raw) // 2]))
    elif damage == "flip":  # same size: only the content hash can tell
        raw[len(raw) // 2] ^= 0x01
        data.write_bytes(bytes(raw))
        forget_verified()  # as in a new process (this one checked the file when it wrote it)
    else:
        data.write_bytes(bytes(raw) + b"\0" * 64)
    assert cache.load("states", {"d": damage}) is None
    assert not data.parent.exists()
    tensors, _, hit = _stream(cache, {"d": damage}, values)
    assert not hit and torch.equal(tensors["x"], values)


def test_content_is_hashed_once_per_process_and_file_version(cache, monkeypatch):
    import analysis.cache as cache_module

    values = torch.randn(2, 20, 4)
    _stream(cache, {"h": 1}, values)  # hashed while written: nothing to read back
    calls = []
    real = cache_module.verify_content
    monkeypatch.setattr(cache_module, "verify_content", lambda *a: calls.append(1) or real(*a))
    cache.load("states", {"h": 1})
    assert calls == []
    cache_module.forget_verified()
    cache.load("states", {"h": 1})
    cache.load("states", {"h": 1})
    assert calls == [1]


def test_a_large_files_hash_threads_are_the_usable_cores_at_most_four(tmp_path, monkeypatch):
    """The content check of a large entry hashes its segments on `usable_cores` threads (the
    compute seam's count, which respects affinity and the cgroup's quota), at most four."""
    import analysis.cache as cache_module

    big = [[0, 40 << 20, "h"], [40 << 20, 40 << 20, "h"]]  # > 64 MB in all: threads
    sizes = []

    class Pool:
        def __init__(self, threads):
            sizes.append(threads)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, items):
            return [fn(item) for item in items]

    monkeypatch.setattr(cache_module, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(cache_module, "_range_sha256", lambda path, offset, length: "h")
    for cores, expected in ((1, []), (3, [3]), (16, [4])):
        monkeypatch.setattr(cache_module, "usable_cores", lambda cores=cores: cores)
        cache_module.verify_content(tmp_path / "data", big)
        assert sizes == expected
        sizes.clear()
    cache_module.verify_content(tmp_path / "data", [[0, 1 << 20, "h"], [1 << 20, 1 << 20, "h"]])
    assert sizes == []  # small: hashed here


def test_not_enough_disk_space_is_a_clear_error_before_any_work(cache, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 5))
    called = []
    with pytest.raises(OSError, match=r"needs .* GB for this entry"):
        cache.get_or_write(
            "states", {"big": 1}, {"x": TensorSpec("F32", (1000,))}, lambda w: called.append(1)
        )
    assert called == []


def test_stale_temp_folder_of_a_live_writer_is_kept(cache):
    import os
    import time

    busy = cache.root / "states" / ".tmp-busy"
    busy.mkdir(parents=True)
    (busy / "data.safetensors").write_bytes(b"x")  # still being written
    past = time.time() - 7200
    os.utime(busy, (past, past))
    assert cache.clear_stale_temp() == 0 and busy.exists()


# --- mapping, and what may delete an entry -------------------------------------------------------


def _refuse_private_writable_maps(monkeypatch):
    """mmap as under strict overcommit: a private writable mapping is refused with ENOMEM."""
    import errno
    import mmap

    real = mmap.mmap

    def fake(fileno, length, *args, **kwargs):
        writable = kwargs.get("prot", mmap.PROT_WRITE) & mmap.PROT_WRITE
        if kwargs.get("access", mmap.ACCESS_DEFAULT) == mmap.ACCESS_READ:
            writable = False
        if writable:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(fileno, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", fake)


def test_an_entry_larger_than_memory_and_swap_is_mapped(tmp_path):
    """A private writable map of a file larger than RAM + swap is charged in full against the
    commit limit (ENOMEM) unless it is MAP_NORESERVE; map_file must map it either way."""
    from pathlib import Path

    from analysis.cache import map_file

    lines = Path("/proc/meminfo").read_text().splitlines()
    meminfo = dict(line.split(":", 1) for line in lines if ":" in line)
    total = sum(int(meminfo[k].split()[0]) << 10 for k in ("MemTotal", "SwapTotal"))
    path = tmp_path / "sparse.bin"
    size = total + (1 << 30)
    with open(path, "wb") as fh:
        try:
            fh.truncate(size)  # sparse: no disk space used
        except OSError as exc:
            pytest.skip(f"no sparse file of {size} bytes here: {exc}")
    with open(path, "rb") as fh:
        mapping, writable = map_file(fh.fileno(), size)
    assert len(mapping) == size and mapping[size - 4 :] == b"\0" * 4
    if writable:
        mapping[:4] = b"abcd"  # a private page: the file is not changed
        with open(path, "rb") as fh:
            assert fh.read(4) == b"\0" * 4
    mapping.close()


def test_entry_refused_a_private_mapping_is_served_read_only_and_kept(cache, monkeypatch):
    from analysis.layers.table import layer_metrics

    values = torch.randn(3, 40, 4)
    _stream(cache, {"m": 1}, values)
    folder = cache.entry_dir("states", {"m": 1})
    _refuse_private_writable_maps(monkeypatch)
    tensors, meta = cache.load("states", {"m": 1})
    assert folder.is_dir() and meta == {"note": "streamed"}
    assert not tensors.writable and torch.equal(tensors["x"], values)
    # Nothing in the layer metrics writes into the states (a write would fault here).
    labels = np.arange(40) % 2
    frame = layer_metrics(tensors["x"], labels, "accuracy", seed=0, which=("nu", "cca", "rank"))
    assert len(frame) == 3 and torch.equal(tensors["x"], values)
    # A fresh write is served the same way: no "could not be read back", nothing deleted.
    fresh, _, hit = _stream(cache, {"m": 2}, values)
    assert not hit and not fresh.writable and torch.equal(fresh["x"], values)
    assert cache.entry_dir("states", {"m": 2}).is_dir()


def test_an_error_of_the_system_keeps_the_entry(cache, monkeypatch):
    import errno
    import mmap

    values = torch.randn(2, 10, 4)
    _stream(cache, {"t": 1}, values)
    folder = cache.entry_dir("states", {"t": 1})

    def too_many_files(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    with monkeypatch.context() as patch:
        patch.setattr(mmap, "mmap", too_many_files)
        with pytest.raises(OSError, match=r"Too many open files.*kept") as raised:
            cache.load("states", {"t": 1})
    assert type(raised.value).__name__ == "CacheError" and folder.is_dir()
    assert isinstance(raised.value, ValueError)  # what the CLI and the pages show as one line
    tensors, _ = cache.load("states", {"t": 1})  # once the cause is gone
    assert torch.equal(tensors["x"], values) and tensors.writable


# --- last use, eviction, the size cap -------------------------------------------------------------


def age(folder, seconds_ago: float) -> None:
    import os
    import time

    then = time.time() - seconds_ago
    os.utime(folder, (then, then))


def test_a_load_marks_the_entry_used(cache):
    folder = cache.save("states", {"r": 1}, {"x": torch.ones(3)})
    age(folder, 3600)
    before = next(cache.entries())["last_used"]
    assert cache.load("states", {"r": 1}) is not None
    assert next(cache.entries())["last_used"] > before + 3000


def test_an_entry_in_use_is_never_removed(cache):
    import gc

    folder = cache.save("states", {"r": 1}, {"x": torch.arange(1000.0)})
    tensors, _ = cache.load("states", {"r": 1})
    x = tensors["x"][10:20]  # a view keeps the mapping (and its lock) alive
    del tensors
    gc.collect()
    assert cache.remove_entry(folder) is False and folder.is_dir()
    assert x.sum().item() == sum(range(10, 20))
    del x
    gc.collect()
    assert cache.remove_entry(folder) is True and not folder.exists()
    assert cache.remove_entry(folder) is False  # gone already


HOLDER = """
import sys, time
from analysis.cache import DiskCache
tensors, _ = DiskCache(sys.argv[1]).load("states", {"r": 1})
print("holding", flush=True)
time.sleep(60)
"""


def test_an_entry_another_process_reads_is_skipped(cache):
    import subprocess
    import sys

    folder = cache.save("states", {"r": 1}, {"x": torch.ones(100)})
    reader = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(cache.root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout.readline().strip() == "holding"
        assert cache.remove_entry(folder) is False and folder.is_dir()
    finally:
        reader.kill()
        reader.wait()
    assert cache.remove_entry(folder) is True


def test_a_load_meeting_a_removal_waits_and_is_a_miss(cache):
    import fcntl
    import os
    import time

    from analysis.io import remove_folder

    folder = cache.save("states", {"r": 1}, {"x": torch.ones(100)})
    fd = os.open(folder / "data.safetensors", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what `remove_entry` holds while it deletes
    assert cache.in_use(folder)  # (another descriptor's lock: this process counts too)
    found = []
    reader = threading.Thread(target=lambda: found.append(cache.load("states", {"r": 1})))
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive()  # waits for the removal to end
    remove_folder(folder)
    cache.save("states", {"r": 1}, {"x": torch.zeros(100)})  # a new entry in its place
    os.close(fd)
    reader.join(10)
    assert found == [None]  # a miss, not the half-removed entry, and not a crash
    assert torch.equal(cache.load("states", {"r": 1})[0]["x"], torch.zeros(100))  # kept


def test_the_size_cap_evicts_the_oldest_unused_states_first(cache, monkeypatch):
    import gc

    mb = torch.zeros(250_000)  # 1 MB of float32
    states = [cache.save("states", {"s": i}, {"x": mb}) for i in range(3)]
    table = cache.save("layer_metrics", {"t": 0}, {"x": torch.zeros(10)})
    for folder, seconds in zip([*states, table], (100, 300, 200, 1000), strict=True):
        age(folder, seconds)
    held, _ = cache.load("states", {"s": 1})  # the oldest: in use, so skipped
    age(states[1], 300)
    monkeypatch.setenv("TUNESCOPE_CACHE_MAX_GB", "0.0025")  # room for two states
    tensors, _, hit = cache.get_or_compute("states", {"s": 3}, lambda: ({"x": mb}, {}))
    assert not hit
    kept = {(e["kind"], e["inputs"].get("s", e["inputs"].get("t"))) for e in cache.entries()}
    # states 1 in use, states 3 just written; of 0 and 2, the older (2) went first, then 0;
    # the small table, older than all, stays while states can go
    assert kept == {("states", 1), ("states", 3), ("layer_metrics", 0)}
    del held, tensors
    gc.collect()
    assert cache.enforce_cap(max_bytes=0) and list(cache.entries()) == []
    monkeypatch.setenv("TUNESCOPE_CACHE_MAX_GB", "lots")
    with pytest.raises(ValueError, match="TUNESCOPE_CACHE_MAX_GB must be a number"):
        cache.enforce_cap()
