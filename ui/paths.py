"""Which file-system paths the UI may read: typed paths cannot escape the allowed roots.

Allowed by default: the project's ``data/`` folder (``$TUNESCOPE_DATA_DIR``), the cache root
(uploads land there), and the folders listed in ``$TUNESCOPE_ALLOWED_ROOTS`` (os.pathsep-separated),
which is how a user opens models or files elsewhere. The CLI is not restricted: a user typing a
command already has the file system.
"""

from __future__ import annotations

import os
from pathlib import Path

from analysis.cache import default_root

PROJECT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("TUNESCOPE_DATA_DIR", PROJECT / "data")).expanduser().resolve()


def allowed_roots() -> list[Path]:
    roots = [data_dir(), default_root()]
    extra = os.environ.get("TUNESCOPE_ALLOWED_ROOTS", "")
    roots += [Path(p).expanduser().resolve() for p in extra.split(os.pathsep) if p.strip()]
    return roots


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(
        (".csv", ".tsv", ".jsonl", ".json", ".parquet")
    )


def check_allowed(name: str) -> str:
    """Return the resolved path, or raise ValueError if it lies outside every allowed root."""
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = data_dir() / path
    resolved = path.resolve()
    for root in allowed_roots():
        if resolved == root or root in resolved.parents:
            return str(resolved)
    roots = ", ".join(str(r) for r in allowed_roots())
    raise ValueError(
        f"'{name}' is outside the folders this dashboard may read ({roots}). Put the file in the "
        "data folder, upload it, or add its folder to TUNESCOPE_ALLOWED_ROOTS."
    )
