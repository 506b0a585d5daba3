"""Write docs/benchmarks.md from the benchmarks' own output: each one's last printed line.

``./tasks.sh bench [SCRIPT…]`` runs the benchmarks, keeps each one's output as
``LOGS/<script name>.log`` and then calls

    .venv/bin/python docs/tools/benchmarks_page.py LOGS

which records, for every log, its last non-empty line together with the machine it ran on and
that machine's limit — float64 ``X.T @ X`` at 8,192 × 1,024 on every usable core, measured here,
in the same session — in ``docs/benchmarks.json``, and rewrites ``docs/benchmarks.md`` from it.
A benchmark that was not run keeps its last recorded line. The page holds current figures only;
earlier ones are in git history (``git log -p docs/benchmarks.json``).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "benchmarks.json"
PAGE = ROOT / "docs" / "benchmarks.md"
LIMIT_SHAPE = (8192, 1024)

# What each benchmark is measured against (its goal); a script not listed shows "—".
GOALS = {
    "bench_callback.py": "the callback's own work ≈ 1× a plain Trainer step",
    "bench_class.py": "a prepared lesson: 30 students served, 0 errors, every step's page ≤ 2 s "
    "(the server's part), ≤ 3 GB; distinct settings: 30 sessions all served, 0 errors; first "
    "figure ≤ 2× alone; median ≤ 128 s; p95 ≤ 255 s; ≤ 3 GB",
    "bench_pool.py": "the sequential design decides with at most half the runs of the 10-seed grid",
    "bench_recommend.py": "from a cold cache to a decided sentence within 30 min; a warm rerun "
    "in seconds",
    "bench_extract.py": "≥ 10× a naive per-layer loop; ≤ 10 % over a bare forward; a cached "
    "request ≪ 1 s",
    "bench_finetune.py": "(1, ℓ*, ℓ*) ≈ ℓ*/L of full fine-tuning's step time; heads ≤ full; "
    "our step ≤ the Trainer's",
    "bench_first_figure.py": "first Layers figure < 10 s cold, < 1 s warm",
    "bench_heads.py": "≤ 2× a bare forward; memory independent of n",
    "bench_layer_claims.py": "≤ 3× the CPU time of the one-sample claims",
    "bench_layer_metrics.py": "a few seconds for a table; sharing layers between processes "
    "faster than one process, the same table",
    "bench_layer_repeats.py": "`--repeats 5` ≤ 5× one table of metrics",
    "bench_nu.py": "≥ 50× the textbook route; equal to 1e-8",
    "bench_packing.py": "≥ 1.5× the runs per hour of one run on every core",
    "bench_probe.py": "the streamed table of 100,000 × 25 × 1,024 ≤ 60 s",
    "bench_ray.py": "a report: a one-machine cluster gains only runs at once",
    "bench_scale.py": "extraction ≤ 1.1× a bare forward; ≤ 3 GB; streamed metrics of "
    "100,000 × 25 × 1,024 ≤ 60 s",
    "bench_subspace.py": "seconds; peak memory a small multiple of one layer's W",
}

HEADER = """\
<!-- Written by docs/tools/benchmarks_page.py (`./tasks.sh bench`) from docs/benchmarks.json:
do not edit by hand. -->

# Benchmarks

Each benchmark in `bench/` measures what it compares **side by side in one run** and prints its
figures; this page shows the **last line** each one printed the last time it ran, the machine it
ran on, and what it is measured against: its goal, and the machine's own limit — float64
`X.T @ X` at 8,192 × 1,024 on every usable core (counted as 2 · 8,192 · 1,024² operations),
measured in the same session. Speeds are to be read against that limit, never as absolute
seconds on an unknown machine.

