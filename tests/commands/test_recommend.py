"""``python -m tunescope recommend`` end to end on a tiny model: candidates with cost and evidence,
``--compare --wait`` training every arm through the worker, ``--json`` / ``--report`` /
``--recipe``; a LoRA allocation taken home loads in PEFT; bad input gets one line."""

from __future__ import annotations

import json

import pytest

from analysis.runs.db import RunsDB
from analysis.words import counted
from tunescope.cli import main

pytestmark = pytest.mark.usefixtures("stop_leftover_worker")
KEYS = {"model", "data", "budget", "design", "candidates", "comparison", "runs_trained",
        "recommendation"}  # fmt: skip


def tiny(model_dir, *extra: str) -> list[str]:
    return [
        "recommend", "--model", str(model_dir), "--n", "40", "--repeats", "2", "--heads-n", "12",
        "--timed-steps", "1", "--lora-r", "2", "--steps", "2", "--batch-size", "4",
        "--n-train", "24", "--n-eval", "12", "--eval-every", "2", "--poll", "0.5", *extra,
    ]  # fmt: skip


def test_recommend_compares_waits_and_writes_json_report_and_recipe(
    tiny_bert_dir, tmp_path, capsys
):
    out, report, recipe = tmp_path / "rec.json", tmp_path / "rec.html", tmp_path / "recipe"
    argv = tiny(tiny_bert_dir, "--compare", "--wait", "--design", "fixed", "--seeds", "1",
                "--json", str(out), "--report", str(report))  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(out.read_text())
    assert set(payload) == KEYS and payload["model"] == str(tiny_bert_dir)
    assert payload["budget"]["kind"] is None and payload["design"]["kind"] == "fixed"
    assert payload["candidates"] and all(
        0 < c["trainable_share"] <= 1 for c in payload["candidates"]
    )
    arms = {row["arm"]: row for row in payload["comparison"]}
    runs = RunsDB().list_runs()
    assert set(runs["status"]) == {"done"} and len(runs) == len(arms)  # one seed per arm
    assert arms["full fine-tuning"]["verdict"] == "reference"
    assert {"BitFit", "EVA LoRA r=2", "uniform LoRA r=2"} <= set(arms)
    assert all(row["n_seeds"] == 1 for row in arms.values())
    assert payload["runs_trained"] == len(arms)
    # one seed a side: no interval, so no arm can be shown to hold up (nor to lose)
    assert payload["recommendation"]["candidate"] is None
    printed = capsys.readouterr()
    assert "queued" in printed.err and "arm" in printed.out and "total" in printed.out
    # before anything trained, the time comes from every arm's timed steps × its steps
    assert (
        f"of training here ({counted(len(arms), 'run')} from timed steps × (steps + evaluation))"
        in printed.err
    )
    assert report.read_text().startswith("<!DOCTYPE html>")

    # Again: every finished run is reused, nothing is queued; a candidate's recipe goes home.
    name = payload["candidates"][0]["name"]
    assert main(tiny(tiny_bert_dir, "--compare", "--design", "fixed", "--seeds", "1", "--recipe",
                     str(recipe), "--candidate", name)) == 0  # fmt: skip
    assert "queued 0 runs (" in capsys.readouterr().err and len(RunsDB().list_runs()) == len(arms)
    assert (recipe / "recipe.json").is_file() or (recipe / "adapter_config.json").is_file()


def test_sequential_rounds_go_on_in_the_worker_until_the_design_is_spent(tiny_bert_dir, capsys):
    """The default design: every arm starts with 2 seeds here; the worker that records a run's
    end queues the next round (one more seed to full and every undecided arm), up to 3. (Two
    steps teach the tiny model nothing, so full fine-tuning may stay at chance: then the sentence
    says so, whatever the rows.)"""
    argv = tiny(tiny_bert_dir, "--compare", "--wait", "--seeds", "2", "--max-seeds", "3",
                "--json", "-")  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["design"] == {
        "kind": "sequential", "r0": 2, "max_seeds": 3, "alpha": 0.025, "delta": 1.0,
        "test": "welch",
        "boundary": "Bonferroni over 2 looks: c = t(1 − α/2, Welch–Satterthwaite df)",
    }  # fmt: skip
    rows = {row["arm"]: row for row in payload["comparison"]}
    runs = RunsDB().list_runs()
    assert set(runs["status"]) <= {"done", "cancelled"}
    done = runs[runs["status"] == "done"]
    assert done.groupby("group_key")["seed"].nunique().max() <= 3  # R_max at most
    full = rows.pop("full fine-tuning")
    assert full["status"] is None and full["n_seeds"] >= max(r["n_seeds"] for r in rows.values())
    for row in rows.values():
        if row["verdict"] == "no verdict: both at chance level":
            continue
        assert row["status"] in ("held up", "shown worse", "undecided", "not needed")
        assert row["test"] == "welch"  # the seed design's: independent seeds
        if row["status"] != "not needed":  # judged: r₀ seeds at least
            assert row["n_seeds"] >= 2
        if row["status"] == "undecided":  # an undecided arm got every seed the design has
            assert row["n_seeds"] == 3
        if row["lo"] is not None:
            assert row["lo"] <= row["diff_vs_full"] <= row["hi"]
    assert payload["runs_trained"] == len(done)
    said = payload["recommendation"]
    assert said["final"] is True and said["branch"] in ("recommend", "none held up", "undecided",
                                                        "full at chance")  # fmt: skip


