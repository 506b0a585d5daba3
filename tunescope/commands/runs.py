"""``runs``: list, show, export, compare, cancel, annotate (note, tag), delete and import the
fine-tuning runs kept in the runs database (``runs import DIR``: the run folders the exported
recipe's ``TunescopeCallback`` wrote, or a transformers Trainer output folder:
`analysis.runs.imported.import_folder`).

Listings and exports carry each run's group (its stored ``group_key``: runs identical in every
setting but the seed) and a label that tells settings apart; ``runs groups`` lists the
groups with n_seeds and mean ± s.e. (step times: the median over seeds); ``runs compare A B``
applies `analysis.compare.compare`.
"""

from __future__ import annotations

import argparse
import json

from analysis.io import atomic_write_text, json_ready
from analysis.words import counted
from tunescope.commands.options import data_name, model_name, write_json

NAME = "runs"
HELP = (
    "list, show, export, compare, cancel, annotate (note, tag), delete or import fine-tuning runs"
)
LIST_COLUMNS = [
    "id", "status", "model", "data", "method", "label", "seed", "score", "metric", "imported",
    "group",
]  # fmt: skip
GROUP_COLUMNS = ["group", "label", "n_seeds", "score", "score_sem", "dev_score", "step_time_s"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", default=None, help="cache folder (default: ./cache)")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="runs, newest first")
    export = sub.add_parser("export", help="write runs as CSV or JSON")
    for p in (listing, export):
        p.add_argument("--model", default=None)
        p.add_argument("--data", default=None)
        p.add_argument("--method", default=None)
        p.add_argument("--status", default=None)
        p.add_argument("--sweep", default=None, help="only the runs of this sweep id")
        p.add_argument("--tag", default=None, help="only the runs carrying this tag")
    listing.add_argument("--json", default=None, help="also write the list as JSON here")
    show = sub.add_parser("show", help="one run: config, result, last steps")
    show.add_argument("id", help="run id (or a unique part of it)")
    show.add_argument("--json", default=None, help="write the run (with its steps) as JSON here")
    export.add_argument("--csv", default=None, help="one row a run")
    export.add_argument("--json", default=None, help="runs with config, result and steps")
    cancel = sub.add_parser(
        "cancel",
        help="cancel queued or running runs: these ids, or the rest of a sweep, in one go",
        description="Queued runs are cancelled at once, running ones stop at their next step, "
        "finished ones are left as they are; all in one transaction.",
    )
    cancel.add_argument("ids", nargs="*", metavar="ID", help="run ids (or unique parts of them)")
    cancel.add_argument(
        "--sweep", default=None, metavar="SWEEP_ID",
        help="every run of this sweep id (a sweep's, a comparison's or a Paper check's runs)",
    )  # fmt: skip
    note = sub.add_parser("note", help="set a run's note ('' clears it)")
    note.add_argument("id", help="run id (or a unique part of it)")
    note.add_argument("text", help="the note")
    tag = sub.add_parser("tag", help="set a run's tags, comma-separated ('' clears them)")
    tag.add_argument("id", help="run id (or a unique part of it)")
    tag.add_argument("tags", help="e.g. 'baseline, keep'")
    delete = sub.add_parser(
        "delete", help="delete a run's files (trajectory, zero-weights files) and the run itself"
    )
    delete.add_argument("id", help="run id (or a unique part of it)")
    delete.add_argument(
        "--files-only", action="store_true", help="keep the run and its steps, delete its files"
    )
    groups = sub.add_parser(
        "groups", help="run groups (runs identical but for the seed): n_seeds, mean ± s.e."
    )
    groups.add_argument("--model", default=None)
    groups.add_argument("--data", default=None)
    groups.add_argument("--json", default=None, help="also write the groups as JSON here")
    compare = sub.add_parser(
        "compare",
        help="compare two settings: diff of mean test scores ± s.e., a verdict, paired bootstrap",
        description="A and B: a run id (standing for its whole run group) or a group key from "
        "`runs groups`. Verdict 'A better' / 'B better' when |diff| > t·se (t at 97.5 %%, Welch df), else 'no difference "
        "shown (n seeds = …)'; paired_p from a bootstrap over the test examples when both were "
        "scored on the same test part.",
    )
    compare.add_argument("a", metavar="RUN_OR_GROUP_A")
    compare.add_argument("b", metavar="RUN_OR_GROUP_B")
    compare.add_argument("--json", default=None, help="write the comparison as JSON here")
    imported = sub.add_parser(
        "import",
        help="bring runs trained elsewhere into the runs database: the run folders "
        "TunescopeCallback wrote, or a finished Trainer output folder",
    )
    imported.add_argument(
        "folder",
        help="a run folder (run.json), a Trainer's output_dir holding run folders "
        "(tunescope-runs/), or a Trainer output folder (trainer_state.json)",
    )
    imported.add_argument("--model", default=None, help="model name (default: the run's own)")
    imported.add_argument("--data", default=None, help="data set name (default: the run's own)")
    trainer = imported.add_argument_group("a Trainer output folder only (a run folder says them)")
    trainer.add_argument("--metric", default=None, help="eval_<metric> is the dev curve (accuracy)")
    trainer.add_argument("--recipe", default=None, help="the recipe folder the run applied")
    trainer.add_argument("--seed", type=int, default=None, help="the run's training seed (0)")
    for action in (listing, show, export, groups, compare):
        action.set_defaults(writes=False)  # never the one to create a missing cache folder


def run(args: argparse.Namespace) -> int:
    from analysis.runs.db import RunsDB

    if args.action == "import":  # issue 18
        return _import(args)
    if not getattr(args, "writes", True) and not args.workspace.root.is_dir():
        return _nothing_recorded(args)
    db = RunsDB()
    db.reap_dead()
    if args.action in ("list", "export"):
        from analysis.runs.results import with_groups  # (scipy: seconds the others need not wait)

        filters = {
            "model": _as_queued(args.model, model_name),
            "data": _as_queued(args.data, data_name),
            "method": args.method,
            "status": args.status,
            "sweep_id": args.sweep,
            "tag": args.tag,
        }
    if args.action == "groups":
        return _groups(db, args)
    if args.action == "compare":
        return _compare(db, args)
    if args.action == "list":
        table = with_groups(db.list_runs(**filters))
        if table.empty:
            print("no runs yet")
        else:
            print(table[LIST_COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        if args.json:
            write_json(args.json, {"runs": json_ready(table)})
        return 0
    if args.action == "show":
        record = db.get_run(args.id)
        steps = db.steps(record["id"])
        summary = {k: v for k, v in record.items() if k not in ("config", "result")}
        for key, value in summary.items():
            print(f"{key:>16}: {value}")
        for key in ("config", "result"):
            shown = _readable(record[key]) if key == "result" else record[key]
            print(f"{key:>16}:", json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False))
        train = steps[(steps.kind == "train") & (steps.key == "loss")]
        if not train.empty:
            last = train.iloc[-1]
            print(f"{'last step':>16}: {int(last.step)} (loss {last.value:.4f})")
        if args.json:
            record["steps"] = steps.to_dict(orient="records")
            write_json(args.json, record)
        return 0
    if args.action == "export":
        if not args.csv and not args.json:
            raise ValueError("runs export needs --csv FILE and/or --json FILE.")
        if args.csv:
            frame = with_groups(db.list_runs(**filters)).drop(columns=["result_json"])
            atomic_write_text(args.csv, frame.to_csv(index=False))
            print(f"wrote {counted(len(frame), 'run')} to {args.csv}")
        if args.json:
            from analysis.runs.results import export_records

            records = export_records(db, **filters)  # with each run's group and label
            atomic_write_text(args.json, json.dumps(records, indent=1, default=str))
            print(f"wrote {counted(len(records), 'run')} to {args.json}")
        return 0
    if args.action == "note":
        db.set_note(args.id, args.text)
        print(f"run {db.resolve_id(args.id)}: note saved")
        return 0
    if args.action == "tag":
        tags = db.set_tags(args.id, args.tags)
        print(f"run {db.resolve_id(args.id)}: tags {', '.join(tags) or '(none)'}")
        return 0
    if args.action == "delete":
        run_id = db.resolve_id(args.id)
        removed = db.delete_files(run_id) if args.files_only else db.delete_run(run_id)
        what = "files of run" if args.files_only else "run"
        print(f"deleted the {what} {run_id}" + "".join(f"\n  removed {p}" for p in removed))
        return 0
    if not args.ids and args.sweep is None:
        raise ValueError("runs cancel needs run ids or --sweep SWEEP_ID.")
    print(db.cancel_runs(args.ids, sweep_id=args.sweep).describe())
    return 0


def _readable(result: dict | None) -> dict | None:
    """A run's result for a person: its test predictions summarised in one line (how many, a
    checksum, the first few) instead of their base64 arrays; ``--json`` keeps them whole."""
    from analysis.predictions import describe_predictions

    if not result or "test_predictions" not in result or not result["test_predictions"]:
        return result
    return {**result, "test_predictions": describe_predictions(result["test_predictions"])}


def _nothing_recorded(args: argparse.Namespace) -> int:
    """A reading action on a cache folder that does not exist (`Workspace.from_env` has warned):
    an empty answer, and no database created."""
    if args.action in ("list", "groups"):
        print("no runs yet" if args.action == "list" else "no finished runs yet")
        write_json(getattr(args, "json", None), {"runs" if args.action == "list" else "groups": []})
        return 0
    raise ValueError(f"No runs are recorded in {args.workspace.root}: the folder does not exist.")


def _as_queued(name: str | None, queued_as) -> list[str] | None:
    """A ``--model`` / ``--data`` filter: the name as typed and as runs queued from here store it
    (a relative path made absolute: `tunescope.commands.options.data_name`)."""
    if name is None:
        return None
    return list(dict.fromkeys([name, queued_as(name)]))


def _groups(db, args: argparse.Namespace) -> int:
    from analysis.runs.results import results_table, summarise

    runs = db.list_runs(
        model=_as_queued(args.model, model_name), data=_as_queued(args.data, data_name)
    )
    summary = summarise(results_table(runs))
    if summary.empty:
        print("no finished runs yet")
    else:
        shown = summary[GROUP_COLUMNS].rename(columns={"step_time_s": "step_time_s (median)"})
        print(shown.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.json:  # step_time_s: the median over seeds; step_time_s_mean: the mean
        write_json(args.json, {"groups": json_ready(summary)})
    return 0


def _compare(db, args: argparse.Namespace) -> int:
    from analysis.compare import Arm, compare
    from analysis.runs.record import runs_of
    from analysis.runs.results import resolve_group

    runs = db.list_runs(status="done")
    arms = []
    for ref in (args.a, args.b):
        group = resolve_group(runs, ref)
        records = [run.result or {} for run in runs_of(group)]
        arms.append((group, Arm.from_results(str(group["label"].iloc[0]), records)))
    (group_a, arm_a), (group_b, arm_b) = arms
    metrics = {m for m in (arm_a.metric, arm_b.metric) if m}
    if len(metrics) > 1:
        raise ValueError(f"A and B are scored with different metrics ({', '.join(metrics)}).")
    result = compare(arm_a, arm_b, "A", "B")
    for name, group, arm in (("A", group_a, arm_a), ("B", group_b, arm_b)):
        seeds = ", ".join(str(s) for s in sorted(group["seed"]))
        print(f"{name}: {arm.name} · group {group['group'].iloc[0]} · seeds {seeds}")
    lo, hi = result.interval()
    paired = "-" if result.paired_p is None else f"{result.paired_p:.3f}"
    print(
        f"diff (A − B) {result.diff:+.4f} ± {result.se:.4f} (± t·se, Welch: [{lo:+.4f}, {hi:+.4f}]); "
        f"verdict: {result.verdict}; paired bootstrap p = {paired}"
    )
    payload = {
        **result.to_dict(),
        "label_a": arm_a.name,
        "label_b": arm_b.name,
        "group_a": str(group_a["group"].iloc[0]),
        "group_b": str(group_b["group"].iloc[0]),
        "runs_a": group_a["id"].tolist(),
        "runs_b": group_b["id"].tolist(),
        "metric": metrics.pop() if metrics else None,
    }
    write_json(args.json, payload)
    return 0


def _import(args: argparse.Namespace) -> int:
    from analysis.runs.db import RunsDB
    from analysis.runs.imported import import_folder

    flags = {"metric": args.metric, "recipe": args.recipe, "seed": args.seed}
    ids = import_folder(
        args.folder, model_name=args.model, data_name=args.data, cache=args.workspace,
        **{name: value for name, value in flags.items() if value is not None},
    )  # fmt: skip
    if not ids:
        print(f"nothing new: the runs in {args.folder} are in the runs database already")
    db = RunsDB(args.workspace)
    for run_id in ids:
        run = db.get_run(run_id)
        result = run["result"] or {}
        score = result.get("score")
        shown = f"{result.get('metric')} {score:.4f}" if score is not None else run["status"]
        print(f"imported run {run_id} ({run['label']}, {shown})")
    return 0
