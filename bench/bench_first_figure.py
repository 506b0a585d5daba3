"""A newcomer's first Layers figure: cold (fresh cache, fresh process) and warm, default settings.

    .venv/bin/python bench/bench_first_figure.py [--n 1000]

Streamlit's AppTest runs the real app (``ui/dashboard/app.py``) with a fresh cache folder and the sidebar's
defaults (MiniLM, movie snippets, N = ``--n``, R = 50 bootstrap repeats): the home page first
(not timed), then the Layers page. Timed from the switch to the Layers page: when the metrics
figure is first drawn (the model load, the extraction and the layer table before it), when the
repeats' bands are drawn in its place, and when the page's script run ends (every other figure
of the page too). Then the same page again in the same process (warm: every computation served
from the caches). The last line is ``first figure: cold_s=… bands_s=… page_s=… warm_s=…``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="examples (default: the sidebar's)")
    parser.add_argument(
        "--cache", default=None,
        help="a cache folder to start from (e.g. one `tunescope lesson prepare` filled: the "
        "first figure of a set-up machine); default: a fresh, empty one",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsbench-first-") as tmp:
        os.environ["TUNESCOPE_CACHE"] = args.cache or tmp
        if args.n:
            os.environ["TUNESCOPE_N"] = str(args.n)
        from streamlit.testing.v1 import AppTest

        from ui.figures import layers as figures

        drawn: list[tuple[str, float]] = []
        draw = figures.metrics_figure

        def timed(df, l_star, probe_label="probe", se=None):
            drawn.append(("bands" if se is not None else "metrics", time.perf_counter()))
            return draw(df, l_star, probe_label, se)

        figures.metrics_figure = timed
        at = AppTest.from_file(str(ROOT / "ui" / "dashboard" / "app.py"), default_timeout=1800)
        at.run()
        at.switch_page("views/layers.py")
        start = time.perf_counter()
        at.run()
        page = time.perf_counter() - start
        assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
        first = next(t for kind, t in drawn if kind == "metrics") - start
        bands = next(t for kind, t in drawn if kind == "bands") - start
        start = time.perf_counter()
        at.run()
        warm = time.perf_counter() - start
    load = os.getloadavg()
    print(
        f"Layers page, default settings, fresh cache: metrics figure at {first:.1f} s, bands at "
        f"{bands:.1f} s, page done at {page:.1f} s; warm rerun {warm:.2f} s; load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"first figure: cold_s={first:.1f} bands_s={bands:.1f} page_s={page:.1f} warm_s={warm:.2f}"
    )


if __name__ == "__main__":
    main()
