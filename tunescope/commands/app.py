"""``app``: start the dashboard (``streamlit run`` on the installed ``ui/dashboard/app.py``).

The dashboard's script, its pages and its Streamlit settings ship inside the ``ui`` package, so
``tunescope app`` serves the same dashboard from any working folder. Streamlit reads the settings
beside the script (``ui/dashboard/.streamlit/config.toml``: 127.0.0.1:8501 only, no usage
statistics) wherever it is started. Options after ``app`` go to ``streamlit run`` (e.g.
``tunescope app --server.port 8502``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

NAME = "app"
HELP = "start the dashboard on http://127.0.0.1:8501 (options go to `streamlit run`)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(passed_on=[])  # every option after `app` goes on to `streamlit run`
    parser.epilog = "Any other option is passed on to `streamlit run`, e.g. --server.port 8502."


def dashboard_script() -> Path:
    """The dashboard's main script, ``ui/dashboard/app.py`` of the ``ui`` package Python finds.

    Found without importing ``ui`` (the library never imports the Streamlit side)."""
    spec = importlib.util.find_spec("ui")
    if spec is None or spec.origin is None:
        raise ValueError("The dashboard's package `ui` is not installed: `pip install .` it.")
    return Path(spec.origin).resolve().parent / "dashboard" / "app.py"


def command() -> list[str]:
    """The command line that starts the dashboard."""
    script = dashboard_script()
    if not (script.is_file() and (script.parent / "views").is_dir()):
        raise ValueError(
            f"The dashboard's files (app.py, views/) are missing from {script.parent}: "
            "reinstall tunescope (`pip install .`)."
        )
    if importlib.util.find_spec("streamlit") is None:
        raise ValueError("Streamlit is not installed here: `pip install .` installs it.")
    # -P (Python 3.11+): the working folder stays off sys.path, so a file or folder there named
    # like a module (analysis/, datasets.py) is never imported in its place.
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe_path, "-m", "streamlit", "run", str(script)]


def run(args: argparse.Namespace) -> int:
    argv = [*command(), *args.passed_on]
    os.execv(argv[0], argv)
    return 0  # not reached: this process became Streamlit
