"""The tunescope_recipe.py of an exported folder imported from that folder, as a user imports it
(nothing of tunescope behind it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def import_recipe_module(folder: Path):
    """The folder's tunescope_recipe.py as a fresh module (its own name, so folders never mix)."""
    name = f"tunescope_recipe_{abs(hash(str(folder)))}"
    spec = importlib.util.spec_from_file_location(name, Path(folder) / "tunescope_recipe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
