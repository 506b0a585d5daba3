"""The pool and its replay: every arm of the built-in demo's recommendation × 10 seeds at the
default budget, under common random numbers, and three designs replayed on that one pool.

    .venv/bin/python bench/bench_pool.py [--cache DIR] [--seeds 10] [--no-train] [--delta 1]

(1) **The pool.** `tunescope recommend`'s default question (minilm, movie snippets, the default
    budget) as a whole-table experiment to ``--seeds`` seeds (`analysis.runs.planner`): the runs
    train through the one launch path into ``--cache`` (default ``cache-pool/``); finished runs
    are reused, so the pool can be built over several sittings. ``--no-train`` replays what is
    there.
(2) **The seed designs.** For every arm: the correlation over seeds between its test scores and
    full fine-tuning's, and the two valid intervals' half-widths at one look — the paired t over
    the d_s (common random numbers) and Welch's from the two arms' own spreads (independent
    seeds) — and which is narrower (docs/explanation/statistics.md, "Seeds").
(3) **The replay.** The same pool judged three ways: the sequential rule (r₀ = 3, R_max = the
    pool's seeds; replayed by the planner itself on a scratch runs database, one worker taking
    the queue in order, a run "finishing" with its pool result, and the next round taken as
    it ends — so costlier arms' queued runs are cancelled as in a real comparison), the fixed
    3-seed grid and the fixed grid of every seed, each with the seed design's test (its k-th
    run of an arm stands for that arm's k-th seed: an arm's scores are a sample of that arm
    under either design, only their pairing with full's differs). For each: runs trained,
    their training time (the pool runs' own wall times, summed), and what the sentence says.
    Then what "Test these" would say of the first round's time beside what those runs took.
(4) **The table** of every arm's difference to full fine-tuning at n = every seed (the seed
    design's test, `analysis.runs.planner.SEED_DESIGN`), its interval (one look), status,
    trainable share and step time.

``--delta`` judges the same pool with another δ (it changes no run). The last line is ``pool:
seeds=… arms=… sequential_runs=… grid3_runs=… grid_runs=… sequential=<branch>
design=<common|independent> delta=…``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build(cfg, cache: Path, train: bool):
    """The recommendation and the pool's runs (trained to every seed when ``train``)."""
    from analysis.models import load_model
    from analysis.recommend.recommendation import recommend
    from analysis.runs.db import RunsDB
    from analysis.runs.launch import launch, launch_experiment
    from analysis.runs.planner import WHOLE_TABLE, progress
    from analysis.workspace import Workspace

    with Workspace(cache).active():
        start = time.perf_counter()
        rec = recommend(cfg, load_model(cfg.model))
        print(f"analyses and costs: {time.perf_counter() - start:.0f} s", flush=True)
        # the pool is built under common random numbers: every arm seed by seed with full
        table = dataclasses.replace(rec.experiment(), policy=WHOLE_TABLE, seed_design="common")
        db = RunsDB()
        runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
        if train:
            launched = launch_experiment(db, table, runs, sweep_id="pool")
            print(f"queued {len(launched.ids)} runs of the pool", flush=True)
            while True:
                db.reap_dead()
                runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
                state = progress(table, runs)
                print(f"  {time.strftime('%H:%M:%S')} {state.text()}", flush=True)
                if not state.counts["running"] and not state.counts["queued"]:
                    break
                launch(db, [], None, "pool")
                time.sleep(60)
        return rec, table, db.list_runs(model=cfg.model.name, data=cfg.data.name)


def pool_scores(rec, table, runs) -> dict[str, dict[int, dict]]:
    """Arm → seed index → the pool run's result (done runs only)."""
    from analysis.runs.planner import standings

    return {
        arm: {i: s.result for i, s in by_seed.items() if s.status == "done" and s.result}
        for arm, by_seed in standings(table, runs).items()
    }


def seed_designs(pool, reference: str, n: int) -> tuple[list[dict], str]:
    """Per arm: correlation with full over seeds, paired and Welch half-widths at one look."""
    from analysis.compare import Arm, compare

    rows = []
    full = pool[reference]
    for arm, results in pool.items():
        if arm == reference:
            continue
        seeds = sorted(set(results) & set(full))[:n]
        if len(seeds) < 3:
            continue
        a = [results[s]["score"] for s in seeds]
        f = [full[s]["score"] for s in seeds]
        corr = float(np.corrcoef(a, f)[0, 1]) if np.std(a) > 0 and np.std(f) > 0 else math.nan
        arm_a, arm_f = (
            Arm(arm, tuple(a), seeds=tuple(seeds)),
            Arm("full", tuple(f), seeds=tuple(seeds)),
        )
        paired, welch = compare(arm_a, arm_f, test="paired"), compare(arm_a, arm_f)
        rows.append({"arm": arm, "n": len(seeds), "corr": corr, "diff": paired.diff,
                     "paired": paired.margin, "welch": welch.margin})  # fmt: skip
    narrower = sum(r["paired"] < r["welch"] for r in rows)
    return rows, "common" if narrower * 2 >= len(rows) else "independent"


