"""``info``: the built-in models and datasets, and what the cache holds."""

from __future__ import annotations

import argparse

from tunescope.commands.options import write_json

NAME = "info"
HELP = "list built-in models and datasets, and the cache's contents"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", default=None, help="cache folder (default: ./cache)")
    parser.add_argument("--json", default=None, help="also write it as JSON to this file")
    parser.set_defaults(writes=False)  # never the one to create a missing cache folder


def run(args: argparse.Namespace) -> int:
    from analysis.cache import CacheFolder
    from analysis.data import BUILTIN_DATA, GLUE_DATA, describe_builtin
    from analysis.models import BUILTIN_MODELS, FAMILIES

    cache = CacheFolder()
    cache.clear_stale_temp()
    entries = list(cache.entries())
    print("Built-in models (work offline):")
    for name, text in BUILTIN_MODELS.items():
        print(f"  {name:<16} {text}")
    print(f"  (also: any local folder or hub id of the families {', '.join(FAMILIES)})")
    print("Datasets:")
    for line in describe_builtin().splitlines():
        print(f"  {line}")
    print(f"Cache: {cache.root} — {len(entries)} entries")
    for e in entries:
        inputs = e["inputs"]
        model = inputs.get("model", {}).get("name", "?") if isinstance(inputs, dict) else "?"
        data = inputs.get("data", {}).get("name", "?") if isinstance(inputs, dict) else "?"
        print(f"  {e['kind']:<10} {e['key']}  {e['bytes'] / 1e6:8.2f} MB  {model} / {data}")
    write_json(
        args.json,
        {
            "models": BUILTIN_MODELS,
            "families": list(FAMILIES),
            "datasets": BUILTIN_DATA,
            "glue": GLUE_DATA,
            "cache": {"root": str(cache.root), "entries": entries},
        },
    )
    return 0
