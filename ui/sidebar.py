"""The shared sidebar (model, dataset, N, pooling, seed) and the config it stands for.

Sidebar values live in ``st.session_state`` under ``cfg_*`` keys, so they survive page switches;
`settings()` turns them into one validated `ExtractConfig`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import streamlit as st

from analysis.cache import default_root
from analysis.config import POOLINGS, DataSpec, ExtractConfig, ModelSpec, SampleSpec, help_of
from analysis.io import atomic_write_bytes
from ui.paths import check_allowed, looks_like_path


def default_model() -> str:
    """The model the sidebar starts on: $TUNESCOPE_MODEL (trusted: set by whoever started the app)."""
    return os.environ.get("TUNESCOPE_MODEL", "minilm")


def default_data() -> str:
    return os.environ.get("TUNESCOPE_DATA", "movie-snippets")


def default_n() -> int:
    return int(os.environ.get("TUNESCOPE_N", "1000"))


OTHER = "other (folder or hub id)…"
UPLOAD = "upload a file…"


def _defaults() -> None:
    from analysis.data import BUILTIN_DATA, GLUE_DATA
    from analysis.models import BUILTIN_MODELS

    state = st.session_state
    model, data = default_model(), default_data()
    state.setdefault("cfg_model_choice", model if model in BUILTIN_MODELS else OTHER)
    state.setdefault("cfg_model_other", "" if model in BUILTIN_MODELS else model)
    state.setdefault("cfg_trust_remote", False)
    known = [*BUILTIN_DATA, *GLUE_DATA]
    state.setdefault("cfg_data_choice", data if data in known else "file path…")
    state.setdefault("cfg_data_path", "" if data in known else data)
    for key, value in {
        "cfg_text_col": "", "cfg_pair_col": "", "cfg_label_col": "",
        "cfg_n": default_n(), "cfg_seed": 0, "cfg_pooling": "mean", "cfg_max_length": 128,
    }.items():  # fmt: skip
        state.setdefault(key, value)


def render_sidebar() -> None:
    """Draw the shared settings; called by app.py before every page."""
    from analysis.data import BUILTIN_DATA, GLUE_DATA
    from analysis.models import BUILTIN_MODELS

    _defaults()
    side = st.sidebar
    side.header("Settings")
    side.selectbox("Model", [*BUILTIN_MODELS, OTHER], key="cfg_model_choice")
    if st.session_state.cfg_model_choice == OTHER:
        side.text_input(
            "Model folder or hub id", key="cfg_model_other", placeholder="bert-base-uncased"
        )
        side.checkbox(
            "Trust the model's own code", key="cfg_trust_remote",
            help="Runs Python code shipped with the model. Only for models you trust.",
        )  # fmt: skip
        if st.session_state.cfg_trust_remote:
            side.warning("trust_remote_code is on: the model's own code will run.")
    side.selectbox(
        "Dataset", [*BUILTIN_DATA, *GLUE_DATA, "file path…", UPLOAD], key="cfg_data_choice"
    )
    choice = st.session_state.cfg_data_choice
    if choice == UPLOAD:
        upload = side.file_uploader(
            "CSV / TSV / JSONL / Parquet", type=["csv", "tsv", "jsonl", "json", "parquet"]
        )
        if upload is not None:
            st.session_state.cfg_data_path = save_upload(upload.name, upload.getvalue())
    if choice in ("file path…", UPLOAD):
        side.text_input("File path", key="cfg_data_path", disabled=choice == UPLOAD)
        with side.expander("Columns"):
            st.text_input("Text column", key="cfg_text_col", placeholder="text")
            st.text_input("Second-text column (pairs)", key="cfg_pair_col", placeholder="optional")
            st.text_input("Label column", key="cfg_label_col", placeholder="label")
    side.number_input("N examples", min_value=2, max_value=100_000, step=100, key="cfg_n")
    side.number_input("Seed", min_value=0, max_value=2**31 - 1, step=1, key="cfg_seed")
    side.radio("Pooling", POOLINGS, key="cfg_pooling", horizontal=True,
               help=help_of(ExtractConfig, "pooling"))  # fmt: skip
    side.number_input(
        "Max length (tokens)", min_value=8, max_value=512, step=8, key="cfg_max_length"
    )


def save_upload(name: str, content: bytes) -> str:
    """Store an uploaded file under the cache's uploads/ folder, named by its content hash."""
    suffix = Path(name).suffix.lower()
    folder = default_root() / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{hashlib.sha256(content).hexdigest()[:16]}{suffix}"
    if not target.exists():
        atomic_write_bytes(target, content)
    return str(target)


def model_spec() -> ModelSpec:
    state = st.session_state
    if state.get("cfg_model_choice", default_model()) != OTHER:
        return ModelSpec(state.get("cfg_model_choice", default_model()))
    name = (state.get("cfg_model_other") or "").strip()
    if not name:
        raise ValueError("Type a model folder or hub id in the sidebar.")
    if looks_like_path(name) and name != default_model():
        name = check_allowed(name)
    return ModelSpec(name, trust_remote_code=bool(state.get("cfg_trust_remote")))


def data_spec() -> DataSpec:
    state = st.session_state
    choice = state.get("cfg_data_choice", default_data())
    if choice not in ("file path…", UPLOAD):
        return DataSpec(choice)
    path = (state.get("cfg_data_path") or "").strip()
    if not path:
        raise ValueError(
            "Choose a data file in the sidebar (a path in the data folder, or upload one)."
        )
    if path != default_data():
        path = check_allowed(path)
    return DataSpec(
        path,
        text_col=state.get("cfg_text_col") or None,
        text_pair_col=state.get("cfg_pair_col") or None,
        label_col=state.get("cfg_label_col") or None,
    )


def settings() -> ExtractConfig:
    """The sidebar's current choice as one validated config (raises ValueError with a clear message)."""
    state = st.session_state
    return ExtractConfig(
        model=model_spec(),
        data=data_spec(),
        sample=SampleSpec(
            n=int(state.get("cfg_n", default_n())), seed=int(state.get("cfg_seed", 0))
        ),
        pooling=state.get("cfg_pooling", "mean"),
        max_length=int(state.get("cfg_max_length", 128)),
    )
