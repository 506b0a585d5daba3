"""The "take it home" download button every page shares: a recommendation or a run as a recipe
folder (zip) for the user's own training (`analysis.export.build`).

`recipe_button(settings, provenance, key, **flat)` offers the recipe of a config made from the
sidebar's settings and a method's flat keys (``method="layers", layers=(1, 3, 3)``);
`run_recipe_button(db, run_id, key)` the recipe of a stored run. The zip is built once per
config (st.cache_data); what cannot be exported gets a caption saying why, never an error.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import ExtractConfig

HELP = (
    "recipe.json (what trains, learning rates, where it came from), tunescope_recipe.py "
    "(apply_recipe for your own transformers Trainer or loop: torch and transformers only), a "
    "README with the lines to paste and, for LoRA, PEFT's adapter_config.json"
)


@st.cache_data(max_entries=32, show_spinner="Writing the recipe…")
def _recipe_zip(config_json: str, provenance_json: str) -> bytes:
    from analysis.export.build import build_recipe, recipe_zip
    from analysis.finetune.config import FinetuneConfig
    from ui.loaders import get_data, get_model

    cfg = FinetuneConfig.from_dict(json.loads(config_json))
    data = get_data(cfg.data)
    n_outputs = 1 if data.task_type == "regression" else data.n_classes
    recipe = build_recipe(cfg, get_model(cfg.model), n_outputs, json.loads(provenance_json))
    return recipe_zip(recipe)


def _offer(config: dict[str, Any], provenance: dict[str, Any], key: str, label: str) -> None:
    try:
        data = _recipe_zip(canonical_json(config), canonical_json(provenance))
    except ValueError as exc:
        st.caption(f"No recipe to take home: {exc}")
        return
    st.download_button(
        label, data, "tunescope-recipe.zip", "application/zip", key=key, help=HELP,
        on_click="ignore",
    )  # fmt: skip


def recipe_button(
    settings: ExtractConfig,
    provenance: dict[str, Any],
    key: str,
    label: str = "Recipe for your own training (zip)",
    **flat: Any,
) -> None:
    """The recipe of ``flat`` (a method and its flat keys) on the sidebar's model and data."""
    from analysis.finetune.config import flat_config

    try:
        cfg = flat_config(
            model=dataclasses.asdict(settings.model),
            data=dataclasses.asdict(settings.data),
            pooling=settings.pooling,
            max_length=settings.max_length,
            **flat,
        )
    except ValueError as exc:
        st.caption(f"No recipe to take home: {exc}")
        return
    _offer(cfg.to_dict(), {"source": "page", **provenance}, key, label)


def run_recipe_button(db, run_id: str, key: str, label: str = "This run as a recipe (zip)") -> None:
    """The recipe of stored run ``run_id``: what it trained, for the user's own training."""
    from analysis.export.build import run_source

    try:
        cfg, provenance = run_source(run_id, db)
    except ValueError as exc:
        st.caption(f"No recipe for this run: {exc}")
        return
    _offer(cfg.to_dict(), provenance, key, label)


def pick_run_recipe(db, runs, key: str) -> None:
    """A picker over ``runs`` (`RunsDB.list_runs` rows, finished ones offered) and the chosen
    run's recipe button."""
    done = runs[runs["status"] == "done"] if not runs.empty else runs
    if done.empty:
        return
    labels = dict(zip(done["id"], done["label"], strict=True))
    run_id = st.selectbox(
        "Take a finished run home as a recipe", list(labels), key=f"{key}_run",
        format_func=lambda i: f"{i} · {labels[i]}",
    )  # fmt: skip
    run_recipe_button(db, run_id, key)
