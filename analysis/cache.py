"""The disk cache: one home for every computed artefact.

An entry is a folder ``<root>/<kind>/<key>/`` holding ``data.safetensors`` (tensors) and
``meta.json`` (the inputs that produced it — model, data, sample, settings: the key's payload —,
the code version, and the SHA-256 of the tensor file's content). The key is the SHA-256 of the
canonical JSON of the inputs, so two requests with the same inputs share one entry. (meta.json
records them as ``inputs`` and the entry's ``key``; `read_meta` reads an entry written when they
were named ``recipe`` / ``recipe_key``. The hashed payload keeps that first name, so that every
entry keeps its key.)

**Writes are atomic.** Everything goes into a temporary sibling folder that is renamed into place
only when complete (`analysis.io.atomic_folder`), so a crash, a kill or a cancel mid-write never
leaves an entry that reads as valid: only a ``.tmp-*`` folder, which no reader takes for an entry
and `CacheFolder.clear_stale_temp` removes later.

**Large entries are streamed.** `DiskCache.get_or_write` hands the computation an `EntryWriter`
that writes a safetensors file region by region as results are produced (a layer's rows of one
window of examples at a time), so nothing has to hold the whole entry in memory. The safetensors
library has no streaming writer (``save_file`` takes every tensor in memory), so `EntryWriter`
writes the documented format itself: an 8-byte header length, the JSON header (padded so that the
data starts on a 64-byte boundary), the raw little-endian data.

**Reads are memory-mapped.** `DiskCache.load` maps the file (private, copy-on-write) and returns
tensors that are views of the mapping: ``states[layer]`` of a 10 GB entry touches that layer's
pages only, and a consumer that writes into a tensor changes its own copy, never the file.
A private writable mapping is charged in full against the kernel's commit limit, so an entry
larger than RAM + swap could not be mapped at all: `map_file` asks for ``MAP_NORESERVE`` (Linux),
and where the kernel still refuses (strict overcommit, ``vm.overcommit_memory = 2``, ignores that
flag) it maps the file read-only instead. Tensors of a read-only mapping must not be written
(torch cannot mark a tensor read-only; a write would fault): nothing in tunescope writes into the
tensors of a cache entry, and a consumer that wants to must copy first (`MappedEntry.writable`).
`StoredTensor` reads rows with plain file reads instead, for passes over a whole entry that must
not grow the resident set (touched pages of a mapping count as resident; the page cache does not).
The safetensors library's torch loader copies every tensor into memory, hence our own mapping.

**Reads are content-checked, at a cost that does not grow with use.** Every load checks the
structure (meta.json parses, its key matches, the file size equals the recorded size, the
header's tensors tile the data exactly). The SHA-256 content hash is verified once per process per
file version (path, device, inode, size, mtime): the first load of an entry in a process reads it
all (≈ 1 GB/s per core with SHA-NI; large files are hashed by several threads, one segment each),
later loads of the same unchanged file trust that check. A file changed on disk by a write gets a
new mtime (and a rewrite by rename a new inode), so it is hashed again. Why not hash on every load,
as before: for a 10 GB entry that is 5-10 s per page view. Why not only a structural check: a
flipped byte would go unnoticed forever. What is left unchecked: a file that rots in place, without
any write, after its first check in a long-lived process; the next process sees it.

Hashes are computed while writing, never by reading the file back: a streamed file is hashed per
*segment* (the header, then each tensor's slice along its leading dimensions — one layer of the
states — whose bytes are written in order), and meta.json records every segment's offset, length
and SHA-256. An entry written by `save` (small, in memory) has one segment: the whole file.
A truncated, corrupt, partial or foreign entry is deleted and treated as a miss (the caller
recomputes). Only the entry's content or format condemns it: an error of the system (too many open
files, no memory for the mapping, a read error) is a `CacheError` and the entry stays. No pickle
anywhere.

**Entries can be evicted, never mid-read.** Loading an entry marks it used (its folder's
modification time: "last used") and takes a shared ``flock`` on its data file, held by the
memory map itself (the map keeps a duplicate of the file descriptor, and a ``flock`` lives as
long as any duplicate): as long as any tensor of the entry is alive in any process, the entry is
in use. `CacheFolder.remove_entry` deletes an entry only under an exclusive lock that it gets
without waiting — an entry in use is skipped — and never while this process computes or loads
it; a load that meets a removal under way waits for it and is a miss. With
``TUNESCOPE_CACHE_MAX_GB`` set, every new entry is followed by `CacheFolder.enforce_cap`: the
oldest unused states go first (large, and one forward pass remakes them), then the small tables
derived from states, until the entries fit. Run files and uploads are not entries: the
cap never touches them (``tunescope cache prune`` does, when asked; `analysis.cache_admin`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import mmap
import os
import shutil
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.compute import usable_cores
from analysis.io import TMP_PREFIX, atomic_folder, remove_folder

if TYPE_CHECKING:
    import torch

# Bump when a change to the code changes what an entry means; it is part of every key.
CODE_VERSION = "1"
DATA_FILE = "data.safetensors"
META_FILE = "meta.json"
OLD_META_NAMES = {"recipe": "inputs", "recipe_key": "key"}  # meta.json's names before
DATA_ALIGN = 64  # the data region starts on this boundary, so every tensor is aligned
MAX_ENV = "TUNESCOPE_CACHE_MAX_GB"  # the size cap of the entries (`enforce_cap`); unset: none
STATES_KIND = "states"  # evicted first
HASH_BLOCK = 8 << 20  # bytes read per hash update

# Linux charges a private writable mapping against the commit limit unless it is MAP_NORESERVE;
# Python's mmap module names that flag only from 3.13. Elsewhere there is no such charge.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_verified: set[tuple[Any, ...]] = set()  # file versions whose content hash matched, this process

# safetensors dtype codes → (numpy dtype or None, element size). bfloat16 has no numpy dtype.
DTYPES: dict[str, tuple[str | None, int]] = {
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": (None, 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("i1", 1),
    "U8": ("u1", 1), "BOOL": ("?", 1),
}  # fmt: skip


def default_root() -> Path:
    """The current workspace's root (`analysis.workspace.Workspace.current`: the one an entry
    point made current, else ``$TUNESCOPE_CACHE``, else ``cache/`` at the project's root)."""
    from analysis.workspace import Workspace

    return Workspace.current().root


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def entry_key(inputs: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of an entry's ``inputs`` plus the code version."""
    payload = canonical_json({"recipe": inputs, "code_version": CODE_VERSION})  # never renamed
    return hashlib.sha256(payload.encode()).hexdigest()


def read_meta(folder: Path) -> dict[str, Any]:
    """An entry's meta.json under today's names (`OLD_META_NAMES`)."""
    record = json.loads((Path(folder) / META_FILE).read_text())
    return {OLD_META_NAMES.get(name, name): value for name, value in record.items()}


def file_sha256(path: Path, chunk: int = HASH_BLOCK) -> str:
    return _range_sha256(path, 0, Path(path).stat().st_size, chunk)


def _range_sha256(path: Path, offset: int, length: int, chunk: int = HASH_BLOCK) -> str:
    """SHA-256 of bytes offset:offset+length of a file (plain reads: the page cache, not RSS)."""
    digest = hashlib.sha256()
    buffer = bytearray(min(chunk, max(length, 1)))
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        fh.seek(offset)
        left = length
        while left > 0:
            got = fh.readinto(view[: min(left, len(buffer))])
            if not got:
                raise CacheMiss(f"{path} ends before byte {offset + length}")
            digest.update(view[:got])  # hashlib releases the GIL on large updates
            left -= got
    return digest.hexdigest()


class CacheMiss(LookupError):
    pass


class CacheError(OSError, ValueError):
    """The cache cannot serve or store an entry for a reason that is not the entry's content
    (no space left, too many open files, no memory for the mapping, a failed read): one sentence
    for the user; an existing entry is kept.

    Also a ValueError (as `io.UnsupportedOperation` is both), so that every place that shows a
    ValueError as one clear line (the CLI's ``error: …``, each page's message) shows this too.
    """


# --- the file format -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a streamed entry: safetensors dtype code, shape, and the row dimension.

    Rows are written in order within each slice ``tensor[i_0, …, i_{row_dim−1}]`` (a *segment*,
    hashed as it is written): the states (L+1, N, d) with ``row_dim=1`` have one segment per layer.
    """

    dtype: str
    shape: tuple[int, ...]
    row_dim: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"Unknown tensor dtype {self.dtype!r}: choose from {sorted(DTYPES)}.")
        if any(int(s) < 0 for s in self.shape) or not 0 <= self.row_dim < max(len(self.shape), 1):
            raise ValueError(f"Bad tensor shape {self.shape} or row dimension {self.row_dim}.")

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def n_segments(self) -> int:
        return math.prod(self.shape[: self.row_dim])

    @property
    def rows(self) -> int:
        return self.shape[self.row_dim] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[self.row_dim + 1 :]) * self.itemsize


def dtype_code(dtype: Any) -> str:
    """The safetensors code of a torch or numpy dtype (``torch.float32`` / ``np.float32`` → F32)."""
    name = str(dtype).removeprefix("torch.")
    codes = {
        "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
        "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    }  # fmt: skip
    if name not in codes:
        raise ValueError(f"Cannot store tensors of dtype {dtype}.")
    return codes[name]


def _layout(specs: Mapping[str, TensorSpec]) -> tuple[bytes, dict[str, int]]:
    """(header bytes incl. the length prefix and padding, byte offset of each tensor in the file).

    Tensors are laid out largest element first (then by name), so each is aligned to its element
    size once the data region starts on a `DATA_ALIGN` boundary.
    """
    order = sorted(specs, key=lambda k: (-specs[k].itemsize, k))
    header: dict[str, Any] = {}
    position = 0
    for name in order:
        spec = specs[name]
        header[name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [position, position + spec.nbytes],
        }
        position += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    padded = -(-(8 + len(text)) // DATA_ALIGN) * DATA_ALIGN - 8  # spaces are allowed padding
    blob = struct.pack("<Q", padded) + text + b" " * (padded - len(text))
    start = len(blob)
    return blob, {name: start + header[name]["data_offsets"][0] for name in order}


@dataclass(frozen=True)
class Header:
    """A safetensors file's table of contents: data start and each tensor's place."""

    data_start: int
    tensors: dict[str, tuple[str, tuple[int, ...], int, int]]  # name → (dtype, shape, begin, end)

    @property
    def data_bytes(self) -> int:
        return max((end for *_, end in self.tensors.values()), default=0)


def read_header(path: Path) -> Header:
    """Parse and check a safetensors header: the tensors must tile the data region exactly."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise CacheMiss("file shorter than its header length")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 << 20:
            raise CacheMiss("header length is implausible")
        text = fh.read(length)
    if len(text) != length:
        raise CacheMiss("file shorter than its header")
    table = json.loads(text)
    if not isinstance(table, dict):
        raise CacheMiss("the header is not a table of tensors")
    tensors: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if dtype not in DTYPES or end - begin != math.prod(shape) * DTYPES[dtype][1]:
            raise CacheMiss(f"tensor {name!r} has inconsistent dtype, shape and offsets")
        tensors[name] = (dtype, shape, begin, end)
    spans = sorted((begin, end) for *_, begin, end in tensors.values())
    position = 0
    for begin, end in spans:
        if begin != position:
            raise CacheMiss("tensors leave a hole or overlap")
        position = end
    return Header(8 + length, tensors)


def map_file(fileno: int, size: int) -> tuple[mmap.mmap, bool]:
    """Map the first ``size`` bytes of an open file: (mapping, writable).

    Private and writable (copy-on-write, never charged against the commit limit thanks to
    ``MAP_NORESERVE``) where the kernel allows it; read-only when it refuses with ENOMEM (strict
    overcommit): a read-only shared mapping of a file is never charged.
    """
    try:
        if hasattr(mmap, "MAP_PRIVATE"):  # Unix
            flags, prot = mmap.MAP_PRIVATE | MAP_NORESERVE, mmap.PROT_READ | mmap.PROT_WRITE
            return mmap.mmap(fileno, size, flags=flags, prot=prot), True
        return mmap.mmap(fileno, size, access=mmap.ACCESS_COPY), True
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
    return mmap.mmap(fileno, size, access=mmap.ACCESS_READ), False


class MappedEntry(dict):
    """The tensors of one cache entry by name (a dict), with ``writable``: False when the file is
    mapped read-only (`map_file`), in which case a consumer must copy a tensor before writing."""

    writable: bool = True


def map_tensors(path: Path, header: Header | None = None) -> MappedEntry:
    """Every tensor of a safetensors file as a view of one memory map (`map_file`: private,
    copy-on-write; read-only where the kernel refuses that, see ``writable``).

    The mapping lives as long as any of its tensors; only the pages a consumer touches are read.
    """
    import torch

    header = header or read_header(path)
    size = header.data_start + header.data_bytes
    out = MappedEntry()
    mapping = None
    if size > header.data_start:
        with open(path, "rb") as fh:
            _share(fh.fileno(), path)
            mapping, out.writable = map_file(fh.fileno(), size)  # keeps the lock (module doc)
    for name, (dtype, shape, begin, end) in header.tensors.items():
        torch_dtype = _torch_dtype(dtype)
        count = math.prod(shape)
        offset = header.data_start + begin
        if count == 0 or mapping is None:
            out[name] = torch.empty(shape, dtype=torch_dtype)
        elif offset % DTYPES[dtype][1]:  # a misaligned tensor from a foreign writer: copy it
            out[name] = (
                torch.frombuffer(bytearray(mapping[offset : header.data_start + end]), dtype=torch_dtype)
                .reshape(shape)
            )  # fmt: skip
        else:
            with warnings.catch_warnings():  # read-only: torch warns that it cannot enforce it
                warnings.filterwarnings("ignore", "The given buffer is not writable")
                out[name] = torch.frombuffer(
                    mapping, dtype=torch_dtype, offset=offset, count=count
                ).reshape(shape)
    return out


class EntryGone(Exception):
    """The entry was removed while it was being opened: a miss, and nothing to clean up."""


def _share(fd: int, path: Path) -> None:
    """Take the shared lock that marks a file in use (module docstring, "evicted"). It waits out
    a removal under way (`DiskCache.remove_entry` holds its lock only while it deletes);
    `EntryGone` when the file was removed (or replaced) since it was opened."""
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        raise EntryGone(path)


def _torch_dtype(code: str) -> torch.dtype:
    import torch

    return {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
        "U8": torch.uint8, "BOOL": torch.bool,
    }[code]  # fmt: skip


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor of a cache entry lies on disk; reads slices with plain file reads.

    A pass over a whole 10 GB entry through its memory map would leave every touched page
    resident; reading into a reused buffer keeps the resident set at one buffer.
    """

    path: Path
    offset: int  # byte offset of element 0 in the file
    dtype: str  # safetensors code
    shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        code = DTYPES[self.dtype][0]
        if code is None:
            raise ValueError(f"{self.dtype} tensors cannot be read as numpy arrays.")
        return np.dtype(code)

    def read_rows(
        self, index: int, start: int, stop: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``tensor[index, start:stop]`` of a tensor of shape (A, R, *rest): (stop − start, *rest)."""
        rest = self.shape[2:]
        row_bytes = math.prod(rest) * DTYPES[self.dtype][1]
        if not (0 <= index < self.shape[0] and 0 <= start <= stop <= self.shape[1]):
            raise IndexError(f"rows {start}:{stop} of slice {index} outside {self.shape}")
        shape = (stop - start, *rest)
        if out is None:
            out = np.empty(shape, dtype=self.numpy_dtype)
        elif out.shape != shape or out.dtype != self.numpy_dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"out must be a C-contiguous {self.numpy_dtype} array of shape {shape}"
            )
        position = self.offset + (index * self.shape[1] + start) * row_bytes
        view = memoryview(out.reshape(-1).view(np.uint8))
        with open(self.path, "rb", buffering=0) as fh:
            fh.seek(position)
            done = 0
            while done < len(view):
                got = fh.readinto(view[done:])
                if not got:
                    raise OSError(f"{self.path} ended early")
                done += got
        return out