def replay_sequential(rec, table, pool, r_max: int) -> dict:
    """The sequential rule replayed by the planner on a scratch runs database (module
    docstring): one worker takes the queue in order; each run ends with its pool result."""
    from analysis.recommend.outcome import experiment_of
    from analysis.runs.db import RunsDB
    from analysis.runs.planner import advance, standings, start
    from analysis.runs.record import setting_key
    from analysis.workspace import Workspace

    cfg = dataclasses.replace(rec.cfg, design="sequential", max_seeds=r_max)
    experiment = experiment_of(cfg, rec.proposal, rec.costs)
    results = {}
    for arm in experiment.arms:
        for i, result in pool[arm.name].items():
            config = arm.run(experiment.training_seed(arm, i))
            results[(setting_key(config.to_dict()), config.seed)] = result
    trained, seconds = 0, 0.0
    with tempfile.TemporaryDirectory() as tmp, Workspace(Path(tmp)).active():
        db = RunsDB()
        start(db, experiment, db.list_runs(), "replay")
        while True:
            queued = db.list_runs(status="queued")
            if queued.empty:
                break
            row = queued.iloc[-1]  # the oldest: list_runs is newest first
            config = db.get_run(row["id"])["config"]
            result = results.get((setting_key(config), int(config["seed"])))
            db.claim_next(os.getpid())
            if result is None:  # beyond the pool: the replay cannot go on with it
                db.fail(row["id"], "not in the pool")
                continue
            db.finish(row["id"], result)
            trained += 1
            seconds += float(result.get("wall_s") or 0.0)
            advance(db, "replay")
        runs = db.list_runs()
        rec_cfg = dataclasses.replace(rec, cfg=cfg)
        arms, decision = rec_cfg.outcome(runs)
        missing = sum(1 for s in standings(experiment, runs).values() for x in s.values()
                      if x.status == "failed")  # fmt: skip
    return {"runs": trained, "seconds": seconds, "decision": decision, "arms": arms,
            "missing": missing}  # fmt: skip


def first_round(rec, pool, r_max: int) -> dict:
    """What "Test these" says of the sequential design's first round on an empty runs database
    (`Recommendation.queue_seconds`: the timed steps × steps, the runs that train at once here)
    beside what those runs took in the pool (their wall times over the same number at once)."""
    from analysis.recommend.outcome import experiment_of
    from analysis.runs.db import RunsDB
    from analysis.runs.executor import ExecutorChoice
    from analysis.runs.planner import next_steps
    from analysis.runs.worker import parallel_runs
    from analysis.workspace import Workspace

    cfg = dataclasses.replace(rec.cfg, design="sequential", max_seeds=r_max)
    experiment = experiment_of(cfg, rec.proposal, rec.costs)
    with tempfile.TemporaryDirectory() as tmp, Workspace(Path(tmp)).active():
        empty = RunsDB().list_runs()  # a runs database with nothing in it yet
    queue = next_steps(experiment, empty).queue
    parallel = parallel_runs(ExecutorChoice(), next(iter(rec.costs.by_name.values())).n_params)
    rec_seq = dataclasses.replace(rec, cfg=cfg)
    estimate, source = rec_seq.queue_seconds(queue, empty, parallel)
    index = {arm.name: {experiment.training_seed(arm, i): i for i in range(r_max)}
             for arm in experiment.arms}  # fmt: skip
    done = [(arm, c) for arm, c in queue if index[arm.name][c.seed] in pool[arm.name]]
    walls = [float(pool[arm.name][index[arm.name][c.seed]]["wall_s"]) for arm, c in done]
    return {"runs": len(queue), "measured": len(done), "parallel": parallel, "source": source,
            "estimate": estimate, "estimate_measured": rec_seq.queue_seconds(done, empty, parallel)[0],
            "actual": sum(walls) / parallel}  # fmt: skip


