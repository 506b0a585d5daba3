"""How page tests start the app: on a tiny in-process model, a small N, an isolated cache.

at = make_app(tiny_bert_dir, monkeypatch)        # fixture values from tests/conftest.py
open_page(at, "views/layers.py")
assert not at.exception
"""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent


def make_app(model_dir: Path, monkeypatch, n: int = 40, data: str | None = None) -> AppTest:
    monkeypatch.setenv("TUNESCOPE_MODEL", str(model_dir))
    monkeypatch.setenv("TUNESCOPE_N", str(n))
    if data is not None:
        monkeypatch.setenv("TUNESCOPE_DATA", data)
    return AppTest.from_file(str(ROOT / "ui" / "dashboard" / "app.py"), default_timeout=180)


def open_page(at: AppTest, page: str) -> AppTest:
    """Run the app once (navigation must exist), then switch to `page` and run it."""
    at.run()
    at.switch_page(page)
    return at.run()


def open_tab(at: AppTest, key: str, label: str) -> AppTest:
    """Choose a page's tab, as a click does (the browser writes it into the link too), and
    rerun: only the chosen tab's content runs."""
    at.session_state[key] = label
    at.query_params[key] = label
    return at.run()


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error] + [str(e.value) for e in at.exception]


def browser_writes_link(at: AppTest, *keys: str) -> AppTest:
    """What the browser does and AppTest does not: write bound widgets' values (``bind=
    "query-params"``) into the address as they change. Without it, AppTest's address keeps a
    value the widget no longer has, and the next page switch reads it back."""
    for key in keys:
        value = at.session_state[key]
        at.query_params[key] = [str(v) for v in value] if isinstance(value, list) else str(value)
    return at


def record_pool(monkeypatch) -> list[str]:
    """Switch the compute pool on with a `compute` that records the name of each job it is sent
    and runs it here, its settings and result through pickle as a worker's travel (the layer
    tasks run here too). Returns the list it records into."""
    import copy
    import pickle

    import ui.compute_pool
    import ui.loaders
    from analysis.compute import IN_PROCESS

    sent: list[str] = []

    def travel(obj):
        """What a worker would get: ``obj`` must pickle; the copy is made as pickling makes it."""
        pickle.dumps(obj)
        return copy.deepcopy(obj)

    def compute(fn, *args, progress=None):
        sent.append(fn.__name__)
        return travel(fn(*travel(args), progress=progress or (lambda *a: None)))

    monkeypatch.setattr(ui.compute_pool, "enabled", lambda: True)
    monkeypatch.setattr(ui.compute_pool, "executor", lambda: IN_PROCESS)
    monkeypatch.setattr(ui.compute_pool, "compute", compute)
    monkeypatch.setattr(ui.loaders, "_LOADED", set())  # a fresh server: the extraction first
    return sent


def cancel_the_rest(at: AppTest, key: str) -> str:
    """Press a "Cancel the rest" button (`ui.cancel`) and confirm; returns the button's label."""
    button = at.button(key=key)
    label = button.label
    button.click().run()
    at.button(key=f"{key}_yes").click().run()
    return label
