"""The launch form's fields of one method's options, derived from its spec (`MethodSpec.fields`).

Each option's kind says its widget (`analysis.finetune.spec`): layers → a multiselect of the
model's layers, int / float → a number field, text and run → a text field, per_layer → a text
field of ``layer:value`` pairs, heads → a heads-file upload (default: the Heads page's
selection for this model and data). A new method's options appear
here without a line of page code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from analysis.finetune.registry import method_spec
from analysis.finetune.spec import parse_layer_values
from analysis.heads.selection_file import HeadSelection
from ui.finetune.state import heads_from_upload

KEEP = "session"


def option_widgets(
    method: str,
    container: Any,
    n_layers: int,
    default_layer: int,
    heads_found: HeadSelection | None,
    key: Callable[[str], str],
) -> Callable[[], dict[str, Any]]:
    """Draw the fields of ``method``'s options in ``container`` (inside the form); returns what
    turns their values, once submitted, into the options' keyword arguments (given fields only,
    so the rest keep the options' defaults; a heads field falls back to ``heads_found``).

    ``key(name)`` gives a widget key (layer fields are kept per extraction)."""
    read: dict[str, Callable[[], Any]] = {}
    spec = method_spec(method)
    for field in spec.fields:
        label, help_text = spec.field_label(field), field.help
        if field.kind == "layers":
            chosen = container.multiselect(
                label, list(range(1, n_layers + 1)), default=[default_layer], help=help_text,
                key=key(field.flat), persist_state=KEEP,
            )  # fmt: skip
            read[field.name] = lambda chosen=chosen: tuple(sorted(chosen)) or None
        elif field.kind in ("int", "float"):
            number = int if field.kind == "int" else float
            value = container.number_input(
                label, value=None if field.default is None else number(field.default),
                help=help_text,
                key=f"ft_{field.flat}", persist_state=KEEP,
                **({"min_value": 1, "step": 1} if field.kind == "int" else {"min_value": 0.0}),
            )  # fmt: skip
            read[field.name] = lambda value=value, number=number: (
                None if value is None else number(value)
            )
        elif field.kind in ("text", "run", "per_layer"):
            text = container.text_input(
                label, "", help=help_text, key=f"ft_{field.flat}", persist_state=KEEP,
                placeholder="layer:value, e.g. 3:16, 4:8" if field.kind == "per_layer" else None,
            )  # fmt: skip
            read[field.name] = (
                (lambda text=text, what=label: parse_layer_values(text, what))
                if field.kind == "per_layer"
                else (lambda text=text: text.strip() or None)
            )
        else:  # heads
            upload = container.file_uploader(
                f"{label} file (method {method})", type=["json"],
                help=help_text + (" · default: the Heads page's selection for this model and "
                                  "data" if heads_found else " · no selection from the Heads "
                                  "page for this model and data yet"),
            )  # fmt: skip
            read[field.name] = lambda upload=upload: (
                heads_from_upload(upload.getvalue()) if upload is not None else heads_found
            )

    def values() -> dict[str, Any]:
        given = {name: get() for name, get in read.items()}
        return {name: value for name, value in given.items() if value is not None}

    return values
