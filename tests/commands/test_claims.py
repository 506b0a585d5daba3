"""``python -m analysis claims`` end to end on a tiny model: layer claims from repeats, a heads
claim and the disable experiment through real (very short) runs trained by the worker."""

from __future__ import annotations

import json

import pytest

from analysis.cli import main
from analysis.runs.db import RunsDB

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
            "holds", "holds weakly", "does not hold", "inconclusive"
        ), claim  # fmt: skip
        assert claim["paper"] and claim["claim"]
    assert by_id["X1"]["repeats"] == 2 and len(by_id["X1"]["interval"]) == 2
    assert by_id["H1"]["n_seeds"] == 2 and len(by_id["H1"]["runs"]) == 4
    assert by_id["S2"]["n_seeds"] == 2 and len(by_id["S2"]["runs"]) == 5  # + the trajectory run
    runs = RunsDB().list_runs()
    assert set(runs["status"]) == {"done"} and len(runs) == 4 + 1 + 4  # + the trajectory run
    printed = capsys.readouterr().out
    assert "queueing 5 run(s)" in printed and "disable experiment" in printed
    text = report.read_text()
    assert "| X1 |" in text and "## S2" in text and "claims-H1.html" in text
    assert (report.parent / "claims-H1.html").is_file()
    assert (report.parent / "plotly.min.js").is_file()

    # A second call reuses every finished run: nothing is queued, the verdicts stand.
    assert main(tiny(tiny_bert_dir, "--only", "H1,S2", "--json", str(out))) == 0
    assert "queueing" not in capsys.readouterr().out
    assert len(RunsDB().list_runs()) == 9
    again = {c["id"]: c for c in json.loads(out.read_text())["claims"]}
    assert again["H1"]["ours"] == by_id["H1"]["ours"]


def test_claims_cli_bad_input(tiny_bert_dir, capsys):
    assert main(tiny(tiny_bert_dir, "--only", "X9")) == 2
    assert "Unknown claim X9" in capsys.readouterr().err
    assert main(tiny(tiny_bert_dir, "--seeds", "0")) == 2
