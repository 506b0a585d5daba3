"""The shared sidebar (model, dataset, N, seed, pooling, max length) and the config it stands for.

Each setting lives in a query parameter of the same name (`ui.links`: bound widgets, and the
data picker kept in step by hand), so the settings survive page switches, live in the address
bar and come back from a copied link.
`settings()` turns them into one validated `ExtractConfig`; every bad value gets one clear
message, in the sidebar beside the field and on the page.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import streamlit as st

from analysis.config import POOLINGS, DataSpec, ExtractConfig, ModelSpec, SampleSpec, help_of
from ui import links
from ui.datasets import (
    COLUMN_KEYS,
    UPLOAD,
    UPLOAD_PREFIX,
    NothingChosen,
    data_files,
    data_label,
    data_warnings,
    file_columns,
    fitted_sample,
    named,
    names_upload,
    normalised,
    option_label,
    save_upload,
    upload_path,
)
from ui.paths import check_allowed, data_dir, looks_like_path

N_HELP = (
    "Examples of the train part that the layer analyses (Data, Layers) use. The Heads page "
    "takes its own, smaller n (300 by default, as in the HiFi paper): head statistics cost a "
    "forward pass with one singular-value decomposition per head and example, while CCA and "
    "the probes of the layer analyses want more examples. Fine-tuning uses the whole train part."
)
DATA_HELP = (
    "A built-in set, a GLUE task, a file of the data folder (listed by its path relative to "
    "that folder), a file you upload, or type a path: relative paths are looked up in the data "
    "folder, so 'amazon.csv' and 'data/amazon.csv' name the same file."
)
MODEL_HELP = (
    "A built-in encoder, or type a local folder (inside the allowed folders) or a model-hub id "
    "such as bert-base-uncased."
)


def default_model() -> str:
    """The model the sidebar starts on: $TUNESCOPE_MODEL (trusted: set by whoever started the app),
    else the 12-layer built-in, on which the default first session tells the papers' story: on
    1,000 movie snippets (seed 0) its ℓ* is layer 10 of 12, in 42 of 50 bootstrap repeats, so
    tuning up to ℓ* has layers to cut; MiniLM's ℓ* is its top layer on both built-in data sets.
    MiniLM where the 12-layer model's packaged parts are not installed (they are optional)."""
    return os.environ.get("TUNESCOPE_MODEL") or ("mpnet" if _mpnet_installed() else "minilm")


@functools.cache
def _mpnet_installed() -> bool:
    from analysis.models import ModelError
    from analysis.packaged import MPNET, default_root, part_files

    if (default_root() / MPNET.folder / MPNET.weights).is_file():
        return True
    try:
        return bool(part_files(MPNET))
    except ModelError:
        return False


def default_data() -> str:
    """The data the sidebar starts on: $TUNESCOPE_DATA (a name, or a path as it was given)."""
    return os.environ.get("TUNESCOPE_DATA", "movie-snippets")


def default_n() -> int:
    return int(os.environ.get("TUNESCOPE_N", "1000"))


def _model_refused(name: str) -> str | None:
    """Why a model named by a link is refused (None: fine, or checked when it is loaded)."""
    from analysis.models import BUILTIN_MODELS

    name = name.strip()
    if not name:
        return "is empty"
    if name in BUILTIN_MODELS or name == default_model() or not looks_like_path(name):
        return None  # a built-in, the server's own default, or a hub id (checked on loading)
    try:
        check_allowed(name)
    except ValueError:
        return "is a folder outside the ones this dashboard may read"
    return None


def _data_refused(value: str) -> str | None:
    """Why a data set named by a link is refused (None: fine)."""
    value = value.strip()
    if not value:
        return "is empty"
    if named(value) or value in (default_data(), UPLOAD):
        return None
    if value.startswith(UPLOAD_PREFIX):
        try:
            upload_path(value)
        except ValueError as exc:
            return f"names an upload that is not here ({exc})"
        return None
    try:
        path = Path(check_allowed(value))
    except ValueError:
        return "is outside the folders this dashboard may read"
    if not path.is_file():
        return "names no file in the data folder"
    return None


