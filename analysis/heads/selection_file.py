"""The head selection: which heads of which layers head fine-tuning trains, and its file.

One type, `HeadSelection`, used everywhere a selection travels: the Heads page and
``python -m tunescope heads --selection-out`` write it, the Fine-tune page and
``finetune --heads FILE`` read it, and `FinetuneConfig` holds it. The file is a small JSON
document::

    {"format": "tunescope-heads/1",
     "model": "minilm",
     "n_layers": 12, "n_heads": 12,
     "settings": {"xi": 0.9, "k": 3, "damping": 0.85, ...},
     "layers": {"1": [0, 3, 5], "2": [1, 2, 7], ...}}

Layers are 1-based (docs/explanation/layer-metrics.md, "Notation"), heads 0-based. ``model``,
``n_layers``, ``n_heads`` and ``settings`` are optional provenance; when ``n_layers`` /
``n_heads`` are present they are checked, and `HeadSelection.check_fits` checks a selection
against a model. Free of torch, so the CLI can offer the vocabulary below without loading it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.io import atomic_write_text, parse_json, read_json

FORMAT = "tunescope-heads/1"

# The vocabulary of head selection.
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

Layers = tuple[tuple[int, tuple[int, ...]], ...]  # ((layer, (head, ...)), ...), sorted


class SelectionError(ValueError):
    """A head selection that cannot be used, with the reason."""


@dataclass(frozen=True)
class HeadSelection:
    """layers: layer (1-based) → heads (0-based); settings: what produced it (provenance).

    ``layers`` may be given as a mapping ``{layer: heads}`` (layer keys may be digit strings, as
    in JSON) or as ``(layer, heads)`` pairs; it is stored normalised as sorted tuples, so a
    selection is hashable and two selections of the same heads compare equal whatever their
    provenance (``model``, ``settings``, ``n_layers``, ``n_heads``). Layers with no heads are
    dropped; a selection with no heads at all is an error.
    """

    layers: Layers
    # Provenance: not part of what a selection is (two files naming the same heads are equal).
    model: str = field(default="", compare=False)
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False)
    n_layers: int | None = field(default=None, compare=False)
    n_heads: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise SelectionError(f"The model name must be a string (got {self.model!r}).")
        if not isinstance(self.settings, Mapping):
            raise SelectionError("The settings must be a JSON object.")
        for name in ("n_layers", "n_heads"):
            value = getattr(self, name)
            if value is not None and not _is_count(value, minimum=1):
                raise SelectionError(f"{name} must be a positive whole number (got {value!r}).")
        object.__setattr__(self, "layers", _normalise(self.layers, self.n_layers, self.n_heads))

    @property
    def n_selected(self) -> int:
        return sum(len(heads) for _, heads in self.layers)

    def as_dict(self) -> dict[int, list[int]]:
        """``{layer: [heads]}``, ascending."""
        return {layer: list(heads) for layer, heads in self.layers}

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
        _normalise(self.layers, n_layers, n_heads)

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"format": FORMAT, "model": self.model}
        if self.n_layers is not None:
            record["n_layers"] = self.n_layers
        if self.n_heads is not None:
            record["n_heads"] = self.n_heads
        record["settings"] = dict(self.settings)
        record["layers"] = layers_json(self.layers)
        return record

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_dict(), indent=1)


def layers_json(layers: Layers) -> dict[str, list[int]]:
    """``{"1": [0, 3]}``: the layers as the file and the run configs store them."""
    return {str(layer): list(heads) for layer, heads in layers}


def _normalise(value: Any, n_layers: int | None, n_heads: int | None) -> Layers:
    """Sorted ((layer, (head, ...)), ...) from a mapping or pairs, each entry checked."""
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.items()
    elif isinstance(value, list | tuple):
        items = value
    else:
        raise SelectionError(
            f'The layers must map a layer number to a list of heads, e.g. {{"1": [0, 3]}} '
            f"(got {value!r})."
        )
    out: dict[int, tuple[int, ...]] = {}
    for item in items:
        try:
            layer, heads = item
        except (TypeError, ValueError):
            raise SelectionError(f"Not a (layer, heads) pair: {item!r}.") from None
        if isinstance(layer, str):
            if not layer.strip().lstrip("-").isdigit():
                raise SelectionError(f"Layer key {layer!r} is not a layer number.")
            layer = int(layer)
        if not _is_count(layer, minimum=1):
            raise SelectionError(
                f"Layer {layer!r} is not a layer number: layers are numbered from 1 (0 is the embeddings)."
            )
        if n_layers is not None and layer > n_layers:
            raise SelectionError(f"Layer {layer} is beyond the model's {n_layers} layers.")
        if layer in out:
            raise SelectionError(f"Layer {layer} is listed twice.")
        if not isinstance(heads, list | tuple) or not all(_is_count(h, minimum=0) for h in heads):
            raise SelectionError(f"Layer {layer}: heads must be a list of 0-based head numbers.")
        if len(set(heads)) != len(heads):
            raise SelectionError(f"Layer {layer} lists a head twice: {list(heads)}.")
        if n_heads is not None and any(h >= n_heads for h in heads):
            raise SelectionError(
                f"Layer {layer} names head {max(heads)}, but this model's heads run "
                f"0..{n_heads - 1} ({n_heads} heads per layer)."
            )
        if heads:
            out[layer] = tuple(sorted(heads))
    if not out:
        raise SelectionError("The selection names no heads at all: choose at least one head.")
    return tuple(sorted(out.items()))


def selection_from_dict(record: Any) -> HeadSelection:
    """Validate a parsed selection document and build the selection."""
    if not isinstance(record, dict):
        raise SelectionError("A selection file must hold a JSON object.")
    if record.get("format") != FORMAT:
        raise SelectionError(
            f"Not a head-selection file: format is {record.get('format')!r}, expected {FORMAT!r}."
        )
    if "layers" not in record:
        raise SelectionError("The selection file lacks layers.")
    layers = record["layers"]
    if not isinstance(layers, dict):
        raise SelectionError('"layers" must be an object like {"1": [0, 3, 5]}.')
    return HeadSelection(
        layers=layers,
        model=record.get("model", ""),
        settings=record.get("settings", {}),
        n_layers=record.get("n_layers"),
        n_heads=record.get("n_heads"),
    )


def selection_from_json(text: str | bytes) -> HeadSelection:
    """A selection from the text of a selection file (an upload, say)."""
    try:
        record = parse_json(text, "selection file")
    except ValueError as exc:
        raise SelectionError(str(exc)) from None
    return selection_from_dict(record)


def load_selection(path: str | Path) -> HeadSelection:
    """Read and validate a selection file; SelectionError (a ValueError) says what is wrong."""
    try:
        record = read_json(path, "selection file")
    except ValueError as exc:
        raise SelectionError(str(exc)) from None
    return selection_from_dict(record)


def save_selection(selection: HeadSelection, path: str | Path) -> Path:
    """Write the selection file atomically."""
    return atomic_write_text(path, selection.to_json())


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
