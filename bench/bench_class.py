"""A class on one server (issues 22, 31): 30 browser sessions at once, each on settings of its
own, or all following a prepared lesson.

    .venv/bin/python bench/bench_class.py [--sessions 30] [--n 300] [--timeout 1200]
        [--slots K] [--no-runs] [--in-process] [--baseline]
        [--mode distinct|lesson|both] [--lesson papers-story] [--prepared-cache DIR]

**The class follows a prepared lesson** (``--mode lesson``): the lesson's steps that need no
fine-tuning runs (a built-in lesson, or a lesson file) are prepared with ``tunescope lesson
prepare`` into the server's cache before it starts (untimed, reported; ``--prepared-cache`` keeps
that cache for the next run); then a presenter opens the lesson and ``--sessions`` students open
its link in follow mode, and the presenter moves on once every student shows the step. Reported:
students who saw every step, errors, the server's part of every step's page (its script run,
the compute log's ``view`` to ``drawn``), what was computed during the class (nothing, when
prepared), the browsers' part (the presenter's click to each student's page at the next step)
and the peak RSS. The last line is ``lesson-class: sessions=… steps=… served=… errors=…
drawn_median_s=… drawn_p95_s=… drawn_max_s=… computed=… loaded=… browser_median_s=…
browser_max_s=… peak_rss_mb=… prepare_s=…``. ``--mode both`` runs it, then the class below, and
ends with both lines joined by "; ".

**The distinct-settings class** (the default):

One dashboard server on a free loopback port with a fresh cache (nothing is shared with earlier
runs), driven by Playwright in Debian's chromium (never a downloaded browser), loopback only. The
browsers run at the lowest CPU priority (`niced_chromium`): they stand in for the students' own
machines, and must not take the server's cores.

1. **Alone.** A first session loads the model (not timed), then one session opens the Layers page
   on settings nobody else uses: its time to the first figure is *one computation alone*.
2. **The class.** ``--sessions`` browser contexts open at once, each with its own settings (data
   alternating movie-snippets / trec6, its own seed, pooling alternating mean / first, N = ``--n``
   (2.5 × for TREC, whose smallest class needs it) plus a few examples per session, so that no
   two sessions share a computation). Each waits for its Layers figure, checks that the page names
   its own settings (cross-talk: a page showing another session's seed or data counts), then
   opens Heads and waits for its first figure; every third session then queues one short
   fine-tuning run on the Fine-tune page.

Reported: figures shown, sessions with an error (an exception box, a refusal message, a
time-out), cross-talk, time to the first Layers figure (first / median / p95 / last, from the
moment all sessions were opened) twice: as the browsers saw it, and when the server had it ready
(the end of each session's layer-table computation, from the compute log's per-session lines).
Third, the server's part alone ("served"): for each session, from its page
reaching the server (its first script run, the log's ``view`` line) to that figure ready, and
the same for the alone session — the wait of a student whose own browser loads the page. The
"ready" times also hold how long the browsers took to load the page and connect, which here, with
thirty niced browsers on the server's two cores, took from 20 s to several minutes. On this
2-core machine the 30 browsers render on the server's cores, at the
lowest priority: what they see lags what the server had ready by however long they waited for
CPU, which on the students' own machines they would not. Also the peak resident set of the
server with its compute workers (summed; sampled every 0.5 s with psutil; the server process
alone, and everything with the fine-tuning workers, are printed too), and computations run vs
shared (the server's ``$TUNESCOPE_COMPUTE_LOG``; see ui/memo.py). Bounded: every wait has a time-out and the whole
class stops at ``--timeout`` seconds. The last line is ``class: sessions=… shown=… errors=…
crosstalk=… alone_s=… first_s=… median_s=… p95_s=… last_s=… ready_first_s=… ready_median_s=…
ready_p95_s=… ready_last_s=… served_alone_s=… served_first_s=… served_median_s=… served_p95_s=…
served_last_s=… peak_rss_mb=… computed=… shared=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]  # fmt: skip
CHART = '[data-testid="stPlotlyChart"]'
DATA = ("movie-snippets", "trec6")
DATA_NAMES = {"movie-snippets": "movie", "trec6": "TREC"}  # how each data set's label begins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    cache: Path, slots: int | None, processes: bool = True, model: str = "minilm"
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # The model is named: the dashboard's default is the 12-layer one, and the distinct-settings
    # class stays comparable with its earlier rounds (MiniLM). The server prepares no built-in
    # lesson in the background here: the lesson mode prepares its own, before the class.
    env = {**os.environ, "TUNESCOPE_CACHE": str(cache), "TUNESCOPE_WORKER_IDLE_S": "30",
           "TUNESCOPE_COMPUTE_LOG": str(cache / "compute.log"), "TUNESCOPE_MODEL": model,
           "TUNESCOPE_PREPARE_LESSONS": "0",
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}  # fmt: skip
    if not processes:  # no compute workers: every computation in the server's threads
        env["TUNESCOPE_PROCESSES"] = "1"
    if slots is not None:
        env["TUNESCOPE_COMPUTE_SLOTS"] = str(slots)
    log = open(cache / "server.log", "w")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "ui/dashboard/app.py", "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the app did not start: {(cache / 'server.log').read_text()[-2000:]}")


def niced_chromium(folder: Path) -> str:
    """A wrapper that starts chromium at the lowest CPU priority (its renderers inherit it).

    The 30 browsers stand in for the students' own machines: on this 2-core machine, 30 headless
    renderers (software-drawn progress bars and spinners) otherwise take most of the CPU from the
    server being measured. Niced, they get what the server leaves over. Linux's scheduler
    autogroups (``kernel.sched_autogroup_enabled``) share the CPU between sessions first and apply
    nice only within one: the browsers niced in the driver's session still took half the CPU from
    the server's session (measured: the compute worker at half a core). So chromium starts in a
    session of its own (``setsid``), whose group `deprioritise_browsers` sets to nice 19."""
    wrapper = folder / "chromium-niced"
    wrapper.write_text(f'#!/bin/sh\nexec setsid -w nice -n 19 {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


class RssSampler(threading.Thread):
    """Peak resident sets, sampled every 0.5 s: the server with its compute workers, summed
    (`peak`: where the computations ran in the server before, so comparable with that); the same
    with the fine-tuning workers the queued runs started (`peak_all`); the server alone."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = self.peak_server = self.peak_all = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            deprioritise_browsers()
            try:
                server = self.proc.memory_info().rss
                children = self.proc.children(recursive=True)
            except Exception:  # the server has gone
                return
            total = every = server
            for child in children:
                try:
                    rss = child.memory_info().rss
                    runs = "analysis.runs.worker" in " ".join(child.cmdline())
                except Exception:  # a child that just ended
                    continue
                every += rss
                total += 0 if runs else rss
            self.peak, self.peak_server = max(self.peak, total), max(self.peak_server, server)
            self.peak_all = max(self.peak_all, every)