def replay_grid(rec, pool, n: int) -> dict:
    """The fixed grid of the first ``n`` seeds, judged once."""
    import pandas as pd

    from analysis.recommend.outcome import arm_outcomes, decide, design_of, experiment_of
    from analysis.runs.planner import Stand

    cfg = dataclasses.replace(rec.cfg, design="fixed", seeds=tuple(range(n)))
    experiment = experiment_of(cfg, rec.proposal, rec.costs)
    stands = {arm.name: {i: Stand("done", f"{arm.name}-{i}", r)
                         for i, r in pool[arm.name].items() if i < n} for arm in experiment.arms}  # fmt: skip
    arms = arm_outcomes(cfg, rec.proposal, rec.costs, stands)
    decision = decide(arms, cfg.delta, cfg.budget, rec.trains, True, design_of(cfg).looks)
    runs = sum(len(v) for v in stands.values())
    seconds = sum(float(r.get("wall_s") or 0.0) for v in stands.values() for r in
                  (s.result for s in v.values()))  # fmt: skip
    del pd
    return {"runs": runs, "seconds": seconds, "decision": decision, "arms": arms, "missing": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=str(ROOT / "cache-pool"), help="the pool's cache folder")
    parser.add_argument("--seeds", type=int, default=10, help="seeds of every arm (R_max)")
    parser.add_argument("--no-train", action="store_true", help="replay what the pool holds")
    parser.add_argument("--delta", type=float, default=None,
                        help="δ of the replays and the table (default: the recommendation's)")  # fmt: skip
    args = parser.parse_args()
    from analysis.recommend.config import RecommendConfig

    cfg = RecommendConfig(design="whole-table", max_seeds=args.seeds)
    if args.delta is not None:  # δ judges the runs; it changes none of them
        cfg = dataclasses.replace(cfg, delta=args.delta)
    print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    rec, table, runs = build(cfg, Path(args.cache), not args.no_train)
    pool = pool_scores(rec, table, runs)
    reference = rec.proposal.choices[0].name
    have = min(len(v) for v in pool.values())
    print(f"\npool: {len(pool)} arms, {sum(len(v) for v in pool.values())} runs, "
          f"every arm has ≥ {have} seeds")  # fmt: skip
    steps = {a: statistics.median([r["step_time_s"] for r in v.values()]) for a, v in pool.items()
             if v}  # fmt: skip

    rows, design = seed_designs(pool, reference, args.seeds)
    print("\nseed designs, one look (points):")
    print(f"{'arm':<24} {'n':>2} {'corr':>6} {'diff':>6} {'paired ±':>9} {'Welch ±':>8}")
    for r in rows:
        print(f"{r['arm']:<24} {r['n']:>2} {r['corr']:+6.2f} {100 * r['diff']:+6.1f} "
              f"{100 * r['paired']:9.1f} {100 * r['welch']:8.1f}")  # fmt: skip
    print(
        f"narrower: {design} ({'paired t' if design == 'common' else 'Welch'}) on "
        f"{sum((r['paired'] < r['welch']) == (design == 'common') for r in rows)} of {len(rows)} arms"
    )

    replays = {
        "sequential": replay_sequential(rec, table, pool, args.seeds),
        "grid 3 seeds": replay_grid(rec, pool, 3),
        f"grid {args.seeds} seeds": replay_grid(rec, pool, args.seeds),
    }
    print("\nreplay on the pool:")
    print(f"{'design':<16} {'runs':>5} {'train min':>10}  answer")
    for name, r in replays.items():
        d = r["decision"]
        answer = d.candidate or d.branch
        print(f"{name:<16} {r['runs']:>5} {r['seconds'] / 60:10.1f}  {answer}: {d.sentence}")

    from analysis.rates import duration

    first = first_round(rec, pool, args.seeds)
    print(f"\nTest these on an empty runs database: the first sequential round, {first['runs']} "
          f"runs, {first['parallel']} at a time: the button says about "
          f"{duration(first['estimate'])} ({first['source']}); the pool's {first['measured']} of "
          f"them: estimated {duration(first['estimate_measured'])}, took "
          f"{duration(first['actual'])} (their wall times / {first['parallel']}): estimate / "
          f"actual = {first['estimate_measured'] / max(first['actual'], 1e-9):.2f}")  # fmt: skip

    from analysis.runs.planner import design_test

    test = {"paired": "paired t", "welch": "Welch's t"}[design_test()]
    print(f"\nthe pool's table ({test}, the seed design's test, over every seed, one look):")
    grid = replays[f"grid {args.seeds} seeds"]["arms"]
    print(f"{'arm':<24} {'n':>2} {'score':>7} {'diff ± margin [lo, hi] (points)':>34} "
          f"{'status':<12} {'share %':>8} {'step s':>7}")  # fmt: skip
    for a in grid:
        diff = (
            ""
            if a.role == "reference"
            else (
                f"{100 * a.diff:+.1f} ± {100 * a.margin:.1f} [{100 * a.lo:+.1f}, {100 * a.hi:+.1f}]"
            )
        )
        share = "" if a.trainable_share is None else f"{100 * a.trainable_share:.2f}"
        print(f"{a.name:<24} {a.n_seeds:>2} {a.mean:7.4f} {diff:>34} {a.status or 'reference':<12} "
              f"{share:>8} {steps.get(a.name, math.nan):7.3f}")  # fmt: skip
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    seq = replays["sequential"]
    print(
        f"pool: seeds={have} arms={len(pool)} sequential_runs={seq['runs']} "
        f"grid3_runs={replays['grid 3 seeds']['runs']} "
        f"grid_runs={replays[f'grid {args.seeds} seeds']['runs']} "
        f"sequential={seq['decision'].branch} design={design} delta={cfg.delta:g}"
    )


if __name__ == "__main__":
    main()
