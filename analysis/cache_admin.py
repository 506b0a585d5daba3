"""What a cache folder holds, and freeing it: ``tunescope cache`` (list, prune) and the Data
page's size line. The layout is `analysis.workspace.Workspace`'s; entries and their locks are
`analysis.cache.CacheFolder`'s.

    kind            what                                              prune removes it
    states          pooled hidden states (`analysis.extract`)         by default: recomputed
    layer_metrics   a layer table (`analysis.layers.table`)           by default: recomputed
    layer_repeats   bootstrap repeats of a layer table                by default: recomputed
    heads           head statistics (`analysis.heads.collect`)        by default: recomputed
    subspace-svd    the SVD of a run's trajectory (`analysis.subspace`) by default: recomputed
    (any other)     an entry of a kind added later                    by default: recomputed
    partial         what a writer that died left (``.tmp-*``)         by default, an hour on
    trajectories    ``runs/<run id>/``: what a run recorded           only when named (--kind)
    zero-weights    ``subspace/<run id>/``: the disable experiment    only when named
    uploads         ``uploads/<digest>/``: a file uploaded on a page  only when named
    database        ``runs.sqlite``: every run                        never

Never removed: the runs database (no run is deleted here); the files a run needs — a queued or
running run's own trajectory, a trajectory another run trains in, zero-weights files a run zeroes,
an upload a run names as its data; an entry in use (`CacheFolder.remove_entry`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.cache import STATES_KIND, CacheFolder, eviction_order, max_cache_bytes
from analysis.io import TMP_PREFIX, remove_folder
from analysis.workspace import Workspace

ENTRY_KINDS = ("states", "layer_metrics", "layer_repeats", "heads", "subspace-svd")
PARTIAL = "partial"
RUN_FILES = ("trajectories", "zero-weights")
UPLOADS = "uploads"
DATABASE = "database"
NOT_ENTRIES = (PARTIAL, *RUN_FILES, UPLOADS, DATABASE)  # any other kind is a disk-cache entry
KINDS = (*ENTRY_KINDS, *NOT_ENTRIES)
NAMED_ONLY = (*RUN_FILES, UPLOADS)  # pruned only when asked for by kind
STALE_S = 3600.0  # a partial folder untouched this long has no live writer (`clear_stale_temp`)


@dataclass(frozen=True)
class Item:
    """One thing the cache folder holds: its kind (`KINDS`), name (an entry's key, a run id, an
    upload's file name), folder, size, last use (UNIX seconds), what it was computed from (model,
    data, N: None where that does not apply) and the runs that use it."""

    kind: str
    name: str
    path: Path
    bytes: int
    last_used: float
    model: str | None = None
    data: str | None = None
    n: int | None = None
    runs: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path), "runs": list(self.runs)}


@dataclass(frozen=True)
class Usage:
    """A cache folder's size on disk (everything under it), the free space of its disk, and
    the entries' size cap (`analysis.cache.max_cache_bytes`; None: no cap)."""

    root: Path
    total_bytes: int
    free_bytes: int
    cap_bytes: int | None


@dataclass(frozen=True)
class Pruned:
    """What `prune` removed (or, dry, would remove), and what it kept with the reason."""

    removed: list[Item]
    kept: list[tuple[Item, str]]
    dry_run: bool

    @property
    def freed_bytes(self) -> int:
        return sum(item.bytes for item in self.removed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "freed_bytes": self.freed_bytes,
            "removed": [item.to_dict() for item in self.removed],
            "kept": [{**item.to_dict(), "reason": reason} for item, reason in self.kept],
        }