def deprioritise_browsers() -> None:
    """Every chromium thread at nice 19 (chromium raises its own priority, and nice is per
    thread on Linux, so starting it under `nice` is not enough), and chromium's scheduling group
    too: see `niced_chromium`."""
    groups = set()
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            if (task / "comm").read_text().startswith("chrom"):
                os.setpriority(os.PRIO_PROCESS, int(task.name), 19)
                process = task.parent.parent
                group = (process / "autogroup").read_text().split()[0]
                if group not in groups:
                    groups.add(group)
                    (process / "autogroup").write_text("19")
        except (OSError, ValueError, IndexError):  # gone, not ours, or no autogroups here
            continue


def settings(k: int, n: int) -> dict:
    """Session k's own sidebar settings: nothing shared with another session. TREC sessions take
    2.5 × n examples: its smallest class (ABBR, 1.6 %) has fewer than the 5 examples the layer
    analyses need in some seeds' samples of 300 (the page then refuses, with that message)."""
    data = DATA[k % 2]
    size = n if data == "movie-snippets" else round(2.5 * n)
    return {"data": data, "n": size + k % 30, "seed": 1000 + k,
            "pooling": "mean" if k % 4 < 2 else "first"}  # fmt: skip


def query(s: dict) -> str:
    return "&".join(f"{key}={value}" for key, value in s.items())