def test_a_lora_allocation_goes_home_as_the_lora_recipe_with_its_peft_config(
    tiny_bert_dir, tmp_path
):
    from peft import LoraConfig

    from analysis.config import ModelSpec
    from analysis.models import load_model
    from analysis.recommend.allocation import allocate_lora
    from analysis.recommend.choices import Choice, Proposal
    from analysis.recommend.config import RecommendConfig
    from analysis.recommend.evidence import Evidence
    from analysis.recommend.recommendation import Recommendation, take_home

    loaded = load_model(ModelSpec(str(tiny_bert_dir)))
    alloc = allocate_lora([0.5, 0.8, 0.85], r=2, alpha=4)  # gains 0.3, 0.05: total 4 → 3, 1
    choice = Choice("LoRA by probe gain", "candidate", "lora", "LoRA", "probe",
                    options=alloc.options(), lora=alloc)  # fmt: skip
    evidence = Evidence(n_layers=2, n_heads=4, d_model=32, family="bert", metric="accuracy",
                        n_outputs=2, table=None, l_star=2, repeats=1)  # fmt: skip
    rec = Recommendation(RecommendConfig(model=loaded.spec), evidence, Proposal([choice]), None)
    files = take_home(rec, "LoRA by probe gain", tmp_path / "home", loaded)
    assert {"adapter_config.json", "recipe.json", "README.md"} <= {f.name for f in files}
    config = LoraConfig.from_pretrained(tmp_path / "home")
    assert config.layers_to_transform == [0, 1] and config.task_type == "SEQ_CLS"
    assert config.rank_pattern == {"layer.0.attention.self.query": 3,
                                   "layer.0.attention.self.value": 3,
                                   "layer.1.attention.self.query": 1,
                                   "layer.1.attention.self.value": 1}  # fmt: skip
    assert config.alpha_pattern["layer.0.attention.self.query"] == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [(("--budget", "speed=0.5"), "--budget takes params=SHARE or time=SHARE"),
     (("--wait",), "--wait goes with --compare"),
     (("--report", "rec.md"), "give FILE.html"),
     (("--seeds", "0,0"), "distinct")],
)  # fmt: skip
def test_bad_input_gets_one_line(tiny_bert_dir, capsys, extra, message):
    assert main(tiny(tiny_bert_dir, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_every_flag_default_and_help_is_the_configs():
    """The defaults are stated once, on RecommendConfig's fields: the parser's defaults build
    that config, and each flag says its field's help."""
    from analysis.config import help_of
    from analysis.recommend.config import RecommendConfig
    from tunescope.cli import build_parser
    from tunescope.commands.recommend import config_from_args

    parser = build_parser()
    assert config_from_args(parser.parse_args(["recommend"])) == RecommendConfig()
    command = parser._subparsers._group_actions[0].choices["recommend"]
    helps = {a.dest: a.help for a in command._actions}
    fields = {"seed": "sample_seed"}  # the flag's name where it is not the field's
    for dest in ("n", "seed", "pooling", "max_length", "repeats", "heads_n", "k", "lora_r",
                 "lora_alpha", "delta", "timed_steps", "steps", "batch_size", "n_train",
                 "n_eval", "eval_every"):  # fmt: skip
        assert helps[dest] == help_of(RecommendConfig, fields.get(dest, dest))
    assert helps["seeds"].startswith(help_of(RecommendConfig, "seeds"))
