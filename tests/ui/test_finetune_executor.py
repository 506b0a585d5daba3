"""AppTest of the Fine-tune page's executor choice: this machine or a Ray cluster."""

from __future__ import annotations

import contextlib
import socket
import threading

from apptest_utils import errors, make_app, open_page

import analysis.runs.worker
from analysis.runs.db import RunsDB
from analysis.runs.executor import ExecutorChoice


def widget(elements, label: str):
    return next(w for w in elements if w.label == label)


def fill_form(at, steps: int, seeds: str = "0") -> None:
    """One small layers run per seed (the form's other fields keep their defaults)."""
    widget(at.radio, "What to launch").set_value("One run per seed")
    widget(at.selectbox, "Method (one run)").set_value("layers")
    for label, value in (("ℓ_bottom", 1), ("ℓ_top", 1), ("ℓ_cls", 2), ("Steps", steps)):
        widget(at.number_input, label).set_value(value)
    widget(at.text_input, "Seeds").set_value(seeds)


def closed_port() -> str:
    with socket.socket() as sock:  # a port nobody listens on (bound, then released)
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_ray_choice_shows_the_cluster_and_an_unreachable_one_queues_nothing(
    tiny_bert_dir, monkeypatch
):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert widget(at.radio, "Train on").value == "local"
    widget(at.radio, "Train on").set_value("ray").run()
    assert not errors(at), errors(at)
    caption = next(c.value for c in at.caption if "Ray cluster at" in c.value)
    assert "a local Ray cluster on this machine: 1 node," in caption
    assert "at once (1 CPU each)" in caption

    address = closed_port()
    widget(at.text_input, "Ray cluster at").set_value(address).run()
    assert any(f"Cannot reach the Ray cluster at {address}" in e for e in errors(at))
    fill_form(at, steps=2)
    widget(at.button, "Queue").click().run()
    assert not at.exception
    assert any(f"Cannot reach the Ray cluster at {address}" in e for e in errors(at))
    assert RunsDB().list_runs().empty  # nothing queued, nothing lost


def test_a_port_that_is_not_ray_is_one_page_message_and_queues_nothing(tiny_bert_dir, monkeypatch):
    """An open port that answers HTTP/1 (a web server given by mistake): the handshake says it
    is not a Ray cluster, on the page, and the Queue button queues nothing."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        stop = threading.Event()

        def answer():
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except (TimeoutError, OSError):
                    continue
                with conn, contextlib.suppress(OSError):
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
            widget(at.radio, "Train on").set_value("ray").run()
            widget(at.text_input, "Ray cluster at").set_value(address).run()
            said = f"{address} is not a Ray cluster: it answers in HTTP/1"
            assert any(said in e for e in errors(at)), errors(at)
            fill_form(at, steps=2)
            widget(at.button, "Queue").click().run()
            assert not at.exception
            assert any(said in e for e in errors(at)), errors(at)
        finally:
            stop.set()
            thread.join(timeout=5)
    assert RunsDB().list_runs().empty


def test_queue_passes_the_ray_choice_to_the_workers(tiny_bert_dir, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started: list[ExecutorChoice] = []

    def fake_start(choice, root=None, idle_timeout=None):
        started.append(choice)
        return "Ray worker pid 4242, on a local Ray cluster on this machine"

    monkeypatch.setattr(analysis.runs.worker, "start_workers", fake_start)
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    widget(at.radio, "Train on").set_value("ray").run()
    widget(at.number_input, "CPUs per run").set_value(2).run()
    fill_form(at, steps=2, seeds="0,1")
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    assert started[0] == ExecutorChoice("ray", None, cpus_per_run=2)  # (then the live view's)
    message = next(s.value for s in at.success if "Queued 2 runs" in s.value)
    assert "on the Ray cluster" in message and "pid 4242" in message
    assert len(RunsDB().list_runs(status="queued")) == 2


def test_the_executor_choice_stays_across_page_switches(tiny_bert_dir, monkeypatch):
    import ui.finetune.executor

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(  # no cluster is asked: only the choice is under test
        ui.finetune.executor, "cluster_summary", lambda address, cpus, root: f"at {address}"
    )
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    widget(at.radio, "Train on").set_value("ray").run()
    widget(at.text_input, "Ray cluster at").set_value("10.0.0.7:6379").run()
    widget(at.number_input, "CPUs per run").set_value(3).run()
    assert not errors(at), errors(at)
    at.switch_page("views/data.py").run()
    at.switch_page("views/finetune.py").run()
    assert widget(at.radio, "Train on").value == "ray"
    assert widget(at.text_input, "Ray cluster at").value == "10.0.0.7:6379"
    assert widget(at.number_input, "CPUs per run").value == 3