def _normalise_data() -> None:
    """The picker's callback: a typed path inside the data folder becomes its path relative to
    it, so it matches the picker's entry and makes a tidy link."""
    value = st.session_state.get("data")
    if isinstance(value, str) and normalised(value) != value:
        st.session_state["data"] = normalised(value)


def _store_upload() -> None:
    """The uploader's callback: store the file under its own name and choose it; a file that
    cannot be read as a table is not offered in the picker (its message shows instead)."""
    state = st.session_state
    upload = state.get("data_upload")
    state.pop(UPLOAD_ERROR, None)
    if upload is None:
        return
    value = save_upload(upload.name, upload.getvalue())
    try:
        file_columns(str(upload_path(value)))
    except ValueError as exc:
        state[UPLOAD_ERROR] = f"{exc} The file was not added to the Dataset list."
        return
    uploads = state.setdefault("data_uploads", [])
    if value not in uploads:
        uploads.append(value)
    state["data"] = value


UPLOAD_ERROR = "data_upload_error"
COLUMNS_OF = "data_columns_of"  # the data set the column pickers were chosen for
TEXT_GUESS = "guess: 'text' or 'sentence'"
LABEL_GUESS = "guess: 'label' or 'labels'"


def _reset_columns(choice: str) -> None:
    """Columns belong to one data set: choosing another clears them (and their link
    parameters), so "Text column 'review' not found" never follows a file to the next one."""
    state = st.session_state
    before = state.get(COLUMNS_OF)
    state[COLUMNS_OF] = choice
    if before is None or before == choice:
        return
    for key in COLUMN_KEYS:
        state.pop(key, None)
        if key in st.query_params:
            del st.query_params[key]


def _file_of(choice: str) -> str | None:
    """The file behind a data choice (None: a built-in, nothing chosen, or not readable)."""
    if not choice or named(choice) or choice == UPLOAD:
        return None
    try:
        if choice.startswith(UPLOAD_PREFIX):
            return str(upload_path(choice))
        return choice if choice == default_data() else check_allowed(choice)
    except ValueError:
        return None


def _column_pickers(side, choice: str) -> None:
    """The text / second-text / label column pickers, offering the file's own columns (from
    its header), in the "Columns" expander; opened when no column can be guessed."""
    path = _file_of(choice)
    if path is None:
        return
    try:
        columns = file_columns(path)
    except ValueError:
        return  # the page says what is wrong with the file
    if links.first_run():  # a link's column must be one of this file's
        for key in COLUMN_KEYS:
            if key in st.query_params and st.query_params[key] not in columns:
                links.drop(key, f"is not a column of {data_label(choice)}", "the guessed column")
        links.rerun_if_dropped()
    state = st.session_state
    text_known = state.get("text_col") or {"text", "sentence"} & set(columns)
    label_known = state.get("label_col") or {"label", "labels"} & set(columns)
    # Open until both the text and the label column are known (guessed or chosen): choosing the
    # text column alone must not fold the label picker away.
    with side.expander("Columns (text, label)", expanded=not (text_known and label_known)):
        st.selectbox("Text column", columns, index=None, key="text_col",
                     placeholder=TEXT_GUESS, bind=links.BIND)  # fmt: skip
        st.selectbox("Second-text column (pairs)", columns, index=None, key="pair_col",
                     placeholder="none", bind=links.BIND)  # fmt: skip
        st.selectbox("Label column", columns, index=None, key="label_col",
                     placeholder=LABEL_GUESS, bind=links.BIND)  # fmt: skip


def _data_options() -> list[str]:
    from analysis.data import BUILTIN_DATA, GLUE_DATA

    options = [*BUILTIN_DATA, *GLUE_DATA, *data_files(), *st.session_state.get("data_uploads", [])]
    current = st.session_state.get("data")
    for extra in (default_data(), current):
        if isinstance(extra, str) and extra and extra not in options and extra != UPLOAD:
            options.insert(len(BUILTIN_DATA), extra)
    return [*options, UPLOAD]


