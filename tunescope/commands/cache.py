"""``cache``: what the cache folder holds (kind, model, data, N, size, last used, the runs that
use it) against its disk's free space, and ``cache prune`` to free it (`analysis.cache_admin`)."""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime

from analysis.cache_admin import human_bytes
from analysis.words import counted
from tunescope.commands.options import write_json

NAME = "cache"
HELP = "list what the cache holds (kind, model, data, N, size, last used, runs) or prune it"
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SIZE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from analysis.cache import MAX_ENV
    from analysis.cache_admin import KINDS, NAMED_ONLY

    parser.add_argument(
        "action", nargs="?", choices=("list", "prune"), default="list",
        help="list (the default) or prune: remove what --kind, --older-than and --max-size pick",
    )  # fmt: skip
    parser.add_argument("--cache", default=None, help="cache folder (default: ./cache)")
    parser.add_argument(
        "--kind", default=None,
        help=f"comma-separated, from: {', '.join(KINDS)} (list: all; prune: all but "
        f"{', '.join(NAMED_ONLY)}, which go only when named, and the database, which never goes)",
    )  # fmt: skip
    parser.add_argument(
        "--older-than", default=None, metavar="AGE",
        help="only what was last used more than AGE ago: 90m, 12h, 30d, 2w",
    )  # fmt: skip
    parser.add_argument(
        "--max-size", default=None, metavar="SIZE",
        help="prune the least recently used (states first) until these kinds hold at most SIZE: "
        f"500MB, 20GB (the same rule as {MAX_ENV} applies after every new entry)",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="prune: say what would go")
    parser.add_argument("--json", default=None, help="also write it as JSON ('-': stdout only)")
    parser.set_defaults(writes=False)  # never the one to create a missing cache folder


def parse_age(text: str) -> float:
    """Seconds of an age like ``30d``, ``12h``, ``90m``, ``2w``, ``45s``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise ValueError(f"--older-than takes an age such as 30d, 12h or 90m (got {text!r}).")
    return float(match[1]) * AGE_UNITS[match[2]]


def parse_size(text: str) -> int:
    """Bytes of a size like ``20GB``, ``500MB``, ``1.5TB`` (powers of 1000)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", text.lower())
    if not match:
        raise ValueError(f"--max-size takes a size such as 20GB or 500MB (got {text!r}).")
    return int(float(match[1]) * SIZE_UNITS[match[2]])


def when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def run(args: argparse.Namespace) -> int:
    from analysis.cache_admin import check_kinds

    kinds = None
    if args.kind:
        present = [p.name for p in args.workspace.root.glob("*") if p.is_dir()]
        kinds = check_kinds([k.strip() for k in args.kind.split(",") if k.strip()], present)
    older = parse_age(args.older_than) if args.older_than else None
    if args.action == "list":
        if args.max_size or args.dry_run:
            raise ValueError("--max-size and --dry-run go with `cache prune`.")
        return _list(args, kinds, older)
    max_bytes = parse_size(args.max_size) if args.max_size else None
    return _prune(args, kinds, older, max_bytes)


def _list(args: argparse.Namespace, kinds, older: float | None) -> int:
    from analysis.cache import MAX_ENV
    from analysis.cache_admin import items, usage

    now = time.time()
    shown = [
        i for i in items(args.workspace)
        if (kinds is None or i.kind in kinds) and (older is None or now - i.last_used >= older)
    ]  # fmt: skip
    use = usage(args.workspace)
    write_json(
        args.json,
        {"root": str(use.root), "total_bytes": use.total_bytes, "free_bytes": use.free_bytes,
         "cap_bytes": use.cap_bytes, "items": [i.to_dict() for i in shown]},
    )  # fmt: skip
    if args.json == "-":
        return 0
    cap = human_bytes(use.cap_bytes) if use.cap_bytes is not None else "none"
    print(
        f"Cache folder {use.root}: {human_bytes(use.total_bytes)} on disk, "
        f"{human_bytes(use.free_bytes)} free there; size cap of the entries ({MAX_ENV}): {cap}"
    )
    if not shown:
        print("nothing" + (" of these kinds" if args.kind or older else "") + " in it")
        return 0
    columns = {
        "kind": [i.kind for i in shown],
        "name": [_short(i.name, 24) for i in shown],
        "size": [human_bytes(i.bytes) for i in shown],
        "last used": [when(i.last_used) for i in shown],
        "model": [_short(_base(i.model), 20) for i in shown],
        "data": [_short(_base(i.data), 24) for i in shown],
        "N": ["-" if i.n is None else str(i.n) for i in shown],
        "runs": [_runs(i.runs) for i in shown],
    }
    widths = {k: max(len(k), *(len(v) for v in values)) for k, values in columns.items()}

    def line(cells: dict[str, str]) -> str:  # numbers right-aligned, text left
        return "  ".join(
            cells[k].rjust(w) if k in ("size", "N") else cells[k].ljust(w)
            for k, w in widths.items()
        ).rstrip()

    print(line({k: k for k in columns}))
    for row in range(len(shown)):
        print(line({k: values[row] for k, values in columns.items()}))
    by_kind: dict[str, list[int]] = {}
    for i in shown:
        by_kind.setdefault(i.kind, []).append(i.bytes)
    print(
        "by kind: "
        + " · ".join(f"{k} {human_bytes(sum(v))} ({len(v)})" for k, v in by_kind.items())
    )
    return 0


def _prune(args: argparse.Namespace, kinds, older: float | None, max_bytes: int | None) -> int:
    from analysis.cache_admin import prune

    result = prune(args.workspace, kinds, older, max_bytes, dry_run=args.dry_run)
    write_json(args.json, result.to_dict())
    if args.json == "-":
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for item in result.removed:
        print(f"{verb:<12} {item.kind:<13} {_short(item.name, 24):<24} {human_bytes(item.bytes):>9}"
              f"  {_short(_base(item.model), 20)} {_short(_base(item.data), 24)}")  # fmt: skip
    for item, reason in result.kept:
        print(f"{'kept':<12} {item.kind:<13} {_short(item.name, 24):<24} "
              f"{human_bytes(item.bytes):>9}  {reason}")  # fmt: skip
    print(
        f"{verb} {counted(len(result.removed), 'item')}, {human_bytes(result.freed_bytes)}"
        + (f"; kept {len(result.kept)}" if result.kept else "")
    )
    return 0


def _base(name: str | None) -> str:
    """A data set or model by its last path part (the JSON keeps the whole name)."""
    if not name:
        return "-"
    return name.rstrip("/").rsplit("/", 1)[-1] or name


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _runs(ids: tuple[str, ...]) -> str:
    if not ids:
        return "-"
    return ", ".join(ids[:2]) + (f" +{len(ids) - 2}" if len(ids) > 2 else "")