async def wait_figure(pg, deadline: float) -> None:
    """Wait for the page's first figure; a page that answers with an error box instead (bad
    settings) raises `Refused` with its message."""
    figure = pg.locator(CHART).first
    refusal = pg.locator('[data-testid="stAlertContentError"]').first
    await figure.or_(refusal).wait_for(
        state="visible", timeout=max(1, deadline - time.time()) * 1000
    )
    if not await figure.is_visible():
        raise Refused((await refusal.inner_text())[:160])


class Refused(Exception):
    """The page showed an error message instead of its figure."""


async def own_settings_shown(pg, s: dict) -> bool:
    """Whether the page's caption names this session's data, N, seed and pooling."""
    caption = " ".join(await pg.locator('[data-testid="stCaptionContainer"]').all_inner_texts())
    wanted = [f"N = {s['n']:,} (seed {s['seed']})", f"{s['pooling']} pooling"]
    if not all(w in caption for w in wanted):
        return False
    seeds = {int(x) for x in re.findall(r"\(seed (\d+)\)", caption)}
    return seeds == {s["seed"]}


async def has_exception(pg) -> bool:
    return await pg.locator('[data-testid="stException"]').count() > 0


async def queue_run(pg, url: str, s: dict, deadline: float) -> bool:
    await pg.goto(f"{url}/finetune?{query(s)}")
    button = pg.get_by_role("button", name="Queue")
    await button.wait_for(timeout=max(1, deadline - time.time()) * 1000)
    for label, value in (("Steps", "10"), ("Train examples (0 = all)", "100"),
                         ("Dev/test examples scored", "32"), ("Batch size", "8")):  # fmt: skip
        box = pg.get_by_label(label, exact=True)
        if await box.count():
            await box.fill(value)
            await box.press("Tab")
    await button.click()
    await pg.get_by_text(re.compile(r"[Qq]ueued")).first.wait_for(
        timeout=max(1, deadline - time.time()) * 1000
    )
    return True


async def one_session(browser, url: str, k: int, s: dict, t0: float, deadline: float,
                      runs: bool) -> dict:  # fmt: skip
    out = {"k": k, "first_s": None, "shown": 0, "error": None, "crosstalk": False, "run": False}
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    # Every action may take until the class's deadline: on this machine the 30 browsers get
    # the CPU the server leaves over, and a click can wait minutes for its renderer.
    context.set_default_timeout(max(1, deadline - time.time()) * 1000)
    pg = await context.new_page()
    try:
        await pg.goto(f"{url}/layers?{query(s)}", timeout=120_000)
        await wait_figure(pg, deadline)
        out["first_s"] = time.perf_counter() - t0
        out["shown"] += 1
        if not await own_settings_shown(pg, s):
            out["crosstalk"] = True
        if await has_exception(pg):
            out["error"] = "exception on Layers"
        await pg.goto(f"{url}/heads?{query(s)}", timeout=120_000)
        await wait_figure(pg, deadline)
        out["shown"] += 1
        data_label = " ".join(
            await pg.locator('[data-testid="stCaptionContainer"]').all_inner_texts()
        )
        if DATA_NAMES[s["data"]].lower() not in data_label.lower():
            out["crosstalk"] = True
        if await has_exception(pg):
            out["error"] = "exception on Heads"
        if runs and k % 3 == 0:
            out["run"] = await queue_run(pg, url, s, deadline)
    except Refused as exc:  # the page answered with a message instead of a figure
        out["error"] = out["error"] or f"refused: {exc}"
    except Exception as exc:  # a time-out or a broken page: that session failed
        out["error"] = out["error"] or f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    finally:
        await context.close()
    return out


