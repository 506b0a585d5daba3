"""The cached loaders every page uses: the model, the data, the pooled states; and the server's
warm-up (`warm_up`: the compute workers, and this process's model).

The model is loaded once per process (st.cache_resource) and never trained. Pooled states are
kept in a small in-process LRU on top of the disk cache, so moving a slider never recomputes them.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import logging
import threading
from pathlib import Path

import streamlit as st

from analysis.cache import canonical_json
from analysis.config import DataSpec, ExtractConfig, ModelSpec, to_dict
from ui import compute_pool
from ui.datasets import NothingChosen
from ui.jobs import extract_job, warm_tasks, warm_worker
from ui.memo import ProgressMemo

_LOADED: set[tuple[str, bool]] = set()  # models this process has loaded (get_model: no wait)


@st.cache_resource(show_spinner="Loading the model…", max_entries=3)
def _load_model(name: str, trust_remote_code: bool):
    from analysis.models import load_model

    loaded = load_model(ModelSpec(name, trust_remote_code=trust_remote_code))
    _LOADED.add((name, trust_remote_code))
    return loaded


def get_model(spec: ModelSpec):
    """The process-wide shared LoadedModel (never trained: fine-tuning copies it)."""
    return _load_model(spec.name, spec.trust_remote_code)


def model_loaded(spec: ModelSpec) -> bool:
    """Whether this process has loaded ``spec`` already (a hint: an evicted model reloads)."""
    return (spec.name, spec.trust_remote_code) in _LOADED


@st.cache_resource(show_spinner="Loading the dataset…", max_entries=8)
def _load_data(spec_json: str):
    from analysis.data import load_data

    return load_data(DataSpec(**json.loads(spec_json)))


def get_data(spec: DataSpec):
    return _load_data(canonical_json(to_dict(spec)))


COLUMNS_HINT = (
    " Choose the columns in the sidebar: **Columns (text, label)** below the Dataset picker "
    "lists the file's own columns."
)

_STATES: ProgressMemo = ProgressMemo(max_entries=6)


def get_states(cfg: ExtractConfig, label: str = "Extracting hidden states"):
    """Pooled states of every layer (analysis.extract.LayerStates), with a progress bar on a miss.

    The extraction runs in a compute worker (`ui.compute_pool`), which writes the states into the
    disk cache; this process then reads them from there, memory-mapped."""
    from analysis.extract import extract_states, states_cached

    extracted = []  # whether a worker extracted them (the page then read them from the cache)

    def load(progress):
        if compute_pool.enabled() and not model_loaded(cfg.model):
            # This process has not loaded the model yet (a fresh server, whose warm-up thread is
            # loading it now): the worker, which has it, checks the disk cache itself and
            # extracts on a miss, instead of the page waiting for its own model first.
            extracted.append(not compute_pool.compute(extract_job, cfg, progress=progress))
            loaded = get_model(cfg.model)
        else:
            loaded = get_model(cfg.model)
            if compute_pool.enabled() and not states_cached(cfg, loaded):
                extracted.append(not compute_pool.compute(extract_job, cfg, progress=progress))
        return extract_states(cfg, progress=progress, loaded=loaded)

    def served(states) -> bool:
        return bool(states.meta.get("cache_hit")) and not any(extracted)

    return _STATES.get(canonical_json(to_dict(cfg)), label, load, served=served)


_WARMED = False
_WARM_LOCK = threading.Lock()
_WARM_THREAD = "tunescope-warm-model"


def warm_up(model: str | None = None) -> None:
    """Start the server's compute workers in the background, the first loading ``model`` (the
    sidebar's default), and load ``model`` into this process's model cache too (app.py calls it
    on every script run; only the first call does anything). The two first loads of the model
    then run side by side instead of one after the other."""
    global _WARMED
    with _WARM_LOCK:
        if _WARMED:
            return
        _WARMED = True
    if compute_pool.enabled():
        compute_pool.pool().warm((warm_worker, model), (warm_tasks,))
        if model:
            threading.Thread(
                target=_warm_here, args=(model,), daemon=True, name=_WARM_THREAD
            ).start()


class _NoContextWarning(logging.Filter):
    """Drops Streamlit's "missing ScriptRunContext" warning for the warm-up thread, which uses
    the model cache outside any page on purpose (the warning is meant for threads that draw)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != _WARM_THREAD


def _warm_here(model: str) -> None:
    """Load ``model`` into this process's shared model cache, so that the first page finds it
    there. That page does not wait for it to extract: its extraction goes to the worker while
    this load runs (`get_states`)."""
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        _NoContextWarning()
    )
    with contextlib.suppress(Exception):
        get_model(ModelSpec(model))
    _import_pages()


def _import_pages() -> None:
    """Import the modules the pages import (their own, scipy's statistics, plotly's figures…),
    so that the first visit to a page does not pay for them: a prepared lesson's first step
    then draws as fast as its later ones. A module that fails to import is left to its page,
    which shows the error where it belongs."""
    views = Path(__file__).resolve().parent / "dashboard" / "views"
    for script in sorted(views.glob("*.py")):
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])  # fmt: skip
            for name in names:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)


def show_error(exc: BaseException) -> None:
    """A clear message for bad input; the app keeps serving. Nothing chosen yet is guidance,
    not an error."""
    if isinstance(exc, NothingChosen):
        st.info(str(exc), icon=":material/arrow_back:")
        return
    text = str(exc) or type(exc).__name__
    if " column " in text and ("not found in" in text or "Choose the" in text):
        text += COLUMNS_HINT
    st.error(text, icon="⚠️")
