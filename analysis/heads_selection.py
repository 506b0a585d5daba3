"""The head-selection file: which heads of which layers head fine-tuning trains.

A small JSON document, written by the Heads page and ``python -m analysis heads
--selection-out``, read by the fine-tuning engine::

    {"format": "tunescope-heads/1",
     "model": "minilm",
     "n_layers": 12, "n_heads": 12,
     "settings": {"xi": 0.9, "k": 3, "damping": 0.85, ...},
     "layers": {"1": [0, 3, 5], "2": [1, 2, 7], ...}}

Layers are 1-based (SPEC.md), heads 0-based. ``n_layers`` / ``n_heads`` are optional; when
present they are checked, and ``HeadSelection.check_fits`` checks a selection against a model.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "tunescope-heads/1"

# The vocabulary of head selection (analysis.heads uses it; kept here, free of torch, for the CLI).
PAGERANK_VARIANTS = ("paper", "personalised")
SCOPES = ("layer-wise", "mid-top")
SELECTORS = (
    "pagerank",
    "richness",
    "richness-lowest",
    "correlation",
    "pagerank-lowest",
    "random",
)
# What each selector is called in the paper's ablation table (Table 3).
SELECTOR_LABELS = {
    "pagerank": "HiFi: top-k PageRank",
    "richness": "w/o corr: top-k I_h",
    "richness-lowest": "w/o corr + inv: lowest-k I_h",
    "correlation": "w/o info: top-k total correlation",
    "pagerank-lowest": "page inv: lowest-k PageRank",
    "random": "random: k random heads",
}


class SelectionError(ValueError):
    """A selection file that cannot be used, with the reason."""


@dataclass(frozen=True)
class HeadSelection:
    """layers: layer (1-based) → heads (0-based, ascending); settings: what produced it."""

    model: str
    layers: dict[int, list[int]]
    settings: dict[str, Any] = field(default_factory=dict)
    n_layers: int | None = None
    n_heads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise SelectionError(f"The model name must be a string (got {self.model!r}).")
        if not isinstance(self.settings, dict):
            raise SelectionError("The settings must be a JSON object.")
        for name in ("n_layers", "n_heads"):
            value = getattr(self, name)
            if value is not None and not _is_count(value, minimum=1):
                raise SelectionError(f"{name} must be a positive whole number (got {value!r}).")
        if not isinstance(self.layers, Mapping):
            raise SelectionError("The layers must map a layer number to a list of heads.")
        for layer, heads in self.layers.items():
            if not _is_count(layer, minimum=1):
                raise SelectionError(f"Layer {layer!r} is not a layer number (1-based).")
            if self.n_layers is not None and layer > self.n_layers:
                raise SelectionError(f"Layer {layer} is beyond the model's {self.n_layers} layers.")
            if not isinstance(heads, list | tuple) or not all(
                _is_count(h, minimum=0) for h in heads
            ):
                raise SelectionError(
                    f"Layer {layer}: heads must be a list of 0-based head numbers."
                )
            if len(set(heads)) != len(heads):
                raise SelectionError(f"Layer {layer} lists a head twice: {list(heads)}.")
            if self.n_heads is not None and any(h >= self.n_heads for h in heads):
                raise SelectionError(
                    f"Layer {layer} names head {max(heads)}, but heads run 0..{self.n_heads - 1}."
                )
        if self.n_selected == 0:
            raise SelectionError("The selection names no heads at all.")

    @property
    def n_selected(self) -> int:
        return sum(len(heads) for heads in self.layers.values())

    def check_fits(self, n_layers: int, n_heads: int) -> None:
        """Raise SelectionError unless every layer and head exists in a model of this size."""
        if self.n_layers is not None and self.n_layers != n_layers:
            raise SelectionError(
                f"The selection was made for {self.n_layers} layers; this model has {n_layers}."
            )
        if self.n_heads is not None and self.n_heads != n_heads:
            raise SelectionError(
                f"The selection was made for {self.n_heads} heads per layer; this model has {n_heads}."
            )
        HeadSelection(self.model, self.layers, self.settings, n_layers, n_heads)

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"format": FORMAT, "model": self.model}
        if self.n_layers is not None:
            record["n_layers"] = self.n_layers
        if self.n_heads is not None:
            record["n_heads"] = self.n_heads
        record["settings"] = self.settings
        record["layers"] = {
            str(layer): sorted(heads) for layer, heads in sorted(self.layers.items())
        }
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def selection_from_dict(record: Any) -> HeadSelection:
    """Validate a parsed selection document and build the selection."""
    if not isinstance(record, dict):
        raise SelectionError("A selection file must hold a JSON object.")
    if record.get("format") != FORMAT:
        raise SelectionError(
            f"Not a head-selection file: format is {record.get('format')!r}, expected {FORMAT!r}."
        )
    missing = [key for key in ("model", "layers") if key not in record]
    if missing:
        raise SelectionError(f"The selection file lacks {', '.join(missing)}.")
    layers = record["layers"]
    if not isinstance(layers, dict):
        raise SelectionError('"layers" must be an object like {"1": [0, 3, 5]}.')
    parsed: dict[int, list[int]] = {}
    for key, heads in layers.items():
        try:
            layer = int(key)
        except (TypeError, ValueError):
            raise SelectionError(f"Layer key {key!r} is not a layer number.") from None
        parsed[layer] = heads
    return HeadSelection(
        model=record["model"],
        layers=parsed,
        settings=record.get("settings", {}),
        n_layers=record.get("n_layers"),
        n_heads=record.get("n_heads"),
    )


def selection_from_json(text: str) -> HeadSelection:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SelectionError(
            f"The selection file is not valid JSON: {exc.msg} (line {exc.lineno})."
        ) from None
    return selection_from_dict(record)


def load_selection(path: str | Path) -> HeadSelection:
    """Read and validate a selection file; SelectionError (a ValueError) says what is wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SelectionError(f"Cannot read the selection file {path}: {exc.strerror}.") from None
    return selection_from_json(text)


def save_selection(selection: HeadSelection, path: str | Path) -> Path:
    """Write the selection atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(selection.to_json())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