async def alone(browser, url: str, n: int, timeout: float) -> float:
    """Load the model once (untimed), then time one session on settings of its own."""
    deadline = time.time() + timeout
    seconds = float("nan")
    for k in (9_000, 9_001):  # the first one loads the model; the second is timed
        context = await browser.new_context()
        pg = await context.new_page()
        t0 = time.perf_counter()
        await pg.goto(f"{url}/layers?{query(settings(k, n))}", timeout=120_000)
        await wait_figure(pg, deadline)
        seconds = time.perf_counter() - t0
        await context.close()
    return seconds


def log_entries(log: Path) -> list[list[str]]:
    """The compute log's lines as [kind, seconds, when, label, session] (``-``: no session)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [[*line.split("\t"), "-"][:5] for line in lines if line.count("\t") >= 3]


def unfinished(log: Path) -> int:
    """Computations asked for in the compute log that have not ended (computed or failed)."""
    counts: dict[tuple[str, str], int] = {}
    for kind, _, _, label, session in log_entries(log):
        if kind == "asked":
            counts[session, label] = counts.get((session, label), 0) + 1
        elif kind in ("computed", "failed"):
            counts[session, label] = counts.get((session, label), 0) - 1
    return sum(max(0, n) for n in counts.values())


async def wait_idle(log: Path, timeout: float) -> float:
    """Wait until the server has no computation left (the alone sessions' bands and picture go
    on after their figure: the class must not start behind them); seconds waited."""
    start = time.perf_counter()
    while unfinished(log) and time.perf_counter() - start < timeout:
        await asyncio.sleep(0.5)
    return time.perf_counter() - start


async def main_async(args) -> dict:
    from playwright.async_api import async_playwright

    cache = Path(tempfile.mkdtemp(prefix="tunescope-class-"))
    t0_wall = time.time()
    proc, url = start_server(cache, args.slots, not args.in_process)
    sampler = RssSampler(proc.pid)
    sampler.start()
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=niced_chromium(cache), args=FLAGS)
            alone_s = await alone(browser, url, args.n, 600)
            print(f"one session alone: first Layers figure in {alone_s:.1f} s", flush=True)
            idle_s = await wait_idle(cache / "compute.log", 300)
            print(f"the alone sessions' remaining computations ended {idle_s:.1f} s later",
                  flush=True)  # fmt: skip
            t0, t0_wall = time.perf_counter(), time.time()
            print(f"class starts at {t0_wall:.3f} (Unix time)", flush=True)
            deadline = time.time() + args.timeout
            results = await asyncio.gather(*(
                one_session(browser, url, k, settings(k, args.n), t0, deadline, not args.no_runs)
                for k in range(args.sessions)
            ))  # fmt: skip
            await browser.close()
    finally:
        sampler.stop.set()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    entries = log_entries(cache / "compute.log")
    kinds = [kind for kind, *_ in entries]
    computed = sorted(
        ((float(sec), label) for kind, sec, _, label, _ in entries if kind == "computed"),
        reverse=True,
    )
    # When the server had each session's first figure ready: the end of the "Layer metrics"
    # computation of each class session's Layers page (one per session, none shared).
    served, alone_served, ready = served_times(entries, t0_wall)
    if args.keep_log and (cache / "compute.log").exists():
        shutil.copyfile(cache / "compute.log", args.keep_log)
    shutil.rmtree(cache, ignore_errors=True)
    return {"alone_s": alone_s, "results": results, "peak_rss_mb": sampler.peak / 2**20,
            "peak_server_mb": sampler.peak_server / 2**20, "peak_all_mb": sampler.peak_all / 2**20,
            "computed": kinds.count("computed"), "shared": kinds.count("shared"),
            "busy_s": sum(sec for sec, _ in computed), "slowest": computed[:3],
            "ready": ready, "served": served, "alone_served": alone_served}  # fmt: skip


# -- the class follows a prepared lesson ----------------------------------------------------------


def lesson_for_class(name: str, cache: Path) -> tuple[str, int]:
    """The lesson the class follows, in the bench's workspace: a built-in one (or a file), its
    steps that need no fine-tuning runs (those take hours to train: the class bench serves
    analyses). Returns (its name, its number of steps)."""
    sys.path.insert(0, str(ROOT))
    from analysis.lessons.lesson import Lesson, Lessons, from_json, slug

    store = Lessons(cache / "lessons")
    path = Path(name)
    lesson = (from_json(path.read_bytes(), slug(path.stem)) if path.suffix == ".json"
              else store.load(name))  # fmt: skip
    steps = tuple(s for s in lesson.steps if s.page not in ("claims", "finetune", "subspace"))
    own = Lesson(f"{lesson.name}-class", f"{lesson.title} (the class bench's)", steps)
    store.save(own)
    return own.name, len(steps)


def prepare_lesson(name: str, cache: Path) -> float:
    """`tunescope lesson prepare` into the bench's cache before the server starts (seconds)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tunescope", "lesson", "prepare", name, "--cache", str(cache)],
        cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return time.perf_counter() - start


