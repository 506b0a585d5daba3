"""``runs``: list, show, export, cancel, annotate and delete the fine-tuning runs kept in the
runs database."""

from __future__ import annotations

import argparse
import json

from analysis.commands.options import apply_cache, write_json

NAME = "runs"
HELP = "list, show, export, cancel, annotate (note, tag) or delete fine-tuning runs"
LIST_COLUMNS = ["id", "status", "model", "data", "method", "label", "seed", "score", "metric"]


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
    cancel = sub.add_parser("cancel", help="cancel a queued or running run")
    cancel.add_argument("id", help="run id (or a unique part of it)")
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


def run(args: argparse.Namespace) -> int:
    from analysis.runs.db import RunsDB

    apply_cache(args)
    db = RunsDB()
    db.reap_dead()
    if args.action in ("list", "export"):
        filters = {
            "model": args.model,
            "data": args.data,
            "method": args.method,
            "status": args.status,
            "sweep_id": args.sweep,
            "tag": args.tag,
        }
    if args.action == "list":
        table = db.list_runs(**filters)
        if table.empty:
            print("no runs yet")
        else:
            print(table[LIST_COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        if args.json:
            write_json(
                args.json, {"runs": json.loads(table.to_json(orient="records", date_format="iso"))}
            )
        return 0
    if args.action == "show":
        record = db.get_run(args.id)
        steps = db.steps(record["id"])
        head = {k: v for k, v in record.items() if k not in ("config", "result")}
        for key, value in head.items():
            print(f"{key:>16}: {value}")
        print("          config:", json.dumps(record["config"], indent=2, sort_keys=True))
        print("          result:", json.dumps(record["result"], indent=2, sort_keys=True))
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
            print(f"wrote {db.export_csv(args.csv, **filters)} runs to {args.csv}")
        if args.json:
            print(f"wrote {db.export_json(args.json, **filters)} runs to {args.json}")
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
    status = db.request_cancel(args.id)
    run_id = db.resolve_id(args.id)
    if status == "running":
        print(f"run {run_id}: cancel requested; it stops at its next step")
    else:
        print(f"run {run_id}: {status}")
    return 0
