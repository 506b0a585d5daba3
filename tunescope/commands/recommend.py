"""``recommend``: what to tune for this model and data, at what cost, on what evidence — and, with
``--compare``, tested against the alternatives at the same budget, in one sentence
(`analysis.recommend`; docs/explanation/recommendation.md)."""

from __future__ import annotations

import argparse
import sys
import time

from analysis.config import POOLINGS
from analysis.recommend.config import DESIGN_KINDS, Budget, RecommendConfig
from analysis.words import counted
from tunescope.commands.options import (
    TqdmProgress,
    add_executor_options,
    add_model_data,
    add_seeds_flag,
    add_setting_flag,
    data_spec_from_args,
    executor_from_args,
    model_spec_from_args,
    seeds_of,
    write_json,
)

NAME = "recommend"
HELP = "candidates to tune with their cost and evidence; --compare tests them at equal budget"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_data(parser)

    def add(name: str, flag: str | None = None, **kwargs) -> None:
        add_setting_flag(parser, name, RecommendConfig, flag, **kwargs)

    add("n", type=int)
    add("sample_seed", "--seed", type=int)
    add("pooling", choices=POOLINGS)
    add("max_length", type=int)
    parser.add_argument(
        "--budget", default=None,
        help="params=SHARE (trainable share, e.g. params=10%%) or time=SHARE (of full "
        "fine-tuning's step time, e.g. time=0.5); default: no limit, the cheapest choice not "
        "shown worse than full",
    )  # fmt: skip
    for name in ("repeats", "heads_n", "k", "lora_r"):
        add(name, type=int)
    add("lora_alpha", type=float)
    add("delta", type=float)
    add("timed_steps", type=int)
    parser.add_argument(
        "--compare", action="store_true",
        help="train the arms against full fine-tuning by the design (finished runs are reused)",
    )  # fmt: skip
    add("design", choices=DESIGN_KINDS)
    add_seeds_flag(parser, RecommendConfig)
    add("max_seeds", type=int)
    for name in ("steps", "batch_size", "n_train", "n_eval", "eval_every"):
        add(name, type=int)
    parser.add_argument(
        "--wait", action="store_true", help="with --compare: wait for the runs (with progress)"
    )
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between checks")
    parser.add_argument("--json", default=None, help="write the recommendation here ('-': stdout)")
    parser.add_argument(
        "--report", default=None, help="write one self-contained HTML report here (FILE.html)"
    )
    parser.add_argument(
        "--recipe", default=None,
        help="write the recommended candidate's recipe into this folder (or, before a "
        "comparison, the candidate named by --candidate)",
    )  # fmt: skip
    parser.add_argument("--candidate", default=None, help="the candidate --recipe takes home")
    add_executor_options(parser)