def human_bytes(n: float) -> str:
    """``999 B``, ``1.2 MB``, ``10.4 GB`` (powers of 1000, as disks are sold)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it is gone)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def usage(workspace: Workspace) -> Usage:
    """The cache folder's size and its disk's free space (of the nearest folder that exists)."""
    root = workspace.root
    existing = next(p for p in (root, *root.parents) if p.exists())
    total = folder_bytes(root) if root.is_dir() else 0
    return Usage(root, total, shutil.disk_usage(existing).free, max_cache_bytes())


# --- what the folder holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class _RunRef:
    """What the listing needs of one run: its status, what it was trained on, what it names."""

    id: str
    status: str
    model: str | None
    data: str | None
    uses: tuple[str, ...]  # its subspace source, zero-weights file and data file, as stored


def _runs(workspace: Workspace) -> list[_RunRef]:
    if not workspace.runs_db.is_file():  # never create a database to list nothing
        return []
    from analysis.runs.db import RunsDB
    from analysis.runs.record import runs_of, source_run

    db = RunsDB(workspace)
    try:
        frame = db.list_runs()
    finally:
        db.close()
    refs = []
    for run, model, data in zip(runs_of(frame), frame["model"], frame["data"], strict=True):
        stored = run.stored
        uses = (source_run(stored), stored.get("zero_weights"), data)
        refs.append(_RunRef(run.id, run.status, model, data, tuple(str(u) for u in uses if u)))
    return refs


def _inside(name: str, folder: Path) -> bool:
    return name == str(folder) or name.startswith(str(folder) + os.sep)


def is_entry(kind: str) -> bool:
    """Whether items of ``kind`` are disk-cache entries (computed again when missing)."""
    return kind not in NOT_ENTRIES


def items(workspace: Workspace, runs: Sequence[_RunRef] | None = None) -> list[Item]:
    """Everything the cache folder holds (`KINDS`), kind by kind, oldest use first within one.
    ``runs``: the runs database's runs, when the caller has read them already."""
    root = workspace.root
    if not root.is_dir():
        return []
    runs = _runs(workspace) if runs is None else runs
    by_id = {run.id: run for run in runs}
    out = _entries(CacheFolder(root), workspace, by_id)
    for kind, parent in (("trajectories", root / "runs"), ("zero-weights", root / "subspace")):
        for folder in _folders(parent):
            owner = by_id.get(folder.name)
            users = [r.id for r in runs if r.id != folder.name and _names(r, folder, kind)]
            out.append(
                Item(kind, folder.name, folder, folder_bytes(folder), _newest(folder),
                     owner.model if owner else None, owner.data if owner else None,
                     runs=tuple(([owner.id] if owner else []) + users))
            )  # fmt: skip
    for folder in _folders(workspace.uploads):
        files = sorted(f.name for f in folder.iterdir() if f.is_file())
        users = tuple(r.id for r in runs if r.data and _inside(r.data, folder))
        out.append(
            Item(UPLOADS, ", ".join(files) or folder.name, folder, folder_bytes(folder),
                 _newest(folder), data=files[0] if files else None, runs=users)
        )  # fmt: skip
    for tmp in sorted(root.glob(f"*/{TMP_PREFIX}*")) + sorted(root.glob(f"{TMP_PREFIX}*")):
        size = folder_bytes(tmp) if tmp.is_dir() else tmp.stat().st_size
        out.append(Item(PARTIAL, tmp.name, tmp, size, _newest(tmp)))
    database = [p for p in root.glob(f"{workspace.runs_db.name}*") if p.is_file()]
    if database:
        newest = max(p.stat().st_mtime for p in database)
        size = sum(p.stat().st_size for p in database)
        out.append(Item(DATABASE, workspace.runs_db.name, workspace.runs_db, size, newest,
                        runs=tuple(run.id for run in runs)))  # fmt: skip
    order = {kind: i for i, kind in enumerate(KINDS)}
    later = len(ENTRY_KINDS) - 0.5  # a kind added later: after the known entries
    return sorted(out, key=lambda item: (order.get(item.kind, later), item.last_used))


def _entries(cache: CacheFolder, workspace: Workspace, by_id: dict[str, _RunRef]) -> list[Item]:
    """The disk cache's entries, each with the model, data and N it was computed from (a table
    derived from states: those of its states; an SVD: its run's)."""
    entries = list(cache.entries())
    states = {Path(e["path"]).name: e["inputs"] for e in entries if e["kind"] == STATES_KIND}
    trajectories = _trajectory_runs(workspace)
    out = []
    for entry in entries:
        inputs = entry["inputs"] if isinstance(entry["inputs"], dict) else {}
        source = states.get(str(inputs.get("states")), inputs)
        run = by_id.get(trajectories.get(str(inputs.get("trajectory")), ""))
        model = _name(source.get("model")) or (run.model if run else None)
        data = _name(source.get("data")) or (run.data if run else None)
        n = (
            (source.get("sample") or {}).get("n")
            if isinstance(source.get("sample"), dict)
            else None
        )
        out.append(
            Item(entry["kind"], entry["key"], Path(entry["path"]), entry["bytes"],
                 entry["last_used"], model, data, n, runs=(run.id,) if run else ())
        )  # fmt: skip
    return out


