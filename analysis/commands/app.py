"""``app``: start the dashboard (``streamlit run app.py``) from the checkout tunescope runs from.

``tunescope app`` is ``./tasks.sh app`` without the set-up: Streamlit reads the checkout's
``.streamlit/config.toml`` (127.0.0.1:8501 only, no usage statistics), so it runs in that folder.
Options after ``app`` go to ``streamlit run`` (e.g. ``tunescope app --server.port 8502``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

NAME = "app"
HELP = "start the dashboard on http://127.0.0.1:8501 (options go to `streamlit run`)"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(passed_on=[])  # every option after `app` goes on to `streamlit run`
    parser.epilog = "Any other option is passed on to `streamlit run`, e.g. --server.port 8502."


def command(root: Path = PROJECT_ROOT) -> list[str]:
    """The command line that starts the dashboard of the checkout at ``root``."""
    script = root / "app.py"
    if not (script.is_file() and (root / "views").is_dir()):
        raise ValueError(
            f"The dashboard's files (app.py, views/) are not beside the installed package in "
            f"{root}: install tunescope from its checkout with `pip install -e .`."
        )
    if importlib.util.find_spec("streamlit") is None:
        raise ValueError("Streamlit is not installed here: `pip install -e .` installs it.")
    return [sys.executable, "-m", "streamlit", "run", str(script)]


def run(args: argparse.Namespace) -> int:
    argv = [*command(), *args.passed_on]
    os.chdir(PROJECT_ROOT)  # its .streamlit/config.toml: loopback only
    os.execv(argv[0], argv)
    return 0  # not reached: this process became Streamlit