def config_from_args(args: argparse.Namespace) -> RecommendConfig:
    return RecommendConfig(
        model=model_spec_from_args(args), data=data_spec_from_args(args),
        budget=Budget.parse(args.budget), n=args.n, sample_seed=args.seed, pooling=args.pooling,
        max_length=args.max_length, repeats=args.repeats, heads_n=args.heads_n, k=args.k,
        lora_r=args.lora_r, lora_alpha=args.lora_alpha, seeds=seeds_of(args.seeds),
        design=args.design, max_seeds=args.max_seeds, steps=args.steps, batch_size=args.batch_size, n_train=args.n_train, n_eval=args.n_eval,
        eval_every=args.eval_every, delta=args.delta, timed_steps=args.timed_steps,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from analysis.models import load_model
    from analysis.recommend.recommendation import recommend
    from analysis.runs.db import RunsDB
    from analysis.runs.worker import check_executor

    if args.wait and not args.compare:
        raise ValueError("--wait goes with --compare (it waits for the comparison's runs).")
    if args.report and not str(args.report).lower().endswith((".html", ".htm")):
        raise ValueError(f"--report writes one HTML file: give FILE.html (got {args.report!r}).")
    cfg = config_from_args(args)
    executor = executor_from_args(args)
    if args.compare:
        check_executor(executor)  # before the analyses, not after them
    out = sys.stderr if args.json == "-" else sys.stdout  # stdout: the JSON alone
    started = time.perf_counter()
    loaded = load_model(cfg.model)
    bar = TqdmProgress("analyses and costs")
    try:
        rec = recommend(cfg, loaded, progress=bar)
    finally:
        bar.close()
    print(
        f"{cfg.model.name} on {cfg.data.name}: {rec.evidence.n_layers} layers, "
        f"{rec.evidence.l_star_words()}; budget: {cfg.budget.text()} "
        f"(analyses and costs in {time.perf_counter() - started:.0f} s)",
        file=out,
    )
    print(candidates_text(rec), file=out)
    for note in rec.proposal.notes:
        print(f"note: {note}", file=out)
    db = RunsDB()
    if args.compare:
        _drive(db, rec, executor, wait=args.wait, poll=args.poll)
    runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
    arms, decision = rec.outcome(runs)
    if any(a.n_seeds for a in arms):
        print(comparison_text(arms), file=out)
    print(decision.sentence, file=out)
    write_json(args.json, rec.to_json(runs))
    if args.report:
        # The report draws with the Recommend page's plotly figures, imported here only, so that
        # the library and `--help` stay free of plotly.
        from ui.recommend.report import write_report

        path = write_report(rec, runs, args.report)
        print(f"report written to {path}", file=out)
    if args.recipe:
        from analysis.recommend.recommendation import take_home

        name = args.candidate or decision.candidate
        if name is None:
            raise ValueError(
                "No candidate is recommended yet (compare first, --compare --wait), so --recipe "
                "needs --candidate NAME: one of "
                + ", ".join(repr(c.name) for c in rec.proposal.choices)
            )
        try:
            files = take_home(rec, name, args.recipe, loaded)
        except KeyError:
            raise ValueError(f"No choice named {name!r}.") from None
        print(
            f"recipe of {name!r} written to {args.recipe} ({counted(len(files), 'file')})", file=out
        )
    if args.json and args.json != "-":
        print(f"JSON written to {args.json}", file=out)
    print(f"total {time.perf_counter() - started:.0f} s", file=out)
    return 0


def candidates_text(rec) -> str:
    lines = [f"{'choice':<26} {'role':<11} {'trainable':>9} {'step time':>9}  trains"]
    for choice in rec.proposal.choices:
        cost = rec.costs.get(choice.name)
        share = "-" if cost is None else f"{100 * cost.share:.2f} %"
        ratio = "-" if cost is None else f"{cost.step_time_ratio:.2f}×"
        lines.append(f"{choice.name:<26} {choice.role:<11} {share:>9} {ratio:>9}  {choice.trains}")
        if choice.evidence and choice.role == "candidate":
            lines.append(f"{'':<26} {'':<11} {'':>9} {'':>9}  evidence: {choice.evidence}")
        if cost is not None and cost.match:
            lines.append(f"{'':<26} {'':<11} {'':>9} {'':>9}  budget: {cost.match}")
    if rec.costs.drift > 0.2:
        lines.append(
            f"(full fine-tuning's step time varied by {100 * rec.costs.drift:.0f} % during the "
            "measurement: the machine was busy; each ratio compares steps taken in turn with "
            "full fine-tuning's)"
        )
    return "\n".join(lines)


def comparison_text(arms) -> str:
    """The comparison as a plain table (differences, intervals and margins in points)."""
    lines = [
        f"{'arm':<26} {'n':>2} {'score':>14} {'diff vs full [interval]':>31} {'step':>6} "
        f"{'share':>8}  verdict"
    ]
    for a in arms:
        score = "-" if a.n_seeds == 0 else f"{a.mean:.4f} ± {a.se:.4f}".replace("nan", "–")
        if a.role == "reference" or a.n_seeds == 0 or a.diff != a.diff:
            diff = "-"
        elif a.margin != a.margin:
            diff = f"{100 * a.diff:+.1f} ± – pt"
        else:
            diff = (f"{100 * a.diff:+.1f} ± {100 * a.margin:.1f} "
                    f"[{100 * a.lo:+.1f}, {100 * a.hi:+.1f}] pt")  # fmt: skip
        step = "-" if a.step_time_ratio is None else f"{a.step_time_ratio:.2f}×"
        share = "-" if a.trainable_share is None else f"{100 * a.trainable_share:.2f}%"
        lines.append(
            f"{a.name:<26} {a.n_seeds:>2} {score:>14} {diff:>31} {step:>6} {share:>8}  {a.verdict}"
        )
    tests = {a.test for a in arms if a.test}
    test = "the paired t over the seeds both have" if tests == {"paired"} else "Welch's t"
    lines.append(f"(± in the score: s.e. over seeds; ± in diff: c·se, {test}, c adjusted for "
                 "every look the design may take)")  # fmt: skip
    return "\n".join(lines)


def _drive(db, rec, executor, wait: bool, poll: float) -> None:
    """Queue the comparison's first round (or its whole grid), then — with ``wait`` — poll (a bar
    of the planned runs done, the round and the arms decided) until the answer is final or no
    planned run is queued or running. Later rounds are queued as runs end (by the process that
    records them; here too, should a round fall between two looks). What it says goes to
    stderr."""
    from analysis.rates import duration
    from analysis.recommend.recommendation import queue
    from analysis.runs.launch import launch, new_sweep_id
    from analysis.runs.planner import advance, next_steps
    from analysis.runs.worker import parallel_runs

    cfg = rec.cfg
    runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
    to_queue = next_steps(rec.experiment(), runs).queue
    n_params = next(iter(rec.costs.by_name.values())).n_params if rec.costs else None
    seconds, source = rec.queue_seconds(to_queue, runs, parallel_runs(executor, n_params))
    sweep_id = new_sweep_id("recommend")
    launched = queue(db, rec, runs, executor, sweep_id)
    state = rec.progress(db.list_runs(model=cfg.model.name, data=cfg.data.name))
    took = f"; about {duration(seconds)} of training here ({source})" if seconds > 0 else ""
    print(
        f"queued {counted(len(launched.ids), 'run')} ({cfg.design} design, "
        f"{len(rec.proposal.choices)} arms; finished ones reused){took}: {state.text()}; "
        f"{launched.how}",
        file=sys.stderr,
    )
    if not wait:
        return
    bar = TqdmProgress("comparison")
    try:
        while True:
            db.reap_dead()
            runs = db.list_runs(model=cfg.model.name, data=cfg.data.name)
            state = rec.progress(runs)
            bar(state.counts["done"] / max(state.planned, 1), state.text())
            # idle: nothing of the plan training or queued, nor a run of this comparison that a
            # round no longer wants but that has yet to reach its next step and stop
            stopping = runs["status"].eq("running") & runs["sweep_id"].eq(sweep_id)
            idle = not state.counts["running"] and not state.counts["queued"] and not stopping.any()
            if idle and not advance(db, sweep_id):  # nothing more to train: the answer stands
                return
            launch(db, [], executor, sweep_id)  # keeps a worker serving the queued runs
            time.sleep(poll)
    finally:
        bar.close()