def render_sidebar() -> None:
    """Draw the shared settings; called by app.py before every page."""
    from analysis.models import BUILTIN_MODELS

    links.start_session()
    links.check_sidebar_link(_model_refused, _data_refused, normalised, default_n())
    side = st.sidebar
    side.header("Settings")
    links.show_notes(side)

    models = list(BUILTIN_MODELS)
    typed = (
        st.session_state.get("model"),
        st.query_params.get("model") if links.first_run() else None,
    )
    for extra in (default_model(), *typed):  # a typed folder or hub id stays in the list
        if isinstance(extra, str) and extra.strip() and extra not in models:
            models.append(extra)
    side.selectbox(
        "Model", models, index=models.index(default_model()), key="model",
        accept_new_options=True, bind=links.BIND, help=MODEL_HELP,
    )  # fmt: skip
    model = st.session_state.get("model") or ""
    if model and model not in BUILTIN_MODELS and model != default_model():
        _hub_note(side, model)
        side.checkbox(
            "Trust the model's own code", key=_trust_key(model),
            help="Runs Python code shipped with the model. Only for models you trust; never "
            "taken from a link.",
        )  # fmt: skip
        if st.session_state.get(_trust_key(model)):
            side.warning("trust_remote_code is on: the model's own code will run.")

    typed = st.session_state.get("data")
    if isinstance(typed, str) and typed != UPLOAD and names_upload(typed):
        st.session_state["data"] = UPLOAD  # the entry's words typed: the entry, not a file
    options = _data_options()
    side.selectbox(
        "Dataset", options, index=options.index(default_data()) if default_data() in options else 0,
        key="data", format_func=option_label, accept_new_options=True,
        on_change=_normalise_data, help=DATA_HELP,
    )  # fmt: skip
    choice = st.session_state.get("data") or ""
    links.publish("data", None if choice == UPLOAD else choice, default_data())
    _reset_columns(choice)
    if choice == UPLOAD:
        side.file_uploader(
            "CSV / TSV / JSONL / Parquet",
            type=["csv", "tsv", "jsonl", "json", "parquet"],
            key="data_upload",
            on_change=_store_upload,
        )
        if st.session_state.get(UPLOAD_ERROR):
            side.error(st.session_state[UPLOAD_ERROR], icon="⚠️")
    else:
        st.session_state.pop(UPLOAD_ERROR, None)
        side.caption(f"Data folder: `{data_dir()}`; its files are listed by their path inside it.")
    _column_pickers(side, choice)

    side.number_input("N examples", value=default_n(), step=100, key="n", bind=links.BIND,
                      help=N_HELP)  # fmt: skip
    _inline_error(side, _sample)
    _data_notes(side)
    side.number_input("Seed", value=0, step=1, key="seed", bind=links.BIND)
    side.radio("Pooling", POOLINGS, key="pooling", horizontal=True, bind=links.BIND,
               help=help_of(ExtractConfig, "pooling"))  # fmt: skip
    side.number_input("Max length (tokens)", value=128, step=8, key="max_length", bind=links.BIND)
    _inline_error(side, _max_length)


def _hub_note(side, model: str) -> None:
    """A hub id, the hub allowed: say that it is looked for there (with the hub off, the page
    says at once why it cannot load)."""
    from analysis.models import HUB_TIMEOUT_S, hub_endpoint, hub_offline, resolve_source

    if looks_like_path(model) or hub_offline():
        return
    try:
        if resolve_source(model)[1] != "hub":
            return
    except ValueError:
        return  # the page says why
    side.info(
        f"'{model}' is neither a built-in model nor a folder: it is looked for on the model hub "
        f"({hub_endpoint()}), which has {HUB_TIMEOUT_S:g} s to answer."
    )


def _inline_error(side, check) -> None:
    try:
        check()
    except ValueError as exc:
        side.error(str(exc), icon="⚠️")


