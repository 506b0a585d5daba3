"""IA³, a method added in one file (analysis/finetune/methods/ia3.py): it trains its vectors and
the classifier only; it is on the CLI (finetune, sweep), the Fine-tune page, the runs table and
the figures; its recipe's adapter_config.json loads with ``PeftConfig.from_pretrained`` +
``get_peft_model`` and trains the same entries; and a ``transformers.Trainer`` run of it is
recorded by the callback as method ia3."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from apptest_utils import errors, make_app, open_page

from analysis.config import ModelSpec
from analysis.export.build import build_recipe, write_recipe
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.methods.ia3 import SPEC, IA3Options
from analysis.models import load_model
from analysis.runs.callback import TunescopeCallback, recognised
from analysis.runs.db import RunsDB
from tunescope.cli import main

WORDS = ["good", "great", "fun", "bad", "awful", "dull"]


def tiny_args(model_dir, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--data", "movie-snippets", "--batch-size", "4",
            "--n-train", "16", "--n-eval", "8", "--device", "cpu", *extra]  # fmt: skip


def widget(elements, label: str):
    return next(w for w in elements if w.label == label)


def test_ia3_trains_on_the_cli_and_is_a_sweep_strategy(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "result.json"
    argv = ["finetune", *tiny_args(tiny_bert_dir, "--method", "ia3", "--ia3-layers", "2")]
    assert main([*argv, "--steps", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["method"] == "ia3" and result["config"]["options"] == {
        "layers_to_transform": [2]
    }
    assert result["config"]["lr"] == SPEC.default_lr
    assert "IA³ vectors on key, value and feed-forward of layers 2" in result["description"]
    run = RunsDB().get_run(result["run_id"])
    assert run["status"] == "done" and run["label"] == "ia3 2"

    plan = tmp_path / "plan.json"
    sweep = ["sweep", *tiny_args(tiny_bert_dir), "--strategies", "ia3,bitfit", "--l-star", "1"]
    assert main([*sweep, "--ia3-layers", "1", "--dry-run", "--json", str(plan)]) == 0
    assert {r["method"] for r in json.loads(plan.read_text())["runs"]} == {"ia3", "bitfit"}

    assert main(["finetune", *tiny_args(tiny_bert_dir, "--method", "full", "--ia3-layers", "1")])
    assert "--ia3-layers is an option of --method ia3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    assert "--ia3-layers" in capsys.readouterr().out


def test_ia3_on_the_page_in_the_runs_table_and_in_the_figures(tiny_bert_dir, monkeypatch):
    import analysis.runs.worker as worker
    from ui.figures.finetune import display_family, family_colours

    monkeypatch.setattr(worker, "start_workers", lambda executor, root: "no worker in this test")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    widget(at.selectbox, "Method (one run)").set_value("ia3").run()
    assert not errors(at), errors(at)
    widget(at.multiselect, "IA³ layers").set_value([1])
    widget(at.number_input, "Steps").set_value(2)
    widget(at.text_input, "Seeds").set_value("0")  # one run (the page's default is 3 seeds)
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    (run,) = RunsDB().list_runs().itertuples()
    assert run.method == "ia3" and run.label == "ia3 1"
    at.switch_page("views/runs.py").run()
    assert not errors(at), errors(at)
    assert at.dataframe[0].value["label"].tolist() == ["ia3 1"]
    assert display_family("baseline", "ia3") == "ia3"
    assert family_colours()["ia3"] == SPEC.colour


@pytest.fixture(scope="module")
def bert(tiny_bert_dir):
    return load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")


def test_an_ia3_recipe_loads_in_peft_and_trains_what_tunescope_trains(bert, tmp_path):
    from peft import IA3Config, PeftConfig, get_peft_model

    cfg = flat_config(model={"name": str(bert.spec.name)}, method="ia3", ia3_layers=[2])
    recipe = build_recipe(cfg, bert, n_outputs=2)
    write_recipe(recipe, tmp_path / "recipe")
    assert recipe["train"]["peft"] == {"peft_type": "IA3", "layers": [2],
                                       "adapter_config": "adapter_config.json",
                                       "n_trainable": recipe["train"]["n_trainable_body"]}  # fmt: skip
    config = PeftConfig.from_pretrained(str(tmp_path / "recipe"))
    assert isinstance(config, IA3Config)
    assert config.target_modules == {"layer.1.attention.self.key", "layer.1.attention.self.value",
                                     "layer.1.output.dense"}  # 0-based: layer 2  # fmt: skip
    assert config.feedforward_modules == {"layer.1.output.dense"}
    model = tf.AutoModelForSequenceClassification.from_pretrained(bert.spec.name, num_labels=2)
    model = get_peft_model(model, config)
    vectors = {n: p.numel() for n, p in model.named_parameters() if ".ia3_l." in n}
    assert len(vectors) == 3 and all(p.requires_grad for n, p in model.named_parameters()
                                     if ".ia3_l." in n)  # fmt: skip
    d_model, d_ff = bert.d_model, bert.model.config.intermediate_size
    assert sum(vectors.values()) == 2 * d_model + d_ff == recipe["train"]["n_trainable_body"]
    assert recognised(model) == ("ia3", {})


def examples(tokenizer, n: int = 8):
    rows = []
    for i in range(n):
        label = i % 2
        text = " ".join(WORDS[3 * label + (i + j) % 3] for j in range(3))
        rows.append({**tokenizer(text), "labels": label})
    return rows


def test_a_trainer_run_of_ia3_is_recorded_as_ia3(bert, tmp_path):
    from peft import IA3Config, get_peft_model

    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(bert.spec.name, num_labels=2)
    model = get_peft_model(model, IA3Config(task_type="SEQ_CLS", target_modules=["key", "value"],
                                            feedforward_modules=[]))  # fmt: skip
    callback = TunescopeCallback(bert.spec.name, "toy")
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = tf.Trainer(
        model=model, args=args, train_dataset=examples(bert.tokenizer),
        data_collator=tf.DataCollatorWithPadding(bert.tokenizer), callbacks=[callback],
    )  # fmt: skip
    trainer.train()
    (run,) = RunsDB().list_runs().itertuples()
    assert run.method == "ia3" and run.status == "done"
    config = RunsDB().get_run(run.id)["config"]
    assert config["method"] == "ia3" and config["options"] == {}
    assert config["origin"]["model_class"] == "BertForSequenceClassification"
    assert config["eval_every"] is None  # what ran: this Trainer never evaluated
    setting = {k: v for k, v in config.items() if k != "origin"} | {"eval_every": 50}
    assert isinstance(FinetuneConfig.from_dict(setting).options, IA3Options)
