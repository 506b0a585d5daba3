"""tunescope's dashboard from a checkout: ``streamlit run app.py`` serves what ``tunescope app``
serves. The app is ``ui/dashboard/app.py`` (it ships inside the package, so that an installed
tunescope serves it from any folder); this file runs it, and ``.streamlit/`` beside it is a link
to that app's settings (127.0.0.1 only, no usage statistics)."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parent / "ui" / "dashboard" / "app.py"))