def _data_notes(side) -> None:
    """A data file smaller than N is used whole (a note); columns that look swapped (a warning)."""
    try:
        spec, sample = data_spec(), _sample()
    except ValueError:
        return  # said beside the field, or on the page
    note = fitted_sample(spec, sample)[1]
    if note:
        side.info(note)
    for text in data_warnings(spec):
        side.warning(text, icon="⚠️")


def _trust_key(model: str) -> str:
    """Trust is ticked per model: another model starts untrusted."""
    return "trust_remote_" + hashlib.sha256(model.encode()).hexdigest()[:12]


def model_spec() -> ModelSpec:
    from analysis.models import BUILTIN_MODELS

    name = str(st.session_state.get("model") or default_model()).strip()
    if not name:
        raise NothingChosen("Choose a model in the sidebar, or type a model folder or hub id.")
    if name in BUILTIN_MODELS or name == default_model():
        return ModelSpec(name)
    trusted = bool(st.session_state.get(_trust_key(name)))  # ticked for the name as typed
    if looks_like_path(name):
        name = check_allowed(name)
    return ModelSpec(name, trust_remote_code=trusted)


def data_spec() -> DataSpec:
    state = st.session_state
    choice = str(state.get("data") or default_data()).strip()
    if choice == UPLOAD:
        raise NothingChosen(
            "Upload a CSV, TSV, JSON lines or Parquet file in the sidebar (with a text and a label "
            "column), or choose a built-in data set or a file of the data folder."
        )
    if named(choice):
        return DataSpec(choice)
    if choice.startswith(UPLOAD_PREFIX):
        path = str(upload_path(choice))
    elif choice == default_data():
        path = choice  # the server's own default (trusted, as it was given)
    else:
        path = check_allowed(choice)
    return DataSpec(
        path,
        text_col=state.get("text_col") or None,
        text_pair_col=state.get("pair_col") or None,
        label_col=state.get("label_col") or None,
    )


def _sample() -> SampleSpec:
    n, seed = st.session_state.get("n", default_n()), st.session_state.get("seed", 0)
    low, high = links.N_RANGE
    if not isinstance(n, int) or not low <= n <= high:
        why = (
            "the analyses need at least two examples"
            if isinstance(n, int) and n < low
            else f"the dashboard extracts at most {high:,} examples at a time (the CLI's "
            "`python -m tunescope extract` takes more)"
            if isinstance(n, int)
            else "N counts examples"
        )
        raise ValueError(
            f"N must be a whole number of examples from {low} to {high:,} (got {n}): {why}."
        )
    if not isinstance(seed, int) or not links.SEED_RANGE[0] <= seed <= links.SEED_RANGE[1]:
        raise ValueError(f"The seed must be a whole number from 0 to 2³¹ − 1 (got {seed}).")
    return SampleSpec(n=n, seed=seed)


def _max_length() -> int:
    value = st.session_state.get("max_length", 128)
    low, high = links.MAX_LENGTH_RANGE
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"Max length must be a whole number of tokens from {low} to {high} (got {value})."
        )
    return value


def settings() -> ExtractConfig:
    """The sidebar's current choice as one validated config (raises ValueError with a clear
    message; NothingChosen while no data is chosen yet). A data file smaller than N is sampled
    whole (`ui.datasets.fitted_sample`)."""
    model, data = model_spec(), data_spec()
    return ExtractConfig(
        model=model,
        data=data,
        sample=fitted_sample(data, _sample())[0],
        pooling=st.session_state.get("pooling", "mean"),
        max_length=_max_length(),
    )


def describe(cfg: ExtractConfig, sample: bool = True) -> str:
    """One line naming what a page shows: model · data · sample · pooling · max length."""
    parts = [f"**{cfg.model.name}**", f"**{data_label(cfg.data.name)}**"]
    if sample:
        parts.append(f"N = {cfg.sample.n:,} (seed {cfg.sample.seed})")
        parts.append(f"{cfg.pooling} pooling")
    parts.append(f"max length {cfg.max_length}")
    return " · ".join(parts)
