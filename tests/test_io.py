"""The atomic writer: files and folders get the modes an ordinary open / mkdir would give."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from analysis.cache import DiskCache, TensorSpec
from analysis.io import atomic_folder, atomic_save_tensors, atomic_write_json, atomic_write_text


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_written_files_respect_the_umask(tmp_path, umask):
    text = atomic_write_text(tmp_path / "a.txt", "hello")
    data = atomic_write_json(tmp_path / "out" / "b.json", {"x": 1})
    atomic_save_tensors(tmp_path / "c.safetensors", {"x": torch.ones(3)})
    expected = 0o666 & ~umask
    assert mode(text) == mode(data) == mode(tmp_path / "c.safetensors") == expected
    with atomic_folder(tmp_path / "folder") as tmp:
        (tmp / "inside.txt").write_text("x")
    assert mode(tmp_path / "folder") == 0o777 & ~umask
    assert mode(tmp_path / "folder" / "inside.txt") == expected


def test_cache_entries_respect_the_umask(tmp_path, umask):
    cache = DiskCache(tmp_path / "c")
    saved = cache.save("heads", {"r": 1}, {"x": torch.ones(2)})
    specs = {"x": TensorSpec("F32", (4,))}
    cache.get_or_write("states", {"r": 2}, specs, lambda w: w.write("x", torch.ones(4)) or {})
    streamed = cache.entry_dir("states", {"r": 2})
    for folder in (saved, streamed):
        assert mode(folder) == 0o777 & ~umask
        assert {mode(f) for f in folder.iterdir()} == {0o666 & ~umask}
