"""A method added in one file (tests/dummy_method.py) shows on the CLI, the page and in the runs
table, with its options (stored under its own name only), its default learning rate, its label
and its colour."""

from __future__ import annotations

from dataclasses import dataclass

import dummy_method
import pytest
from apptest_utils import errors, make_app, open_page

from analysis.config import setting
from analysis.finetune.config import FinetuneConfig, flat_config
from analysis.finetune.registry import method_names, register, sweep_methods, unregister
from analysis.runs.db import RunsDB
from analysis.runs.records import run_label
from analysis.strategies import strategy_names
from tunescope.cli import build_parser
from tunescope.commands.options import finetune_config, refuse_foreign_flags


@dataclass(frozen=True)
class SubspaceLike:
    """Options with a source run (kind ``run``), as the subspace methods have."""

    source: str | None = setting(None, help="a run id", flat="dummy_from", kind="run")


@pytest.fixture
def dummy():
    register(dummy_method.SPEC)
    yield dummy_method.SPEC
    unregister("dummy")


def widget(elements, label: str):
    return next(w for w in elements if w.label == label)


def test_a_registered_method_is_a_config_with_its_own_options(dummy):
    assert "dummy" in method_names() and "dummy" in sweep_methods() and "dummy" in strategy_names()
    cfg = flat_config(method="dummy", dummy_scale=0.5, dummy_layers=[2])
    assert cfg.lr == 3e-3 and cfg.options == dummy_method.DummyOptions(0.5, (2,))
    stored = cfg.to_dict()
    assert stored["options"] == {"scale": 0.5, "layers": [2]}
    assert FinetuneConfig.from_dict(stored) == cfg
    assert run_label(stored) == "dummy ×0.5"
    # Only its own runs store its options: every other config is as it was without it.
    assert "dummy" not in str(flat_config(method="full").to_dict())
    with pytest.raises(ValueError, match="dummy_scale is only used by method 'dummy'"):
        flat_config(method="full", dummy_scale=3.0)
    with pytest.raises(ValueError, match="dummy_scale must be positive"):
        flat_config(method="dummy", dummy_scale=-1.0)
    with pytest.raises(ValueError, match="exists already"):
        register(dummy)


def test_a_registered_method_has_its_colour_in_the_figures(dummy):
    from ui.figures.finetune import display_family, family_colours

    assert display_family("baseline", "dummy") == "dummy"
    assert family_colours()["dummy"] == "#000000"
    assert display_family("baseline", "full") == "baseline"  # full: its strategy's colour


def test_a_registered_method_gets_its_cli_flags(dummy, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["finetune", "--help"])
    out = capsys.readouterr().out
    assert "--dummy-scale" in out and "--dummy-layers" in out and "dummy" in out
    args = build_parser().parse_args(
        ["finetune", "--method", "dummy", "--dummy-scale", "4", "--dummy-layers", "1"]
    )
    cfg = finetune_config(args, method="dummy", layers=None, seed=0)
    assert cfg.options == dummy_method.DummyOptions(4.0, (1,))
    refuse_foreign_flags(args, {"dummy"})
    with pytest.raises(ValueError, match="--dummy-scale is an option of --method dummy"):
        refuse_foreign_flags(args, {"full"})


