"""Links that reproduce a view: the sidebar settings and each page's main choice live in the URL.

Streamlit keeps a widget and a query parameter in step when the widget is made with
``bind="query-params"`` (its key is the parameter's name): choosing a value writes it into the
address bar, and opening an address sets the widget. A bound picker writes the *label* of its
choice, though, so pickers whose labels are not their values (``data``: an upload is shown by
its file name; ``run``: a run by its method and score; ``example``: by its text) are kept in step
here instead (`take_link` before the widget, `publish` after it); Streamlit clears such
parameters on a page switch, so they stay page-local like the bound ones of a page.

Parameters: ``model``, ``data``, ``text_col``, ``pair_col``, ``label_col``, ``n``, ``seed``,
``pooling``, ``max_length`` (the sidebar, on every page), and per page ``layer`` (Layers
picture; Heads), ``head`` and ``example`` (Heads), ``run`` (Subspaces, Runs: one parameter
name, but each page keeps its own choice, ``sub_run`` and ``runs_run``). A value equal to the
default is left out of the address. Trusting a model's own code is never taken from a link.

Streamlit silently drops a value its widget cannot take. Every parameter is therefore checked
here first, on the first run of a session (when a link is opened), before its widget exists: a
bad one is removed from the address and the script reruns at once (a bound widget takes its
first value from the address the run started with), so the widget starts on its default; a note
in the sidebar says what was wrong and what is shown instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from analysis.config import POOLINGS

BIND = "query-params"
NOTES = "link_notes"
_FIRST_RUN = "link_first_run"
_RERUN = "link_rerun"
N_RANGE = (2, 100_000)
SEED_RANGE = (0, 2**31 - 1)
MAX_LENGTH_RANGE = (8, 512)


def whole(text: str, low: int, high: int) -> int | None:
    """``text`` as a whole number within [low, high], else None."""
    try:
        value = int(text.strip())
    except (ValueError, AttributeError):
        return None
    return value if low <= value <= high else None


def start_session() -> bool:
    """Mark the first script run of a session (the one that opened the link, and the rerun that
    drops its bad parameters); True on it."""
    state = st.session_state
    first = _FIRST_RUN not in state or bool(state.pop(_RERUN, False))
    if _FIRST_RUN not in state:
        state[NOTES] = []
    state[_FIRST_RUN] = first
    return first


def first_run() -> bool:
    return bool(st.session_state.get(_FIRST_RUN))


def note(text: str) -> None:
    st.session_state.setdefault(NOTES, []).append(text)


def drop(name: str, why: str, instead: str) -> None:
    """Remove parameter ``name`` from the address and note why; the caller reruns (`rerun`)."""
    raw = st.query_params.get(name, "")
    del st.query_params[name]
    note(f"The link's {name}={raw!r} {why}: showing {instead}.")
    st.session_state[_RERUN] = True


def rerun_if_dropped() -> None:
    """Rerun at once when a parameter was dropped, so that its widget starts on the default."""
    if st.session_state.get(_RERUN):
        st.rerun()


def check_sidebar_link(
    check_model: Callable[[str], str | None],
    check_data: Callable[[str], str | None],
    tidy_data: Callable[[str], str],
    default_n: int,
) -> None:
    """On a session's first run, validate the sidebar's parameters (before its widgets exist).

    check_model / check_data: return why a value is refused, or None when it is fine;
    tidy_data: the picker's own spelling of a data value (``data/amazon.csv`` → ``amazon.csv``).
    """
    if not first_run():
        return
    params = st.query_params
    if "model" in params and (why := check_model(params["model"])):
        drop("model", why, "the default model")
    if "data" in params and (why := check_data(params["data"])):
        drop("data", why, "the default data set")
    elif "data" in params:
        st.session_state["data"] = tidy_data(params["data"])  # the picker is not bound
    numbers = {
        "n": (N_RANGE, f"N = {default_n:,}", "is not a whole number of examples from 2 to 100,000"),
        "seed": (SEED_RANGE, "seed 0", "is not a whole number ≥ 0"),
        "max_length": (
            MAX_LENGTH_RANGE,
            "128 tokens",
            "is not a whole number of tokens from 8 to 512",
        ),
    }
    for name, ((low, high), instead, why) in numbers.items():
        if name in params and whole(params[name], low, high) is None:
            drop(name, why, instead)
    if "pooling" in params and params["pooling"] not in POOLINGS:
        drop("pooling", f"is not one of {', '.join(POOLINGS)}", "mean pooling")
    rerun_if_dropped()


def check_page_link(name: str, valid: Callable[[str], bool], why: str, instead: str) -> None:
    """On a session's first run, validate one of this page's parameters before its widget is
    made; a bad one is removed (the run starts again) and noted in the sidebar."""
    if first_run() and name in st.query_params and not valid(st.query_params[name]):
        drop(name, why, instead)
        rerun_if_dropped()


def take_link(
    key: str, parse: Callable[[str], Any], why: str, instead: str, param: str | None = None
) -> None:
    """Before an unbound widget keyed ``key``, on a session's first run: the link's value of
    ``param`` (default: ``key``; ``parse`` returns it, or None when it is bad) becomes the
    widget's value; a bad one is removed from the address and noted.

    A separate ``param`` lets pages share a parameter name (``run``) without sharing the widget:
    each page keeps its own choice in the session."""
    param = param or key
    if not first_run() or param not in st.query_params:
        return
    value = parse(st.query_params[param])
    if value is None:
        drop(param, why, instead)
        st.session_state.pop(_RERUN, None)  # an unbound widget needs no fresh run…
        st.warning(st.session_state[NOTES][-1], icon=":material/link_off:")  # …so say it here
    else:
        st.session_state[key] = value


def publish(param: str, value: Any, default: Any = None) -> None:
    """After an unbound widget: its value into the address as ``param`` (left out when it is the
    default)."""
    if value is None or value == default:
        if param in st.query_params:
            del st.query_params[param]
    elif st.query_params.get(param) != str(value):
        st.query_params[param] = str(value)


def show_notes(container) -> None:
    """The notes about the opened link, until dismissed."""
    notes = st.session_state.get(NOTES) or []
    if not notes:
        return
    for text in notes:
        container.warning(text, icon=":material/link_off:")
    if container.button("Dismiss", key="link_notes_dismiss"):
        st.session_state[NOTES] = []
        st.rerun()
