"""Where the Fine-tune page's runs train: this machine, or a Ray cluster — with the cluster's
CPUs, GPUs and how many runs it trains at once."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from analysis.config import help_of
from analysis.runs.executor import LOCAL_WORKERS, RAY, ExecutorChoice
from analysis.words import counted
from ui.loaders import show_error

WHERE = {LOCAL_WORKERS: "this machine", RAY: "a Ray cluster"}
KEEP = "session"  # like the launch form's fields, the choice stays across page switches
CHOICE_KEY = "executor_choice"  # the last choice, for pages that queue without the picker


def executor_picker(root: Path) -> ExecutorChoice:
    """The radio "Train on" (outside the launch form, so the cluster shows as soon as it is
    picked) and, for Ray, the address and CPUs per run; all three stay across page switches. A
    cluster that cannot be reached shows its message here; queueing then refuses with the same
    message."""
    kind = st.radio(
        "Train on",
        list(WHERE),
        format_func=WHERE.get,
        horizontal=True,
        key="ft_executor",
        persist_state=KEEP,
        help=help_of(ExecutorChoice, "executor"),
    )
    if kind == LOCAL_WORKERS:
        st.session_state[CHOICE_KEY] = ExecutorChoice()
        return ExecutorChoice()
    left, right = st.columns([3, 1])
    address = left.text_input(
        "Ray cluster at",
        value=os.environ.get("RAY_ADDRESS", ""),
        key="ft_ray_address",
        persist_state=KEEP,
        placeholder="HOST:6379 — blank: a local Ray cluster on this machine",
        help=help_of(ExecutorChoice, "ray_address"),
    )
    cpus = right.number_input(
        "CPUs per run", 1, 1024, 1, key="ft_ray_cpus", persist_state=KEEP,
        help=help_of(ExecutorChoice, "cpus_per_run"),
    )  # fmt: skip
    choice = ExecutorChoice(RAY, address.strip() or None, int(cpus))
    try:
        st.caption(cluster_summary(choice.ray_address, choice.cpus_per_run, str(root)))
    except ValueError as exc:
        show_error(exc)
    st.session_state[CHOICE_KEY] = choice
    return choice


def chosen_executor() -> ExecutorChoice:
    """The "Train on" choice last made on a page that shows `executor_picker` (default: this
    machine), for a page that queues runs without drawing the picker itself."""
    return st.session_state.get(CHOICE_KEY) or ExecutorChoice()


@st.cache_data(ttl=30, show_spinner="Asking the Ray cluster…")
def cluster_summary(address: str | None, cpus_per_run: int, root: str) -> str:
    """One line: the live Ray worker's view of its cluster when it serves this address, else a
    fresh look (`probe_cluster`, from a short-lived process). Errors are not cached."""
    from analysis.runs.ray_executor import probe_cluster, read_status, resolve_address
    from analysis.runs.worker import worker_pid

    status = read_status(root) if worker_pid(root, RAY) else None
    if status and status.get("address") == resolve_address(address) and "slots" in status:
        return (
            f"Ray cluster at {status['address']}: {counted(status['nodes'], 'node')}, "
            f"{counted(status['cpus'], 'CPU')}, {counted(status['gpus'], 'GPU')} → trains "
            f"{counted(status['slots'], 'run')} "
            f"at once; {status['in_flight']} in flight now (Ray worker pid {status['pid']})."
        )
    info = probe_cluster(address, cpus_per_run)
    info.check()
    return f"Ray cluster at {info.describe()}."