`./tasks.sh bench` runs every benchmark and rewrites this page; `./tasks.sh bench
bench/bench_nu.py` runs one and updates its row. Only current figures are here: earlier ones are
in git history (`git log -p docs/benchmarks.json`) and in the commit messages that changed them.
Why the slow parts are built as they are is on [Performance](explanation/performance.md).
"""


def first_docstring_line(script: Path) -> str:
    """What the benchmark compares: its module docstring's first sentence (read, not imported)."""
    try:
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError):
        return ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".") + "." if first else ""


def last_line(log: Path) -> str | None:
    lines = [
        line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
    ]
    lines = [line for line in lines if line]
    return lines[-1] if lines else None


def limit_gflops(repeats: int = 3) -> float:
    """float64 X.T @ X at 8,192 × 1,024, best of ``repeats``, on numpy's default threads."""
    import numpy as np

    x = np.random.default_rng(0).standard_normal(LIMIT_SHAPE)
    x.T @ x  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.T @ x
        best = min(best, time.perf_counter() - start)
    n, d = LIMIT_SHAPE
    return 2 * n * d * d / best / 1e9


def machine() -> str:
    """One line: CPU model, usable cores, memory, GPU."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f"{mem_kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "? GiB"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except ImportError:
        pass
    return f"{cpu}, {cores} cores, {memory}, {gpu}"


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "?"
    return done.stdout.strip() or "?"


def record(logs: Path, data: dict, limit: float, where: str, today: str, head: str) -> list[str]:
    """Add each log's last line to ``data`` (script name → entry); the scripts recorded."""
    recorded = []
    for log in sorted(logs.glob("*.log")):
        line = last_line(log)
        if line is None:
            continue
        script = f"{log.stem}.py"
        data[script] = {
            "line": line,
            "date": today,
            "commit": head,
            "machine": where,
            "limit_gflops": round(limit, 1),
        }
        recorded.append(script)
    return recorded


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render(data: dict, bench_dir: Path) -> str:
    """The page: the machines, then one row per benchmark script (recorded or not)."""
    scripts = sorted({p.name for p in bench_dir.glob("bench_*.py")} | set(data))
    machines: dict[tuple[str, object], str] = {}
    for script in scripts:
        entry = data.get(script)
        if entry:
            key = (entry["machine"], entry.get("limit_gflops"))
            machines.setdefault(key, f"M{len(machines) + 1}")
    lines = [HEADER, "## Machines\n", "| | machine | limit: float64 `X.T @ X` |", "|---|---|---|"]
    for (where, limit), name in machines.items():
        shown = "not recorded" if limit is None else f"{limit} GFLOP/s"
        lines.append(f"| {name} | {_cell(where)} | {shown} |")
    lines += [
        "",
        "## Figures\n",
        "| benchmark | what it compares | last line, as printed | goal | measured |",
        "|---|---|---|---|---|",
    ]
    for script in scripts:
        entry = data.get(script)
        what = _cell(first_docstring_line(bench_dir / script))
        goal = _cell(GOALS.get(script, "—"))
        if entry:
            key = (entry["machine"], entry.get("limit_gflops"))
            shown = f"`{entry['line']}`"
            when = f"{machines[key]}, {entry['date']}, `{entry['commit']}`"
            if entry.get("note"):
                when += f" ({_cell(entry['note'])})"
        else:
            shown, when = "not recorded yet", "—"
        lines.append(f"| `{script}` | {what} | {shown} | {goal} | {when} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="a folder of <script name>.log files")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--bench", type=Path, default=ROOT / "bench")
    args = parser.parse_args(argv)
    data = json.loads(args.data.read_text(encoding="utf-8")) if args.data.exists() else {}
    if any(args.logs.glob("*.log")):
        today = dt.date.today().isoformat()
        recorded = record(args.logs, data, limit_gflops(), machine(), today, commit())
        which = "benchmark" if len(recorded) == 1 else "benchmarks"
        print(f"recorded the last line of {len(recorded)} {which}: {', '.join(recorded)}")
    args.data.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    args.page.write_text(render(data, args.bench), encoding="utf-8")
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