def test_a_registered_method_is_on_the_page_form_and_in_the_runs_table(
    dummy, tiny_bert_dir, monkeypatch
):
    import analysis.runs.worker as worker

    monkeypatch.setattr(worker, "start_workers", lambda executor, root: "no worker in this test")
    at = open_page(make_app(tiny_bert_dir, monkeypatch), "views/finetune.py")
    assert not any(w.label == "Dummy scale" for w in at.number_input)  # only the chosen method's
    widget(at.selectbox, "Method (one run)").set_value("dummy").run()
    assert not errors(at), errors(at)
    widget(at.number_input, "Dummy scale").set_value(0.25)
    widget(at.multiselect, "Dummy layers").set_value([1])
    widget(at.number_input, "Steps").set_value(2)
    widget(at.number_input, "Train examples (0 = all)").set_value(16)
    widget(at.number_input, "Dev/test examples scored").set_value(8)
    widget(at.text_input, "Seeds").set_value("0")  # one run (the page's default is 3 seeds)
    widget(at.button, "Estimate time").click().run()  # times 2 steps of the dummy here
    assert not errors(at), errors(at)
    assert any("one dummy run" in i.value for i in at.info)
    widget(at.button, "Queue").click().run()
    assert not errors(at), errors(at)
    (run,) = RunsDB().list_runs().itertuples()
    assert run.method == "dummy" and run.label == "dummy ×0.25"
    at.switch_page("views/runs.py").run()
    assert not errors(at), errors(at)
    table = at.dataframe[0].value
    assert table["label"].tolist() == ["dummy ×0.25"] and table["method"].tolist() == ["dummy"]


def test_a_registered_method_exports_as_a_recipe(dummy, tiny_bert_dir, tmp_path):
    import json

    from tunescope.cli import main

    out = tmp_path / "recipe"
    argv = ["export", "--method", "dummy", "--dummy-layers", "1", "--model", str(tiny_bert_dir)]
    assert main([*argv, "--out", str(out)]) == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["method"] == "dummy" and recipe["optimizer"]["lr"] == 3e-3
    assert recipe["train"]["params"] and all(
        name.startswith("encoder.layer.0.") and "LayerNorm" in name
        for name in recipe["train"]["params"]
    )
    assert recipe["provenance"]["config"]["options"]["layers"] == [1]


def test_a_method_without_an_export_hook_is_refused(tiny_bert_dir):
    import dataclasses

    from analysis.config import ModelSpec
    from analysis.export.build import build_recipe
    from analysis.models import load_model

    register(dataclasses.replace(dummy_method.SPEC, name="dummy-plain", sweep=None, export=None))
    try:
        cfg = flat_config(model={"name": str(tiny_bert_dir)}, method="dummy-plain")
        loaded = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
        with pytest.raises(ValueError, match="'dummy-plain' cannot be exported: it declares no"):
            build_recipe(cfg, loaded, 2)
    finally:
        unregister("dummy-plain")


def test_what_other_code_asks_of_a_method_is_its_spec(dummy):
    import dataclasses

    from analysis.finetune.config import canonical
    from analysis.runs.comparisons import comparison_group
    from analysis.strategies import family_of, n_tuned_layers

    # Declared nothing more: not the reference, not random, no source run or heads, its own name.
    assert not dummy.reference and not dummy.random and dummy.canonical is dummy.migrate is None
    assert dummy.option_field("layers").flat == "dummy_layers"
    assert dummy.option_field("run") is dummy.option_field("heads") is None
    cfg = flat_config(method="dummy")
    assert canonical(cfg, 4) is cfg
    assert comparison_group({"method": "dummy"}, ("src",), None) is None
    assert family_of(None, "dummy", None, 4) == "baseline"  # a sweep's whole-model method
    assert n_tuned_layers(None, "dummy", 4) is None
    # The same method declared the reference, then a random arm that reads a source run.
    register(dataclasses.replace(dummy, name="dummy-ref", sweep=None, reference=True))
    register(dataclasses.replace(dummy_method.SPEC, name="dummy-arm", sweep=None, random=True,
                                 options=SubspaceLike))  # fmt: skip
    try:
        assert comparison_group({"method": "dummy-ref"}, (), None) == "full"
        assert family_of(None, "dummy-ref", None, 4) == "baseline"
        assert n_tuned_layers(None, "dummy-ref", 4) == 4
        arm = {"method": "dummy-arm", "dummy_from": "src"}
        assert comparison_group(arm, ("src",), None) == "random subspace"
        assert comparison_group(arm, ("other",), None) is None
    finally:
        unregister("dummy-ref")
        unregister("dummy-arm")