def stored_tensors(path: Path, header: Header | None = None) -> dict[str, StoredTensor]:
    header = header or read_header(path)
    return {
        name: StoredTensor(Path(path), header.data_start + begin, dtype, shape)
        for name, (dtype, shape, begin, _) in header.tensors.items()
    }


class EntryWriter:
    """Writes a safetensors file region by region and hashes each segment as it is written.

    ``write(name, values, start, index)`` puts ``values`` (rows, *rest) at rows start:start+rows of
    ``tensor[index]`` (``index``: the positions along the dimensions before the row dimension).
    Within a segment, rows must arrive in order; `close` refuses an incomplete file. The file is
    created at its full size at once (sparse), so a kill mid-write leaves a file that is plainly
    not an entry (it is in a temporary folder and its meta.json does not exist).
    """

    def __init__(self, path: Path, specs: Mapping[str, TensorSpec]) -> None:
        self.path = Path(path)
        self.specs = dict(specs)
        header, self.offsets = _layout(self.specs)
        self.size = len(header) + sum(s.nbytes for s in self.specs.values())
        self._header_sha = hashlib.sha256(header).hexdigest()
        self._header_len = len(header)
        self._hashes: dict[tuple[str, int], Any] = {}
        self._written: dict[tuple[str, int], int] = {}
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            self._pwrite(header, 0)
            os.ftruncate(self._fd, self.size)
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> EntryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.abort()  # closes the file if `close` was not reached (an exception, a cancel)

    def write(
        self, name: str, values: Any, start: int = 0, index: int | Sequence[int] = ()
    ) -> None:
        """Write rows ``start:start+len(values)`` of ``tensor[index]`` (a numpy array or tensor)."""
        spec = self.specs[name]
        array = values.detach().cpu().numpy() if hasattr(values, "detach") else np.asarray(values)
        array = np.ascontiguousarray(array)
        index = (index,) if isinstance(index, int) else tuple(index)
        lead = spec.shape[: spec.row_dim]
        if len(index) != spec.row_dim or any(
            not 0 <= i < n for i, n in zip(index, lead, strict=False)
        ):
            raise IndexError(f"{name}: index {index} does not address a slice of {spec.shape}")
        if (
            dtype_code(array.dtype) != spec.dtype
            or array.shape[1:] != spec.shape[spec.row_dim + 1 :]
        ):
            raise ValueError(
                f"{name}: got {array.dtype} rows of shape {array.shape[1:]}, expected "
                f"{spec.dtype} rows of shape {spec.shape[spec.row_dim + 1 :]}"
            )
        segment = int(np.ravel_multi_index(index, lead)) if lead else 0
        key = (name, segment)
        done = self._written.get(key, 0)
        if start != done:
            raise ValueError(f"{name}[{index}]: rows must be written in order (next is {done}).")
        if start + len(array) > spec.rows:
            raise IndexError(f"{name}[{index}]: rows {start}:{start + len(array)} > {spec.rows}")
        data = memoryview(array.reshape(-1).view(np.uint8))
        position = self.offsets[name] + (segment * spec.rows + start) * spec.row_bytes
        self._pwrite(data, position)
        self._hashes.setdefault(key, hashlib.sha256()).update(data)
        self._written[key] = done + len(array)

    def _pwrite(self, data: bytes | memoryview, position: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = os.pwrite(self._fd, view, position)
            view, position = view[n:], position + n

    def close(self) -> dict[str, Any]:
        """Check that every segment is complete, close the file and return its content record
        ``{"bytes": size, "segments": [[offset, length, sha256], …]}`` (in file order)."""
        segments = [[0, self._header_len, self._header_sha]]
        for name, spec in self.specs.items():
            for segment in range(spec.n_segments):
                key = (name, segment)
                if self._written.get(key, 0) != spec.rows:
                    self.abort()
                    raise ValueError(
                        f"{name}: segment {segment} holds {self._written.get(key, 0)} of "
                        f"{spec.rows} rows; the entry is incomplete."
                    )
                length = spec.rows * spec.row_bytes
                digest = self._hashes.get(key, hashlib.sha256()).hexdigest()
                segments.append([self.offsets[name] + segment * length, length, digest])
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return {"bytes": self.size, "segments": sorted(segments)}

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- checking an entry -----------------------------------------------------------------------------


def _segments(meta: dict[str, Any], size: int) -> list[list[Any]]:
    """The hashed segments of an entry's file; they must tile it exactly."""
    content = meta.get("content")
    if content is None:  # written by `save`: one hash of the whole file
        return [[0, size, meta.get("data_sha256")]]
    if content.get("bytes") != size:
        raise CacheMiss("file size differs from the recorded size")
    position = 0
    for offset, length, _ in content["segments"]:
        if offset != position:
            raise CacheMiss("hashed segments leave a hole")
        position += length
    if position != size:
        raise CacheMiss("hashed segments do not cover the file")
    return content["segments"]


def _file_version(path: Path, segments: list[list[Any]]) -> tuple[Any, ...]:
    st = path.stat()
    digest = hashlib.sha256(canonical_json(segments).encode()).hexdigest()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, digest)


