"""``python -m tunescope claims`` end to end on a tiny model: layer claims from repeats, a heads
claim and the disable experiment through real (very short) runs trained by the worker."""

from __future__ import annotations

import json

import pytest

from analysis.runs.db import RunsDB
from analysis.workspace import Workspace
from tunescope.cli import main

pytestmark = pytest.mark.usefixtures("stop_leftover_worker")


def tiny(model_dir, *extra: str) -> list[str]:
    return [
        "claims", "--model", str(model_dir), "--n", "40", "--repeats", "2", "--heads-n", "12",
        "--seeds", "2", "--steps", "2", "--batch-size", "4", "--n-train", "24", "--n-eval", "12",
        "--eval-every", "2", "--poll", "0.5", *extra,
    ]  # fmt: skip


def test_claims_cli_measures_queues_waits_and_reports(tiny_bert_dir, tmp_path, capsys):
    out, report = tmp_path / "claims.json", tmp_path / "report" / "claims.md"
    argv = tiny(tiny_bert_dir, "--only", "X1,X2,H1,S2", "--json", str(out),
                "--report", str(report))  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(out.read_text())
    assert payload["model"] == str(tiny_bert_dir) and payload["data"] == "movie-snippets"
    by_id = {c["id"]: c for c in payload["claims"]}
    assert list(by_id) == ["X1", "X2", "H1", "S2"]
    for claim in by_id.values():
        assert claim["verdict"] in (
            "holds", "holds weakly", "does not hold", "inconclusive", "unstable"
        ), claim  # fmt: skip
        assert claim["paper"] and claim["claim"]
    # R = 2 < 50: standard errors, no interval, so X1 cannot hold on any sample
    assert by_id["X1"]["repeats"] == 2 and by_id["X1"]["interval"] is None
    assert by_id["X1"]["verdict"] == "inconclusive"
    assert len(by_id["X1"]["values"]["samples"]) == 3  # S = 3 by default
    assert "N = 40, R = 2, S = 3" in by_id["X1"]["detail"]
    assert by_id["H1"]["n_seeds"] == 2 and len(by_id["H1"]["runs"]) == 4
    assert by_id["S2"]["n_seeds"] == 2 and len(by_id["S2"]["runs"]) == 5  # + the trajectory run
    runs = RunsDB().list_runs()
    assert set(runs["status"]) == {"done"} and len(runs) == 4 + 1 + 4  # + the trajectory run
    said = capsys.readouterr().err  # what _drive says goes to stderr (stdout: the JSON, with -)
    assert "queueing 5 runs" in said and "disable experiment" in said
    text = report.read_text()
    assert "| X1 |" in text and "## S2" in text and "claims-H1.html" in text
    assert (report.parent / "claims-H1.html").is_file()
    assert (report.parent / "plotly.min.js").is_file()

    # A second call reuses every finished run: nothing is queued, the verdicts stand.
    assert main(tiny(tiny_bert_dir, "--only", "H1,S2", "--json", str(out))) == 0
    assert "queueing" not in capsys.readouterr().err
    assert len(RunsDB().list_runs()) == 9
    again = {c["id"]: c for c in json.loads(out.read_text())["claims"]}
    assert again["H1"]["ours"] == by_id["H1"]["ours"]


def test_claims_cli_bad_input(tiny_bert_dir, capsys):
    assert main(tiny(tiny_bert_dir, "--only", "X9")) == 2
    assert "Unknown claim X9" in capsys.readouterr().err
    assert main(tiny(tiny_bert_dir, "--seeds", "0")) == 2


def test_claims_cli_checks_the_executor_flags_before_loading_the_model(
    tiny_bert_dir, capsys, monkeypatch
):
    import analysis.models

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the executor flags were checked")

    monkeypatch.setattr(analysis.models, "load_model", load_model)
    assert main(tiny(tiny_bert_dir, "--only", "H1", "--ray-address", "h:1")) == 2
    assert "--ray-address and --ray-cpus-per-run go with --executor ray" in capsys.readouterr().err


def test_drive_says_what_it_does_on_stderr_only(tmp_path, capsys, monkeypatch):
    """With ``--json -`` stdout must hold the JSON alone: queueing, the disable experiment and
    waiting are said on stderr."""
    from types import SimpleNamespace

    from analysis import claims
    from tunescope.commands import claims as command

    planned = [SimpleNamespace(key=("H1 pagerank", 0))]
    written, states = [], iter(["queued", "done"])
    monkeypatch.setattr(command, "_has_disable_files", lambda root, source: bool(written))
    monkeypatch.setattr(claims, "source_run", lambda cfg, runs: {"id": "r1", "status": "done"})
    monkeypatch.setattr(
        claims, "write_disable_files", lambda db, source, seeds: written.append(1) or ("f", 7)
    )
    monkeypatch.setattr(claims, "plan_runs", lambda cfg, inputs, source, root: planned)
    monkeypatch.setattr(claims, "missing_runs", lambda plan, runs: plan)
    monkeypatch.setattr(claims, "estimate_seconds", lambda missing, runs: (60.0, "timed"))
    monkeypatch.setattr(claims, "queue_runs", lambda *args: [])
    monkeypatch.setattr(
        claims, "run_status", lambda plan, runs: {p.key: {"status": next(states)} for p in plan}
    )
    cfg = SimpleNamespace(
        model=SimpleNamespace(name="m"), data=SimpleNamespace(name="d"), only=("S2",), seeds=(0,)
    )
    db = RunsDB(Workspace(tmp_path))
    assert command._drive(db, cfg, None, "s", None, wait=True, poll=0.0) == planned
    out, err = capsys.readouterr()
    assert out == ""
    assert "disable experiment: 7 outlier weights" in err and "queueing 1 run" in err
    assert "waiting for 1 run" in err


def test_every_flag_default_and_help_is_the_configs():
    """The Paper check's defaults are stated once, on ClaimsConfig's fields (its options are added
    when `claims` is parsed: building the command line imports no torch, tests/test_api.py)."""
    from analysis.claims import ClaimsConfig
    from analysis.config import help_of
    from tunescope.cli import build_parser
    from tunescope.commands.claims import config_from_args

    parser = build_parser()
    assert config_from_args(parser.parse_args(["claims"])) == ClaimsConfig()
    command = parser._subparsers._group_actions[0].choices["claims"]
    helps = {a.dest: a.help for a in command._actions}
    for dest in ("only", "steps", "n", "repeats", "k", "heads_n"):
        assert helps[dest] == help_of(ClaimsConfig, dest).replace("%", "%%")
    assert helps["seed"] == help_of(ClaimsConfig, "sample_seed")