async def shows(pg, text: str, deadline: float, every: float = 0.5) -> None:
    """Wait until the page shows ``text``, looking every ``every`` seconds. Playwright's own
    wait keeps checking inside the page; thirty pages doing that on this machine's two cores take
    the CPU their drawing needs."""
    while not await pg.get_by_text(text).count():
        if time.time() > deadline:
            raise TimeoutError(f"the page did not show {text!r} in time")
        await asyncio.sleep(every)


async def follower(browser, url: str, k: int, lesson: str, steps: int, reached: list,
                   deadline: float) -> dict:  # fmt: skip
    """One student: opens the lesson's link in follow mode and waits, step after step, until
    the presenter's moves bring each step's page (its lesson bar says "step i of n")."""
    out = {"k": k, "steps": 0, "error": None}
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(max(1, deadline - time.time()) * 1000)
    pg = await context.new_page()
    try:
        await pg.goto(f"{url}/?lesson={lesson}&step=1&mode=follow", timeout=120_000)
        for number in range(1, steps + 1):
            await shows(pg, f"step {number} of {steps}", deadline)
            if await has_exception(pg):
                out["error"] = f"exception at step {number}"
            reached[number - 1].append(time.perf_counter())
            out["steps"] = number
    except Exception as exc:  # a time-out or a broken page: that session failed
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    finally:
        await context.close()
    return out


