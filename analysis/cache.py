"""The disk cache: one home for every computed artefact.

An entry is a folder ``<root>/<kind>/<key>/`` holding ``data.safetensors`` (tensors) and
``meta.json`` (the recipe that produced it, the code version, and the SHA-256 of the tensor
file). The key is the SHA-256 of the canonical JSON of the recipe, so two requests with the
same recipe share one entry.

Writes are atomic: everything goes into a temporary sibling folder that is renamed into place
only when complete, so a crash or a cancel mid-write never leaves an entry that reads as valid.
Reads are content-checked: the tensor file's hash must match the one in ``meta.json``, the
recipe must match, and the tensors must load; otherwise the entry is deleted and treated as a
miss (the caller recomputes). No pickle anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.io import TMP_PREFIX, atomic_folder

if TYPE_CHECKING:
    import torch

# Bump when a change to the code changes what an entry means; it is part of every key.
CODE_VERSION = "1"

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def default_root() -> Path:
    """``$TUNESCOPE_CACHE`` if set, else ``cache/`` at the project's root."""
    env = os.environ.get("TUNESCOPE_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    return Path(__file__).resolve().parent.parent / "cache"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def recipe_key(recipe: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``recipe`` plus the code version."""
    payload = canonical_json({"recipe": recipe, "code_version": CODE_VERSION})
    return hashlib.sha256(payload.encode()).hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class CacheMiss(LookupError):
    pass


class DiskCache:
    """Atomic, content-checked safetensors + JSON entries keyed by recipe."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def entry_dir(self, kind: str, recipe: dict[str, Any]) -> Path:
        return self.root / kind / recipe_key(recipe)

    def load(
        self, kind: str, recipe: dict[str, Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The entry's tensors and meta, or None when absent or invalid (an invalid one is removed)."""
        folder = self.entry_dir(kind, recipe)
        if not folder.is_dir():
            return None
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if meta.get("recipe_key") != recipe_key(recipe):
                raise CacheMiss("recipe mismatch")
            data_path = folder / "data.safetensors"
            if file_sha256(data_path) != meta.get("data_sha256"):
                raise CacheMiss("content hash mismatch")
            from safetensors.torch import load_file

            tensors = load_file(str(data_path))
        except Exception:  # OSError, JSON, safetensors header errors, CacheMiss: all mean unusable
            # Corrupt, partial or foreign: never use it; remove it so it is recomputed.
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return tensors, meta.get("meta", {})

    def save(
        self,
        kind: str,
        recipe: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        meta: dict[str, Any] | None = None,
    ) -> Path:
        """Write an entry atomically and return its folder (`analysis.io.atomic_folder`: if
        another writer of the same recipe won the race, theirs is kept: same content)."""
        from safetensors.torch import save_file

        folder = self.entry_dir(kind, recipe)
        with atomic_folder(folder) as tmp:
            data_path = tmp / "data.safetensors"
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(data_path)
            )
            record = {
                "kind": kind,
                "recipe": recipe,
                "recipe_key": recipe_key(recipe),
                "code_version": CODE_VERSION,
                "data_sha256": file_sha256(data_path),
                "meta": meta or {},
            }
            (tmp / "meta.json").write_text(json.dumps(record, indent=1, default=str))
        return folder

    def get_or_compute(
        self,
        kind: str,
        recipe: dict[str, Any],
        compute: Callable[[], tuple[dict[str, torch.Tensor], dict[str, Any]]],
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool]:
        """Serve from disk, or compute once (one computation per recipe per process at a time).

        Returns (tensors, meta, hit).
        """
        with self._lock(kind, recipe):
            found = self.load(kind, recipe)
            if found is not None:
                return found[0], found[1], True
            tensors, meta = compute()
            self.save(kind, recipe, tensors, meta)
            return tensors, meta, False

    def _lock(self, kind: str, recipe: dict[str, Any]) -> threading.Lock:
        name = f"{kind}/{recipe_key(recipe)}"
        with _locks_guard:
            return _locks.setdefault(name, threading.Lock())

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every valid-looking entry's summary (kind, key, size, recipe), for `info` and the UI."""
        if not self.root.is_dir():
            return
        for kind_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for entry in sorted(p for p in kind_dir.iterdir() if p.is_dir()):
                if entry.name.startswith(TMP_PREFIX):
                    continue
                meta_path = entry / "meta.json"
                with contextlib.suppress(OSError, json.JSONDecodeError):
                    meta = json.loads(meta_path.read_text())
                    size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                    yield {
                        "kind": kind_dir.name,
                        "key": entry.name[:12],
                        "bytes": size,
                        "recipe": meta.get("recipe", {}),
                        "path": str(entry),
                    }

    def clear_stale_temp(self, older_than_s: float = 3600.0) -> int:
        """Remove temporary folders left by writers that died mid-write (old enough that no live
        writer can still own them). They are never read as entries either way."""
        removed = 0
        if not self.root.is_dir():
            return 0
        now = time.time()
        for tmp in self.root.glob(f"*/{TMP_PREFIX}*"):
            if now - tmp.stat().st_mtime > older_than_s:
                shutil.rmtree(tmp, ignore_errors=True)
                removed += 1
        return removed
