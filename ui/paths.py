"""Which file-system paths the UI may read: typed paths cannot escape the allowed roots.

Allowed by default: the data folder (``$TUNESCOPE_DATA_DIR``, else ``data/`` in the checkout or,
installed, in the working folder: `analysis.workspace.data_folder`), the cache root
(uploads land there), and the folders listed in ``$TUNESCOPE_ALLOWED_ROOTS`` (os.pathsep-separated),
which is how a user opens models or files elsewhere. The CLI is not restricted: a user typing a
command already has the file system.
"""

from __future__ import annotations

import os
from pathlib import Path

from analysis.cache import default_root
from analysis.workspace import data_folder


def data_dir() -> Path:
    return data_folder()


def allowed_roots() -> list[Path]:
    roots = [data_dir(), default_root()]
    extra = os.environ.get("TUNESCOPE_ALLOWED_ROOTS", "")
    roots += [Path(p).expanduser().resolve() for p in extra.split(os.pathsep) if p.strip()]
    return roots


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(
        (".csv", ".tsv", ".jsonl", ".json", ".parquet")
    )


def resolve_typed(name: str) -> Path:
    """A typed path, resolved: absolute (or ``~``) as it is; relative inside the data folder.

    A relative path that already starts with the data folder's own name (``data/amazon.csv``,
    as typed from the project root) is not doubled: ``data/amazon.csv`` is the data folder's
    ``amazon.csv`` unless the data folder really holds a ``data/amazon.csv``.
    """
    path = Path(name.strip()).expanduser()
    if path.is_absolute():
        return path.resolve()
    folder = data_dir()
    inside = folder / path
    if not inside.exists() and len(path.parts) > 1 and path.parts[0] == folder.name:
        stripped = folder.joinpath(*path.parts[1:])
        if stripped.exists():
            return stripped.resolve()
    return inside.resolve()


def is_allowed(path: Path) -> bool:
    return any(path == root or root in path.parents for root in allowed_roots())


def relative_to_data(path: Path | str) -> str | None:
    """``path`` relative to the data folder (POSIX style), or None when it lies elsewhere."""
    try:
        return Path(path).resolve().relative_to(data_dir()).as_posix()
    except ValueError:
        return None


def check_allowed(name: str) -> str:
    """Return the resolved path (see `resolve_typed`), or raise ValueError if it lies outside
    every allowed root."""
    resolved = resolve_typed(name)
    if is_allowed(resolved):
        return str(resolved)
    roots = ", ".join(str(r) for r in allowed_roots())
    raise ValueError(
        f"'{name}' is outside the folders this dashboard may read ({roots}). Put the file in the "
        "data folder, upload it, or add its folder to TUNESCOPE_ALLOWED_ROOTS."
    )