async def lesson_class_async(args) -> dict:
    from playwright.async_api import async_playwright

    cache = args.prepared_cache or Path(tempfile.mkdtemp(prefix="tunescope-lesson-class-"))
    cache.mkdir(parents=True, exist_ok=True)
    name, steps = lesson_for_class(args.lesson, cache)
    prepare_s = prepare_lesson(name, cache)
    print(f"lesson {name}: {steps} steps prepared in {prepare_s:.0f} s (before the server starts)",
          flush=True)  # fmt: skip
    (cache / "compute.log").unlink(missing_ok=True)
    proc, url = start_server(cache, args.slots, True, model=args.lesson_model)
    sampler = RssSampler(proc.pid)
    sampler.start()
    reached: list[list[float]] = [[] for _ in range(steps)]
    moved: list[float] = []
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=niced_chromium(cache), args=FLAGS)
            teacher = await (await browser.new_context()).new_page()
            teacher.set_default_timeout(600_000)
            await teacher.goto(f"{url}/?lesson={name}&step=1&mode=present", timeout=300_000)
            await teacher.get_by_text(f"step 1 of {steps}").first.wait_for()
            t0_wall = time.time()
            deadline = time.time() + args.timeout
            students = [
                asyncio.ensure_future(follower(browser, url, k, name, steps, reached, deadline))
                for k in range(args.sessions)
            ]  # fmt: skip
            for number in range(1, steps + 1):
                while len(reached[number - 1]) < args.sessions and time.time() < deadline:
                    if all(s.done() for s in students):
                        break
                    await asyncio.sleep(0.5)
                if number < steps:
                    moved.append(time.perf_counter())
                    await teacher.get_by_text("Next ▶").first.click()
                    await teacher.get_by_text(f"step {number + 1} of {steps}").first.wait_for()
            results = await asyncio.gather(*students)
            await browser.close()
    finally:
        sampler.stop.set()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    entries = log_entries(cache / "compute.log")
    class_entries = [e for e in entries if float(e[2]) >= t0_wall]
    pages = [(float(sec), label) for kind, sec, _, label, session in class_entries
             if kind == "drawn" and session != "-"]  # fmt: skip
    drawn = sorted(sec for sec, _ in pages)
    cpu = sorted(float(m.group(1)) for _, label in pages
                 if (m := re.search(r"\(cpu ([0-9.]+) s\)", label)))  # fmt: skip
    kinds = [kind for kind, *_ in class_entries]
    # The browsers' part: from the presenter's click to each student showing the next step.
    lags = sorted(t - moved[i] for i, step in enumerate(reached[1:]) for t in step
                  if i < len(moved))  # fmt: skip
    if args.keep_log and (cache / "compute.log").exists():
        shutil.copyfile(cache / "compute.log", args.keep_log)
    if not args.prepared_cache:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "results": results,
        "steps": steps,
        "drawn": drawn,
        "cpu": cpu,
        "lags": lags,
        "computed": kinds.count("computed"),
        "loaded": kinds.count("loaded"),
        "hits": kinds.count("hit") + kinds.count("shared"),
        "prepare_s": prepare_s,
        "peak_rss_mb": sampler.peak / 2**20,
        "peak_server_mb": sampler.peak_server / 2**20,
    }


def summarise_lesson(out: dict) -> str:
    """Print the lesson class's figures; return its one-line summary."""
    results, steps = out["results"], out["steps"]
    errors = [r for r in results if r["error"]]
    for r in errors:
        print(f"  session {r['k']}: {r['error']}")
    served = sum(r["steps"] == steps for r in results)

    def q(values: list[float], p: float) -> float:
        return (
            values[min(len(values) - 1, round(p * (len(values) - 1)))] if values else float("nan")
        )

    drawn, lags = out["drawn"], out["lags"]
    print(f"class follows a prepared lesson: {len(results)} students, {steps} steps, "
          f"{served} saw every step, {len(errors)} with an error")  # fmt: skip
    cpu = out["cpu"]
    print(f"the server's part of each step's page (script run, view → drawn, {len(drawn)} "
          f"pages): median {q(drawn, 0.5):.2f} s, p95 {q(drawn, 0.95):.2f} s, max "
          f"{q(drawn, 1):.2f} s (the script thread's own CPU: median {q(cpu, 0.5):.2f} s, max "
          f"{q(cpu, 1):.2f} s); computations during the class: {out['computed']} computed, "
          f"{out['loaded']} read from the disk cache, {out['hits']} served from memory")  # fmt: skip
    print(f"the browsers' part (presenter's click → a student's page at the next step, on this "
          f"machine's niced browsers): median {q(lags, 0.5):.1f} s, p95 {q(lags, 0.95):.1f} s, "
          f"max {q(lags, 1):.1f} s; peak RSS {out['peak_rss_mb']:.0f} MB (server and compute "
          f"workers; the server alone {out['peak_server_mb']:.0f} MB)")  # fmt: skip
    return (
        f"lesson-class: sessions={len(results)} steps={steps} served={served} "
        f"errors={len(errors)} drawn_median_s={q(drawn, 0.5):.2f} drawn_p95_s={q(drawn, 0.95):.2f} "
        f"drawn_max_s={q(drawn, 1):.2f} cpu_max_s={q(cpu, 1):.2f} "
        f"computed={out['computed']} loaded={out['loaded']} "
        f"browser_median_s={q(lags, 0.5):.1f} browser_max_s={q(lags, 1):.1f} "
        f"peak_rss_mb={out['peak_rss_mb']:.0f} prepare_s={out['prepare_s']:.0f}"
    )