def forget_verified() -> None:
    """Forget which files this process has hashed, so the next load of each hashes it again
    (what a new process does; for tests and for a user who suspects a disk)."""
    _verified.clear()


def verify_content(path: Path, segments: list[list[Any]], threads: int | None = None) -> None:
    """Hash every segment (several threads for large files) and raise CacheMiss on a mismatch."""
    total = sum(length for _, length, _ in segments)
    threads = threads or (min(4, usable_cores()) if total > 64 << 20 else 1)

    def check(segment: list[Any]) -> bool:
        offset, length, expected = segment
        return _range_sha256(path, offset, length) == expected

    if threads > 1 and len(segments) > 1:
        with ThreadPoolExecutor(threads) as pool:
            ok = all(pool.map(check, segments))
    else:
        ok = all(check(s) for s in segments)
    if not ok:
        raise CacheMiss("content hash mismatch")


def _named_lock(kind: str, key: str) -> threading.Lock:
    """This process's lock of one entry (held while it is computed, written and loaded)."""
    with _locks_guard:
        return _locks.setdefault(f"{kind}/{key}", threading.Lock())


def max_cache_bytes() -> int | None:
    """The entries' size cap: ``$TUNESCOPE_CACHE_MAX_GB`` gigabytes (10⁹ bytes), None if unset."""
    raw = os.environ.get(MAX_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise CacheError(f"{MAX_ENV} must be a number of gigabytes, 0 or more (got {raw!r}).")
    return int(value * 1e9)


def eviction_order(entry: Mapping[str, Any]) -> tuple[bool, float]:
    """Sort key of what goes first: states before other kinds, then the least recently used."""
    return entry["kind"] != STATES_KIND, float(entry["last_used"])


# --- the entries as a whole: in use, removal, eviction ---------------------------------------------


class CacheFolder:
    """The entries under one cache root as a whole: which are there, which are in use, removing
    one, evicting down to the size cap, sweeping what dead writers left. It reads no entry's
    tensors and needs no inputs; `DiskCache` adds reading and writing entries by their inputs."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def in_use(self, folder: Path | str) -> bool:
        """Whether an entry is in use — what `remove_entry` would skip — without removing it."""
        with self._exclusive(Path(folder)) as free:
            return not free

    def remove_entry(self, folder: Path | str) -> bool:
        """Delete one entry unless it is in use (module docstring, "evicted"): mapped by some
        process, or being computed or loaded by this one. Returns whether it went."""
        folder = Path(folder)
        with self._exclusive(folder) as free:
            if not free:
                return False
            try:
                return remove_folder(folder)
            except FileNotFoundError:  # another remover was first
                return False

    @contextlib.contextmanager
    def _exclusive(self, folder: Path) -> Iterator[bool]:
        """Hold an entry exclusively if that is possible at once: this process's lock of it and
        an exclusive ``flock`` on its data file (no process maps it). Yields whether it is held."""
        guard = _named_lock(folder.parent.name, folder.name)
        if not guard.acquire(blocking=False):
            yield False
            return
        fd = None
        try:
            with contextlib.suppress(FileNotFoundError):  # no data file: nothing maps it
                fd = os.open(folder / DATA_FILE, os.O_RDONLY)
            free = True
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    free = False
            yield free
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock
            guard.release()

    def enforce_cap(
        self, max_bytes: int | None = None, keep: Path | None = None
    ) -> list[dict[str, Any]]:
        """Evict entries until they hold at most ``max_bytes`` (default: `max_cache_bytes`; None:
        no cap): the oldest unused states first, then the other kinds, oldest first; an entry in
        use, and ``keep`` (the one just written), stay. Returns the entries removed."""
        max_bytes = max_cache_bytes() if max_bytes is None else max_bytes
        if max_bytes is None:
            return []
        entries = list(self.entries())
        total = sum(e["bytes"] for e in entries)
        removed = []
        for entry in sorted(entries, key=eviction_order):
            if total <= max_bytes:
                break
            if keep is not None and Path(entry["path"]) == Path(keep):
                continue
            if self.remove_entry(entry["path"]):
                total -= entry["bytes"]
                removed.append(entry)
        return removed

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every valid-looking entry's summary (kind, key, bytes, its ``inputs``, path,
        last_used: UNIX seconds), for `info`, ``tunescope cache`` and the UI."""
        if not self.root.is_dir():
            return
        for kind_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for entry in sorted(p for p in kind_dir.iterdir() if p.is_dir()):
                if entry.name.startswith(TMP_PREFIX):
                    continue
                with contextlib.suppress(OSError, json.JSONDecodeError):
                    meta = read_meta(entry)
                    size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                    yield {
                        "kind": kind_dir.name,
                        "key": entry.name[:12],
                        "bytes": size,
                        "inputs": meta.get("inputs", {}),
                        "path": str(entry),
                        "last_used": entry.stat().st_mtime,
                    }

    def clear_stale_temp(self, older_than_s: float = 3600.0) -> int:
        """Remove temporary folders left by writers that died mid-write. A folder counts as stale
        when neither it nor any file in it changed for ``older_than_s`` (a long streamed
        extraction keeps writing its data file, so it is never taken for dead)."""
        removed = 0
        if not self.root.is_dir():
            return 0
        now = time.time()
        for tmp in self.root.glob(f"*/{TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                newest = max(
                    [tmp.stat().st_mtime] + [f.stat().st_mtime for f in tmp.iterdir()]
                    if tmp.is_dir()
                    else [tmp.stat().st_mtime]
                )
                if now - newest > older_than_s:
                    if tmp.is_dir():
                        shutil.rmtree(tmp, ignore_errors=True)
                    else:
                        tmp.unlink()
                    removed += 1
        return removed


# --- the cache --------------------------------------------------------------------------------------

# What condemns an entry: its content or format (CacheMiss; a malformed meta.json or header:
# JSON, Unicode, struct, key, type and attribute errors; a file of the entry missing or a folder). Any other
# OSError is the system's (EMFILE, ENOMEM, EIO…) and leaves the entry alone.
_UNUSABLE = (
    CacheMiss, ValueError, KeyError, TypeError, AttributeError, struct.error,
    FileNotFoundError, NotADirectoryError, IsADirectoryError,
)  # fmt: skip


class DiskCache(CacheFolder):
    """Atomic, content-checked, memory-mapped safetensors + JSON entries keyed by their inputs
    (managing them as a whole, eviction included: `CacheFolder`)."""

    def entry_dir(self, kind: str, inputs: dict[str, Any]) -> Path:
        return self.root / kind / entry_key(inputs)

    def load(
        self, kind: str, inputs: dict[str, Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The entry's tensors (memory-mapped, a `MappedEntry`) and meta, or None when absent or
        invalid (an invalid one is removed). See the module docstring for what is checked when.

        Raises `CacheError` (the entry kept) when the system, not the entry, fails: too many open
        files, no memory for the mapping, a read error.
        """
        folder = self.entry_dir(kind, inputs)
        if not folder.is_dir():
            return None
        try:
            record = read_meta(folder)
            if record.get("key") != entry_key(inputs):
                raise CacheMiss("key mismatch")
            data_path = folder / DATA_FILE
            header = read_header(data_path)
            size = data_path.stat().st_size
            if size != header.data_start + header.data_bytes:
                raise CacheMiss("file size differs from its header")
            segments = _segments(record, size)
            version = _file_version(data_path, segments)
            if version not in _verified:
                verify_content(data_path, segments)
                _verified.add(version)
            tensors = map_tensors(data_path, header)
            with contextlib.suppress(OSError):  # last used (a read-only cache stays readable)
                os.utime(folder)
        except CacheError:  # a ValueError too, but never the entry's fault
            raise
        except EntryGone:  # evicted while we opened it: a miss, and someone else's folder now
            return None
        except _UNUSABLE:
            # Corrupt, partial or foreign: never use it; remove it so it is recomputed.
            shutil.rmtree(folder, ignore_errors=True)
            return None
        except OSError as exc:  # the system's failure, not the entry's: keep it
            raise CacheError(
                f"Could not read the cache entry {folder}: {exc.strerror or exc}. The entry is "
                "kept; try again once the cause is gone."
            ) from exc
        return tensors, record.get("meta", {})

    def stored(self, kind: str, inputs: dict[str, Any]) -> dict[str, StoredTensor]:
        """Where each tensor of an entry lies on disk (for chunked reads); call after `load`."""
        return stored_tensors(self.entry_dir(kind, inputs) / DATA_FILE)

    def save(
        self,
        kind: str,
        inputs: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        meta: dict[str, Any] | None = None,
    ) -> Path:
        """Write an entry from tensors in memory, atomically, and return its folder
        (`analysis.io.atomic_folder`: if another writer of the same inputs won the race, theirs is
        kept: same content)."""
        from safetensors.torch import save_file

        folder = self.entry_dir(kind, inputs)
        with atomic_folder(folder) as tmp:
            data_path = tmp / DATA_FILE
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(data_path)
            )
            self._write_meta(tmp, kind, inputs, meta, {"data_sha256": file_sha256(data_path)})
        return folder

    def _write_meta(
        self,
        folder: Path,
        kind: str,
        inputs: dict[str, Any],
        meta: dict[str, Any] | None,
        content: dict[str, Any],
    ) -> None:
        record = {
            "kind": kind,
            "inputs": inputs,
            "key": entry_key(inputs),
            "code_version": CODE_VERSION,
            **content,
            "meta": meta or {},
        }
        (folder / META_FILE).write_text(json.dumps(record, indent=1, default=str))

    def get_or_compute(
        self,
        kind: str,
        inputs: dict[str, Any],
        compute: Callable[[], tuple[dict[str, torch.Tensor], dict[str, Any]]],
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool]:
        """Serve from disk, or compute once (one computation per inputs per process at a time);
        a new entry is followed by `enforce_cap`. Returns (tensors, meta, hit).
        """
        with self._lock(kind, inputs):
            found = self.load(kind, inputs)
            if found is not None:
                return found[0], found[1], True
            tensors, meta = compute()
            folder = self.save(kind, inputs, tensors, meta)
        self.enforce_cap(keep=folder)
        return tensors, meta, False

    def get_or_write(
        self,
        kind: str,
        inputs: dict[str, Any],
        specs: Mapping[str, TensorSpec],
        write: Callable[[EntryWriter], dict[str, Any]],
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool]:
        """Serve from disk, or stream a new entry: ``write(writer)`` fills every tensor of
        ``specs`` through the `EntryWriter` and returns the entry's meta. The entry is published
        (atomically) only when complete, then served memory-mapped, and followed by
        `enforce_cap`. Returns (tensors, meta, hit).
        """
        with self._lock(kind, inputs):
            found = self.load(kind, inputs)
            if found is not None:
                return found[0], found[1], True
            folder = self.entry_dir(kind, inputs)
            self._check_space(folder.parent, sum(s.nbytes for s in specs.values()))
            with atomic_folder(folder) as tmp:
                with EntryWriter(tmp / DATA_FILE, specs) as writer:
                    meta = write(writer)
                    content = writer.close()
                self._write_meta(tmp, kind, inputs, meta, {"content": content})
            data_path = folder / DATA_FILE
            # The segment hashes were taken from the very bytes written: no need to read them back.
            _verified.add(_file_version(data_path, content["segments"]))
            found = self.load(kind, inputs)
            if found is None:
                raise CacheError(f"The cache entry {folder} could not be read back after writing.")
        self.enforce_cap(keep=folder)
        return found[0], found[1], False

    @staticmethod
    def _check_space(folder: Path, needed: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        if needed > free:
            raise CacheError(
                f"The cache needs {needed / 1e9:.2f} GB for this entry but {folder} has only "
                f"{free / 1e9:.2f} GB free: free some space or point TUNESCOPE_CACHE elsewhere."
            )

    def _lock(self, kind: str, inputs: dict[str, Any]) -> threading.Lock:
        return _named_lock(kind, entry_key(inputs))