def _trajectory_runs(workspace: Workspace) -> dict[str, str]:
    """Trajectory id → the run that recorded it (its ``runs/<id>/…/index.json``)."""
    out = {}
    for index in (workspace.root / "runs").glob("*/*/index.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            out[str(json.loads(index.read_text()).get("id"))] = index.parent.parent.name
    return out


def _name(value: Any) -> str | None:
    return value.get("name") if isinstance(value, dict) else None


def _names(run: _RunRef, folder: Path, kind: str) -> bool:
    """Whether a run names a run folder: it trains in the subspace of its trajectory (named by
    run id or folder), or zeroes the weights its files list."""
    by_id = kind == "trajectories"
    return any((by_id and use == folder.name) or _inside(use, folder) for use in run.uses)


def _folders(parent: Path) -> list[Path]:
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(TMP_PREFIX))


def _newest(path: Path) -> float:
    """The latest modification under ``path``: when it was last written or (entries) used."""
    newest = path.stat().st_mtime
    if path.is_dir():
        for folder, _, files in os.walk(path):
            for name in files:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
    return newest


# --- freeing it ---------------------------------------------------------------------------------


def check_kinds(kinds: Iterable[str], present: Iterable[str] = ()) -> tuple[str, ...]:
    """The kinds asked for, each one of `KINDS` or of the kinds ``present`` in a cache folder
    (a ValueError naming them)."""
    kinds, known = tuple(kinds), tuple(dict.fromkeys([*KINDS, *present]))
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise ValueError(f"Unknown cache kind {unknown[0]!r}: choose from {', '.join(known)}.")
    return kinds


def chosen(item: Item, kinds: Sequence[str] | None) -> bool:
    """Whether ``kinds`` picks ``item``; None picks what `prune` removes by default (all but run
    files, uploads and the database)."""
    if kinds is None:
        return item.kind not in (*NAMED_ONLY, DATABASE)
    return item.kind in kinds


def kept_because(item: Item, runs: dict[str, _RunRef], cache: CacheFolder, now: float) -> str:
    """Why ``item`` must stay ('' when it may go)."""
    if item.kind == DATABASE:
        return "the runs database is never pruned"
    if is_entry(item.kind):
        return "in use (being read or computed)" if cache.in_use(item.path) else ""
    if item.kind == PARTIAL:
        return "a writer may still be writing it" if now - item.last_used < STALE_S else ""
    if item.kind == UPLOADS:
        return f"run {_few(item.runs)} trained on it" if item.runs else ""
    owner = runs.get(item.name)
    if owner is not None and owner.status in ("queued", "running"):
        return f"its run is {owner.status}"
    others = [r for r in item.runs if r != item.name]
    if others:
        return f"run {_few(others)} needs it (trains in its subspace or zeroes its weights)"
    return ""


def prune(
    workspace: Workspace,
    kinds: Sequence[str] | None = None,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> Pruned:
    """Remove what the cache holds of ``kinds`` (None: `chosen`'s default): everything last
    used more than ``older_than_s`` ago (None: any age), or — with ``max_bytes`` — the oldest
    unused first (states before other kinds) until those kinds hold at most ``max_bytes``. What
    must stay (`kept_because`) stays and is reported with its reason; ``dry_run`` removes
    nothing."""
    now = time.time() if now is None else now
    cache = CacheFolder(workspace.root)
    runs = _runs(workspace)
    picked = [item for item in items(workspace, runs) if chosen(item, kinds)]
    by_id = {run.id: run for run in runs}
    total = sum(item.bytes for item in picked)
    removed, kept = [], []
    for item in sorted(picked, key=lambda i: eviction_order(vars(i))):
        if max_bytes is not None and total <= max_bytes:
            break
        if older_than_s is not None and now - item.last_used < older_than_s:
            continue
        reason = kept_because(item, by_id, cache, now)
        if not reason and not dry_run and not _remove(item, cache):
            reason = "in use (being read or computed)"
        if reason:
            kept.append((item, reason))
            continue
        removed.append(item)
        total -= item.bytes
    return Pruned(removed, kept, dry_run)


def _remove(item: Item, cache: CacheFolder) -> bool:
    if is_entry(item.kind):
        return cache.remove_entry(item.path)
    if item.path.is_dir():
        return remove_folder(item.path)
    item.path.unlink(missing_ok=True)
    return True


def _few(ids: Sequence[str], shown: int = 2) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more