def served_times(
    entries: list[list[str]], t0_wall: float
) -> tuple[list[float], float, list[float]]:
    """From the compute log: the server's part of each class session's wait — from the session's
    first script run (its page reached the server: its first ``view`` line) to the end of its
    first "Layer metrics" computation — sorted; the same for the last session of the alone phase
    (before ``t0_wall``); and when each class session's figure was ready (its table's end −
    ``t0_wall``), sorted. Only sessions that extracted states count: a Layers page on settings of
    its own (a Heads page reads the states and table its Layers page left in the disk cache, in
    no time, which the memo logs as a computation of under 0.2 s). What is
    left of a browser's time to the figure is its own page load and drawing, which on this
    machine waits for the CPU the server leaves."""
    views: dict[str, float] = {}
    tables: dict[str, float] = {}
    extracted: set[str] = set()
    for kind, sec, when, label, session in entries:
        if session == "-":
            continue
        if kind == "view":
            views.setdefault(session, float(when))
        elif kind == "computed" and label == "Extracting hidden states" and float(sec) >= 0.2:
            extracted.add(session)  # (< 0.2 s: the states were read from the disk cache)
        elif kind == "computed" and label == "Layer metrics":
            tables.setdefault(session, float(when))
    pages = {s: (views[s], end) for s, end in tables.items() if s in views and s in extracted}
    served = sorted(end - start for start, end in pages.values() if start >= t0_wall)
    ready = sorted(end - t0_wall for start, end in pages.values() if start >= t0_wall)
    before = [(start, end - start) for start, end in pages.values() if start < t0_wall]
    return served, max(before)[1] if before else float("nan"), ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--slots", type=int, default=None, help="the server's compute slots")
    parser.add_argument("--no-runs", action="store_true", help="queue no fine-tuning runs")
    parser.add_argument("--keep-log", type=Path, default=None,
                        help="copy the server's compute log (ui/memo.py) to this file")  # fmt: skip
    parser.add_argument(
        "--baseline", action="store_true",
        help="first run the class with one slot per session and the computations in the "
        "server's own threads (every computation at once, as before the queue and the compute "
        "workers), then as configured, and print both",
    )  # fmt: skip
    parser.add_argument(
        "--in-process", action="store_true",
        help="compute in the server's own threads, not in its compute workers",
    )  # fmt: skip
    parser.add_argument(
        "--mode", choices=["distinct", "lesson", "both"], default="distinct",
        help="distinct: every session on settings of its own (above); lesson: the class follows "
        "a prepared lesson (its analysis steps) as the presenter moves on; both: the lesson class, "
        "then the distinct-settings class, on fresh servers",
    )  # fmt: skip
    parser.add_argument("--lesson", default="papers-story",
                        help="the lesson the class follows: a built-in name or a lesson file")  # fmt: skip
    parser.add_argument("--lesson-model", default="mpnet",
                        help="the server's default model in the lesson class (its steps name "
                        "their own)")  # fmt: skip
    parser.add_argument("--prepared-cache", type=Path, default=None,
                        help="the lesson class's cache, kept (prepared once, reused)")  # fmt: skip
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit("Debian's chromium is needed: apt-get install chromium")
    lines = []
    if args.mode in ("lesson", "both"):
        print("== the class follows a prepared lesson")
        lines.append(summarise_lesson(asyncio.run(lesson_class_async(args))))
        if args.mode == "lesson":
            print(lines[0])
            return
    if args.baseline:
        unqueued = argparse.Namespace(
            **{**vars(args), "slots": args.sessions + 2, "in_process": True}
        )
        print(f"== baseline: {unqueued.slots} compute slots (every computation at once)")
        lines.append(summarise(asyncio.run(main_async(unqueued)), "class-baseline"))
    slots = args.slots or "default"
    print(f"== queued: {slots} compute slot(s)")
    lines.append(summarise(asyncio.run(main_async(args)), "class"))
    print("; ".join(lines))  # one last line: docs/benchmarks.md records it


