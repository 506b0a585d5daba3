"""The recommendation from a cold cache to its sentence, with the sequential design, and a warm
rerun beside it.

    .venv/bin/python bench/bench_recommend.py [--limit-min 30] [--cache DIR] [--model minilm]
        [--data movie-snippets]

(1) **Cold.** A fresh cache folder (or ``--cache``): `tunescope recommend --compare --wait` on
    the built-in demo (minilm, movie snippets, the default budget and design; ``--data trec6``
    asks the same of data the defaults were not tuned on), in a fresh
    process, stopped after ``--limit-min`` minutes if the answer is not final by then (its runs
    are cancelled). Reported: the wall time, the analyses' and costs' share of it, the runs
    trained, and what the sentence says (decided or not, and what).
(2) **Warm.** The same `recommend` again (no ``--compare``): every analysis and cost from the
    cache, the comparison from the runs database.

The last line is ``recommend: data=… cold_s=… analyses_s=… runs=… decided=<branch> warm_s=…``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def recommend(cache: Path, question: list[str], extra: list[str], limit_s: float | None) -> dict:
    """`tunescope recommend` in a fresh process; its JSON, wall time and printed lines."""
    out = cache / f"rec-{len(extra)}-{time.time():.0f}.json"
    command = [sys.executable, "-m", "tunescope", "recommend", *question,
               "--cache", str(cache), "--json", str(out), *extra]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=limit_s)
        stopped = False
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate()
        stopped = True
    wall = time.perf_counter() - start
    payload = json.loads(out.read_text()) if out.is_file() else None
    return {"wall_s": wall, "stdout": stdout, "stderr": stderr, "json": payload,
            "stopped": stopped}  # fmt: skip


def analyses_seconds(stdout: str) -> float | None:
    """The "(analyses and costs in N s)" a recommend prints."""
    import re

    found = re.search(r"analyses and costs in (\d+) s", stdout)
    return float(found.group(1)) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-min", type=float, default=30.0, help="stop the cold run here")
    parser.add_argument("--cache", default=None, help="cache folder (default: a fresh one)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="movie-snippets")
    args = parser.parse_args()
    question = ["--model", args.model, "--data", args.data]
    print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory(prefix="tsbench-recommend-") as tmp:
        cache = Path(args.cache or tmp)
        cold = recommend(cache, question, ["--compare", "--wait"], 60 * args.limit_min)
        if cold["stopped"]:
            subprocess.run([sys.executable, "-m", "tunescope", "runs", "cancel", "--sweep",
                            _sweep(cache)], cwd=ROOT, capture_output=True)  # fmt: skip
        analyses = analyses_seconds(cold["stdout"])
        warm = recommend(cache, question, [], None)
        payload = warm["json"] or {}
        said = payload.get("recommendation", {})
        runs = payload.get("runs_trained", 0)
        print(cold["stdout"][-4000:])
        print(f"cold: {cold['wall_s']:.0f} s" + (" (stopped at the limit)" if cold["stopped"]
                                                  else "") + f", analyses and costs {analyses} s")  # fmt: skip
        print(f"runs trained: {runs}; the sentence: {said.get('sentence')}")
        print(f"warm: {warm['wall_s']:.1f} s (a fresh process: imports, the model, the caches)")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        print(
            f"recommend: data={args.data} cold_s={cold['wall_s']:.0f} analyses_s={analyses} "
            f"runs={runs} decided={said.get('branch')} warm_s={warm['wall_s']:.1f}"
        )


def _sweep(cache: Path) -> str:
    """The sweep id of the comparison the cold run queued (its newest experiment)."""
    import sqlite3

    with sqlite3.connect(cache / "runs.sqlite") as conn:
        row = conn.execute("SELECT id FROM experiments ORDER BY created DESC LIMIT 1").fetchone()
    return row[0] if row else ""


if __name__ == "__main__":
    main()