def summarise(out: dict, name: str) -> str:
    """Print one class's figures; return its one-line summary."""
    results = out["results"]
    times = sorted(r["first_s"] for r in results if r["first_s"] is not None)
    errors = [r for r in results if r["error"]]
    for r in errors:
        print(f"  session {r['k']}: {r['error']}")

    def q(p: float, values: list[float] = times) -> float:
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(p * (len(values) - 1)))]

    median = statistics.median(times) if times else float("nan")
    ready = out["ready"]
    ready_median = statistics.median(ready) if ready else float("nan")
    figures = sum(r["shown"] for r in results)
    crosstalk = sum(r["crosstalk"] for r in results)
    print(f"sessions {len(results)}, figures shown {figures} of {2 * len(results)}, "
          f"runs queued {sum(r['run'] for r in results)}, sessions with an error {len(errors)}, "
          f"cross-talk {crosstalk}")  # fmt: skip
    print(f"time to the first Layers figure: first {q(0):.1f} s, median {median:.1f} s, "
          f"p95 {q(0.95):.1f} s, last {q(1):.1f} s; one session alone {out['alone_s']:.1f} s "
          f"(first / alone = {q(0) / out['alone_s']:.2f})")  # fmt: skip
    print(f"the server had them ready (its {len(ready)} class Layer-metrics computations ended): "
          f"first {q(0, ready):.1f} s, median {ready_median:.1f} s, p95 {q(0.95, ready):.1f} s, "
          f"last {q(1, ready):.1f} s")  # fmt: skip
    served = out["served"]
    served_median = statistics.median(served) if served else float("nan")
    print(f"the server's part (from each session's page reaching it to its figure ready): "
          f"first {q(0, served):.1f} s, median {served_median:.1f} s, p95 {q(0.95, served):.1f} "
          f"s, last {q(1, served):.1f} s; alone {out['alone_served']:.1f} s")  # fmt: skip
    print(f"peak RSS {out['peak_rss_mb']:.0f} MB (the server and its compute workers; the server "
          f"process alone {out['peak_server_mb']:.0f} MB; with the fine-tuning workers "
          f"{out['peak_all_mb']:.0f} MB); computations run {out['computed']}, "
          f"shared {out['shared']}; their seconds add up to {out['busy_s']:.0f} s (slowest: "
          + ", ".join(f"{label} {sec:.0f} s" for sec, label in out["slowest"]) + ")")  # fmt: skip
    return (
        f"{name}: sessions={len(results)} shown={figures} errors={len(errors)} "
        f"crosstalk={crosstalk} alone_s={out['alone_s']:.1f} first_s={q(0):.1f} "
        f"median_s={median:.1f} p95_s={q(0.95):.1f} last_s={q(1):.1f} "
        f"ready_first_s={q(0, ready):.1f} ready_median_s={ready_median:.1f} "
        f"ready_p95_s={q(0.95, ready):.1f} ready_last_s={q(1, ready):.1f} "
        f"served_alone_s={out['alone_served']:.1f} served_first_s={q(0, served):.1f} "
        f"served_median_s={served_median:.1f} served_p95_s={q(0.95, served):.1f} "
        f"served_last_s={q(1, served):.1f} "
        f"peak_rss_mb={out['peak_rss_mb']:.0f} computed={out['computed']} shared={out['shared']}"
    )


if __name__ == "__main__":
    main()
