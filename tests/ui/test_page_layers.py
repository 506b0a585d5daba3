"""The Layers page (AppTest on a tiny model) and its figure builders (fig.data / fig.layout)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from apptest_utils import errors, make_app, open_page, open_tab

from analysis.config import ExtractConfig, SampleSpec
from analysis.layers import table, teaching, whatif
from ui.figures import layers as figures
from ui.layers.whatif import parse_ladder, plan

PAGE = "views/layers.py"


def layers_page(tiny_bert_dir, monkeypatch, n: int = 40):
    return open_page(make_app(tiny_bert_dir, monkeypatch, n=n), PAGE)


def test_layers_page_renders_metrics_picture_and_teaching(tiny_bert_dir, monkeypatch):
    at = layers_page(tiny_bert_dir, monkeypatch)
    assert not errors(at)
    table = at.dataframe[0].value
    metrics = ["nu", "cca", "rank", "probe"]
    bounds = [f"{m}_{end}" for m in metrics for end in ("lo", "hi")]
    assert list(table.columns) == [
        "layer",
        *metrics,
        "probe_c",
        *(f"{m}_se" for m in metrics),
        *bounds,
    ]  # R = 50 by default: 90 % intervals around each value
    for m in metrics:  # every shown interval contains its estimate
        ok = table[f"{m}_lo"].notna()
        assert (table.loc[ok, f"{m}_lo"] <= table.loc[ok, m]).all()
        assert (table.loc[ok, m] <= table.loc[ok, f"{m}_hi"]).all()
    assert table["layer"].tolist() == [0, 1, 2]
    l_star = next(iter(at.session_state["suggested_l_star"].values()))
    assert l_star == int(table.loc[table["layer"] >= 1].set_index("layer")["nu"].idxmin())
    star = next(m for m in at.metric if m.label == "ℓ*")
    assert star.value == str(l_star) and star.delta.endswith("of 50 repeats")  # R = 50 default
    box = next(i.value for i in at.info if f"ℓ\\* = {l_star}" in i.value)  # the suggestion box
    assert "of 50 repeats" in box and "ρ(ν, s) = " in box
    # Issue 31: the triple the box recommends is defined where it is used, and the tiles say why
    # the Paper check's X1 gives another ρ for the same settings.
    assert "A strategy is written (ℓ_bottom, ℓ_top, ℓ_cls): layers ℓ_bottom..ℓ_top train" in box
    assert any("X1 and the Layers page give different ρ(ν, s)" in c.value for c in at.caption)
    assert len(at.latex) >= 7  # ν, ℓ*, CCA, ϱ, ρ, ζ, repeats
    charts = at.get("plotly_chart")
    assert len(charts) == 2  # metrics with bands, ℓ* shares: only the chosen tab runs
    bands = [t for t in charts[0].proto.spec and json.loads(charts[0].proto.spec)["data"]
             if t.get("fill") == "toself"]  # fmt: skip
    assert len(bands) == 4
    open_tab(at, "layers_tab", "Layer picture")
    assert not errors(at) and len(at.get("plotly_chart")) == 1
    assert not any(m.label == "ℓ*" for m in at.metric)  # the metrics tab did not run
    open_tab(at, "layers_tab", "Teaching view")
    teaching = [m for m in at.metric if m.label == "CCA score"]
    assert teaching and 0 < float(teaching[0].value) <= 1


def test_one_repeat_shows_the_single_table(tiny_bert_dir, monkeypatch):
    at = layers_page(tiny_bert_dir, monkeypatch)
    at.number_input(key="layers_repeats").set_value(1).run()
    assert not errors(at)
    assert list(at.dataframe[0].value.columns) == [
        "layer",
        "nu",
        "cca",
        "rank",
        "probe",
        "probe_c",
        "probe_se",
    ]
    assert len(at.get("plotly_chart")) == 1  # no bands, no ℓ* shares from one sample
    box = next(i.value for i in at.info if "ℓ\\* = " in i.value)
    assert "of 1 repeats" not in box and "Stable" not in box  # no shares from one sample


def test_layer_slider_and_teaching_sliders_rerun_cleanly(tiny_bert_dir, monkeypatch):
    at = open_tab(layers_page(tiny_bert_dir, monkeypatch), "layers_tab", "Layer picture")
    at.slider(key="layer").set_value(0).run()
    assert not errors(at)
    open_tab(at, "layers_tab", "Teaching view")
    nu_before = next(m.value for m in at.metric if m.label == "ν (lower = tighter, further apart)")
    at.slider(key="teach_spread").set_value(0.3).run()
    assert not errors(at)
    nu_after = next(m.value for m in at.metric if m.label == "ν (lower = tighter, further apart)")
    assert float(nu_after) < float(nu_before)  # tighter classes, lower ν


def test_whatifs_run_and_show_every_group(tiny_bert_dir, monkeypatch):
    at = open_tab(layers_page(tiny_bert_dir, monkeypatch), "layers_tab", "What-ifs")
    at.multiselect(key="whatif_shares").set_value([0.25])
    at.text_input(key="whatif_ladder").set_value("20")
    at.number_input(key="whatif_seeds").set_value(2)
    next(b for b in at.button if b.label == "Run what-ifs").click()
    at.run()
    assert not errors(at)
    results = at.session_state["layers_whatif"]["results"]
    assert list(results) == ["pooling", "imbalance", "scarcity", "seeds"]
    pooling = results["pooling"]["table"]
    assert pooling["setting"].tolist() == ["mean", "first"]
    assert results["seeds"]["curves"]["setting"].nunique() == 2
    assert len(at.get("plotly_chart")) == 4 * 2 + 1  # + one band figure more for seeds


def test_bad_settings_show_a_message_and_teaching_still_works(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.sidebar.number_input(key="n").set_value(2).run()
    at.switch_page(PAGE).run()
    assert not at.exception
    assert errors(at)
    open_tab(at, "layers_tab", "Teaching view")  # needs no model: works all the same
    assert not errors(at)
    assert any(m.label == "CCA score" for m in at.metric)


def test_regression_data_bins_the_scores_and_colours_by_score(tiny_bert_dir, monkeypatch, tmp_path):
    words = ["the", "a", "good", "bad", "movie", "film", "not", "very"]
    rows = [
        {"text": " ".join(words[(i + k) % len(words)] for k in range(5)), "label": (i % 11) * 0.47}
        for i in range(80)
    ]
    path = tmp_path / "scores.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    monkeypatch.setenv("TUNESCOPE_ALLOWED_ROOTS", str(tmp_path))
    at = open_page(make_app(tiny_bert_dir, monkeypatch, n=60, data=str(path)), PAGE)
    assert not errors(at)
    assert any("quantile bins" in w.value for w in at.warning)
    assert any("regression" in w.value.lower() for w in at.warning)
    # the what-ifs offer no imbalance for scores
    open_tab(at, "layers_tab", "What-ifs")
    assert at.multiselect(key="whatif_shares").disabled


# ----------------------------------------------------------------------------------- plans


def test_whatif_plan_and_ladder():
    cfg = ExtractConfig(sample=SampleSpec(n=100, seed=4))
    groups = plan(cfg, True, [0.5, 0.1], [20, 50], 3, classification=True)
    assert list(groups) == ["pooling", "imbalance", "scarcity", "seeds"]
    assert [c.pooling for c in groups["pooling"].values()] == ["mean", "first"]
    share = groups["imbalance"]["p = 0.1"].sample
    assert (share.n, share.scheme, share.share, share.seed) == (100, "share", 0.1, 4)
    assert [c.sample.n for c in groups["scarcity"].values()] == [20, 50]
    assert groups["scarcity"]["N = 20"].sample.scheme == "balanced"
    assert [c.sample.seed for c in groups["seeds"].values()] == [4, 5, 6]
    regression = plan(cfg, False, [0.5], [20], 1, classification=False)
    assert (
        list(regression) == ["scarcity"]
        and regression["scarcity"]["N = 20"].sample.scheme == "random"
    )
    assert parse_ladder("500, 200;200") == [200, 500]
    with pytest.raises(ValueError, match="whole numbers"):
        parse_ladder("200, many")


# ----------------------------------------------------------------------------------- figures


def frame() -> pd.DataFrame:
    return pd.DataFrame(
        {"layer": [0, 1, 2, 3], "nu": [5.0, 2.0, 0.5, 1.0], "cca": [0.2, 0.5, 0.9, 0.8],
         "rank": [9.0, 7.0, 4.0, 5.0], "probe": [0.6, 0.7, 0.9, 0.85]}
    )  # fmt: skip


def test_metrics_figure_has_four_panels_log_nu_and_l_star():
    fig = figures.metrics_figure(frame(), l_star=2, probe_label="accuracy")
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["ν", "CCA", "ϱ", "probe"]
    assert list(lines[0].y) == [5.0, 2.0, 0.5, 1.0]
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type != "log"
    star = next(t for t in fig.data if t.name == "ℓ*")
    assert list(star.x) == [2] and list(star.y) == [0.5]
    assert sum(1 for s in fig.layout.shapes if s.x0 == 2) == 4  # the dashed ℓ* line on every panel
    assert "accuracy" in fig.layout.annotations[3].text
    assert "%{y:.6g}" in lines[0].hovertemplate


def test_metrics_figure_linear_nu_axis_when_nu_has_zero():
    df = frame()
    df.loc[1, "nu"] = 0.0
    assert figures.metrics_figure(df, l_star=1).layout.yaxis.type != "log"


def test_layer_scatter_one_trace_per_class_or_a_colour_scale():
    xy = np.random.default_rng(0).standard_normal((30, 2))
    labels = np.arange(30) % 3
    fig = figures.layer_scatter(xy, labels, ("a", "b", "c"), layer=2, method="pca")
    assert [t.name for t in fig.data] == ["a", "b", "c"]
    assert len(fig.data[1].x) == 10 and fig.layout.xaxis.title.text == "PC1"
    reg = figures.layer_scatter(xy, np.linspace(0, 5, 30), (), 1, "umap", regression=True)
    assert len(reg.data) == 1 and reg.data[0].marker.colorscale is not None


def test_whatif_figures_overlay_settings_and_band():
    settings = {"p = 0.5": frame(), "p = 0.1": frame().assign(nu=lambda d: d.nu * 3)}
    for df in settings.values():
        df.attrs["n"] = 100
    curves, table = whatif.compare_settings(settings)
    fig = figures.whatif_figure(curves, "nu")
    assert [t.name for t in fig.data] == ["p = 0.5", "p = 0.1"] and fig.layout.yaxis.type == "log"
    bars = figures.whatif_bars(table)
    assert list(bars.data[0].x) == ["p = 0.5", "p = 0.1"] and len(bars.data) == 2
    band = figures.band_figure(curves, whatif.seed_band(curves), "nu")
    assert band.data[0].fill == "toself" and band.data[-1].name == "mean"
    assert list(band.data[-1].y) == [10.0, 4.0, 1.0, 2.0]


def test_teaching_scatter_2d_and_3d():
    x, y = teaching.synthetic_classes(3, 2, 3.0, 1.0, 20, 0)
    fig = figures.teaching_scatter(x, y)
    assert len(fig.data) == 6 and fig.data[0].type == "scatter"
    x3, y3 = teaching.synthetic_classes(2, 3, 3.0, 1.0, 20, 0)
    assert figures.teaching_scatter(x3, y3).data[0].type == "scatter3d"


def test_report_json_is_strict():
    df = frame()
    df.attrs.update(task_type="classification", metric="accuracy")
    result = table.report(ExtractConfig(), df)
    text = json.dumps(result, allow_nan=False)
    assert json.loads(text)["l_star"] == 2


# ------------------------------------------------------------------- the layer picture's examples


def hover_of(spec: dict) -> str:
    return str(spec["data"][0].get("hovertemplate", "")) if spec.get("data") else ""


def picture_spec(at) -> dict:
    """The layer picture's figure, found by its points (the page also draws other figures)."""
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    pictures = [s for s in specs if "probe: %{customdata[3]}" in hover_of(s)]
    assert len(pictures) == 1, [hover_of(s) for s in specs]
    return pictures[0]


def test_picture_hover_names_each_example_and_the_layer_lives_in_the_link(
    tiny_bert_dir, monkeypatch
):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(layer="1", layers_tab="Layer picture")
    open_page(at, PAGE)
    assert not errors(at)
    assert at.slider(key="layer").value == 1
    spec = picture_spec(at)
    points = spec["data"][0]
    assert "probe: %{customdata[3]}" in points["hovertemplate"]
    example, text, label, predicted = points["customdata"][0]
    assert isinstance(example, int) and len(text) <= 90 and label in ("negative", "positive")
    assert predicted in ("negative", "positive")
    assert any("prediction of layer 1's probe" in c.value for c in at.caption)
    at.toggle(key="layers_pic_mistakes").set_value(True).run()
    spec = picture_spec(at)
    assert "symbol" in spec["data"][0]["marker"]

    bad = make_app(tiny_bert_dir, monkeypatch)
    bad.query_params.update(layer="9", layers_tab="Layer picture")
    bad.switch_page(PAGE).run()  # the link opens the Layers page itself
    assert not bad.exception
    assert any(
        "layer='9' is not a layer of this model (0..2)" in w.value for w in bad.sidebar.warning
    )


def test_example_table_and_selection(tiny_bert_dir, monkeypatch):
    from analysis.config import ModelSpec
    from analysis.extract import extract_states
    from ui.layers.view import example_table, selected_examples, shorten

    cfg = ExtractConfig(model=ModelSpec(str(tiny_bert_dir)), sample=SampleSpec(n=30, seed=1))
    states = extract_states(cfg)
    table = example_table(states, layer=2, seed=0)
    assert table["example"].tolist() == list(range(30)) and len(table) == 30
    assert set(table["label"]) <= {"negative", "positive"} and table["correct"].dtype == bool
    assert table.attrs["held_out"] and 0 <= table.attrs["accuracy"] <= 1
    from analysis.data import load_data

    part = load_data(cfg.data).parts["train"]
    assert table["text"].tolist() == part.loc[states.rows.numpy(), "text"].tolist()

    hover = table.assign(text=[shorten(t) for t in table["text"]])
    labels = states.labels.numpy()
    fig = figures.layer_scatter(np.zeros((30, 2)), labels, states.label_names, 2, "pca",
                                examples=hover)  # fmt: skip
    first = int(np.flatnonzero(labels == labels.max())[1])  # 2nd point of the last trace
    points = [
        {"customdata": [4, "t", "l", "p"]},
        {"curve_number": len(fig.data) - 1, "point_index": 1},
    ]
    assert selected_examples(points, fig) == sorted({4, first})
    assert shorten("a <b>bold</b> " + "word " * 40).endswith("…")
    assert "&lt;b&gt;" in shorten("a <b>bold</b>")


def test_layer_scatter_marks_the_probes_mistakes():
    xy = np.zeros((4, 2))
    examples = pd.DataFrame({"example": range(4), "text": list("abcd"), "label": ["x", "y", "x", "y"],
                             "predicted": ["x", "x", "x", "y"], "correct": [True, False, True, True]})  # fmt: skip
    fig = figures.layer_scatter(xy, np.array([0, 1, 0, 1]), ("x", "y"), 1, "pca", examples=examples,
                                mark_mistakes=True)  # fmt: skip
    assert list(fig.data[1].marker.symbol) == ["x", "circle"]  # class y: example 1 is wrong
    assert [row[0] for row in fig.data[1].customdata] == [1, 3]
    assert fig.layout.dragmode == "lasso"


# ------------------------------------------------------------- issue 20: what a reader sees


def test_too_few_examples_per_class_is_one_message_and_no_l_star(tiny_bert_dir, monkeypatch):
    """N = 5 showed ρ = +nan [+nan, +nan], an empty CCA panel, None cells and an ℓ*."""
    at = layers_page(tiny_bert_dir, monkeypatch, n=5)
    assert not at.exception
    (message,) = errors(at)
    assert "at least 5 examples of every class" in message and "Raise N" in message
    assert not any("ℓ\\* = " in i.value for i in at.info)  # no suggestion
    assert not any(m.label.startswith("ρ") for m in at.metric) and not at.dataframe
    state = at.session_state  # AppTest's session state has no .get
    remembered = state["suggested_l_star"] if "suggested_l_star" in state else {}  # noqa: SIM401
    assert not remembered  # no ℓ* passed on to Fine-tune


def test_tiles_show_the_value_and_the_interval_below_it(tiny_bert_dir, monkeypatch):
    at = layers_page(tiny_bert_dir, monkeypatch)
    star = next(m for m in at.metric if m.label == "ℓ*")
    assert star.proto.direction == star.proto.NONE  # "in 50 of 50 repeats" is no increase
    for label in ("ρ(ν, s)", "ρ(CCA, s)", "ζ (smoothness of ν)"):
        tile = next(m for m in at.metric if m.label == label)
        assert "[" not in tile.value and len(tile.value) <= 9, tile.value  # never cut off
        assert tile.proto.direction == tile.proto.NONE
        assert tile.value == "undefined" or tile.delta.startswith(("90 % ", "± "))


def test_the_metrics_table_names_its_columns(tiny_bert_dir, monkeypatch):
    at = layers_page(tiny_bert_dir, monkeypatch)
    config = json.loads(at.dataframe[0].proto.columns)
    labels = {column: c.get("label") for column, c in config.items()}
    assert labels["nu"] == "ν" and labels["probe_c"] == "probe C" and labels["nu_se"] == "ν s.e."
    assert labels["probe_lo"] == "probe s 90 % lo" and labels["rank"] == "ϱ"


def test_the_pictures_probe_is_the_tables_probe(tiny_bert_dir, monkeypatch):
    at = layers_page(tiny_bert_dir, monkeypatch)
    shown = at.dataframe[0].value.set_index("layer")
    open_tab(at, "layers_tab", "Layer picture")
    layer = at.slider(key="layer").value
    caption = next(c.value for c in at.caption if "Hover a dot" in c.value)
    assert f"C = {shown.loc[layer, 'probe_c']:.4g}, the table's *probe C*" in caption
    probe = next(m for m in at.metric if m.label == "probe s (accuracy)")
    assert probe.value == f"{shown.loc[layer, 'probe']:.4g}"
    accuracy = float(caption.split("it gets ")[1].split(" %")[0])
    assert abs(accuracy - 100 * shown.loc[layer, "probe"]) < 0.051  # the same predictions
    assert "the tile *probe s* above" in caption  # says which accuracy is which


def test_umap_button_goes_once_its_picture_is_computed(tiny_bert_dir, monkeypatch):
    import analysis.layers.projection
    import ui.layers.state

    def flat(states, method, seed):
        return np.zeros((len(states), 2))

    monkeypatch.setattr(analysis.layers.projection, "project_2d", flat)
    monkeypatch.setattr(ui.layers.state, "project_2d", flat)
    at = open_tab(layers_page(tiny_bert_dir, monkeypatch), "layers_tab", "Layer picture")
    at.radio(key="layers_pic_method").set_value("umap").run()
    button = next(b for b in at.button if b.label.startswith("Compute UMAP"))
    button.click().run()
    assert not errors(at)
    assert not any(b.label.startswith("Compute UMAP") for b in at.button)


def test_teaching_view_writes_sigma_as_math(tiny_bert_dir, monkeypatch):
    at = open_tab(layers_page(tiny_bert_dir, monkeypatch), "layers_tab", "Teaching view")
    words = next(m.value for m in at.markdown if "**separation**" in m.value)
    assert "$\\Sigma_b$" in words and "Σ_b" not in words


def test_whatif_rho_of_a_flat_probe_curve_is_said_undefined_and_concluded():
    from ui.layers.whatif import conclusion, readable, rho_text

    flat = frame().assign(probe=0.5)
    flat.attrs["n"] = 40
    curves, table_ = whatif.compare_settings({"mean": frame(), "first": flat})
    shown = readable(curves, table_)
    assert shown["ρ(ν, s)"].tolist()[1] == "undefined (flat probe curve)"
    assert shown["ρ(ν, s)"].tolist()[0].startswith(("+", "-"))
    assert rho_text(float("nan"), np.array([0.5, 0.5])) == "undefined (flat probe curve)"
    said = conclusion("pooling", table_)
    assert "ℓ* = 2 in every setting" in said and "undefined in 1" in said
    assert "smoother ν curve" in said
    moved = conclusion("seeds", table_.assign(l_star=[1, 3]))
    assert "ℓ* moves between settings (1, 3)" in moved and "sampling noise" in moved


def test_band_edges_are_fill_only_and_the_probes_cross_has_a_legend_entry():
    df = frame()
    se = pd.DataFrame(
        {"layer": df["layer"], **{f"{m}_se": 0.1 for m in ("nu", "cca", "rank", "probe")}}
    )
    bands = [t for t in figures.metrics_figure(df, 2, "accuracy", se).data if t.fill == "toself"]
    assert len(bands) == 4 and all(t.mode == "lines" for t in bands)  # no markers on the edges
    settings = {"seed 0": frame(), "seed 1": frame()}
    curves, _ = whatif.compare_settings(settings)
    band = figures.band_figure(curves, whatif.seed_band(curves), "nu")
    assert band.data[0].mode == "lines"
    xy = np.zeros((4, 2))
    examples = pd.DataFrame({"example": range(4), "text": list("abcd"), "label": ["x", "y", "x", "y"],
                             "predicted": ["x", "x", "x", "y"], "correct": [True, False, True, True]})  # fmt: skip
    fig = figures.layer_scatter(xy, np.array([0, 1, 0, 1]), ("x", "y"), 1, "pca",
                                examples=examples, mark_mistakes=True)  # fmt: skip
    assert [t.name for t in fig.data] == ["x", "y", "× the probe is wrong"]
    assert fig.data[-1].marker.symbol == "x"
    plain = figures.layer_scatter(
        xy, np.array([0, 1, 0, 1]), ("x", "y"), 1, "pca", examples=examples
    )
    assert [t.name for t in plain.data] == ["x", "y"]


def test_class_colours_are_the_same_on_the_data_and_layers_pages():
    from ui.figures import data as data_figures

    names = ("negative", "positive", "neutral")
    lengths = pd.DataFrame(
        {"tokens": [3, 5, 7, 9], "label": ["positive", "neutral", "negative", "positive"]}
    )
    hist = data_figures.length_histogram(lengths, 8, names)
    on_data = {t.name: t.marker.color for t in hist.data}
    scatter = figures.layer_scatter(np.zeros((4, 2)), np.array([1, 2, 0, 1]), names, 1, "pca")
    on_layers = {t.name: t.marker.color for t in scatter.data}
    assert on_data == on_layers and len(set(on_data.values())) == 3


def test_metrics_figure_is_drawn_before_the_repeats_run(tiny_bert_dir, monkeypatch):
    """A cold page draws the metrics first and adds the bands once the repeats are done, in the
    same place: one metrics chart at the end, with its bands."""
    import ui.layers.state
    import ui.layers.view

    calls = []
    draw, repeat = figures.metrics_figure, ui.layers.state.get_layer_repeats

    def drawn(df, l_star, probe_label="probe", se=None):
        calls.append("figure" if se is None else "figure with bands")
        return draw(df, l_star, probe_label, se)

    def repeats(*args, **kwargs):
        calls.append("repeats")
        return repeat(*args, **kwargs)

    monkeypatch.setattr(ui.layers.view, "metrics_figure", drawn)  # the page's own
    monkeypatch.setattr(ui.layers.state, "get_layer_repeats", repeats)
    at = layers_page(tiny_bert_dir, monkeypatch)
    assert not errors(at)
    assert calls[:3] == ["figure", "repeats", "figure with bands"]
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert len([t for t in spec["data"] if t.get("fill") == "toself"]) == 4
    assert len(at.get("plotly_chart")) == 2  # the first drawing was replaced, not added to


def test_sessions_showing_the_same_table_share_its_figures(tiny_bert_dir, monkeypatch):
    """A class on one step: the second session draws the same figures without building them."""
    import ui.layers.view

    ui.layers.view.metrics_figure.clear()
    built = []
    draw = figures.metrics_figure

    def counted(df, l_star, probe_label="probe", se=None):
        built.append("figure" if se is None else "figure with bands")
        return draw(df, l_star, probe_label, se)

    monkeypatch.setattr(figures, "metrics_figure", counted)
    first = layers_page(tiny_bert_dir, monkeypatch)
    assert built == ["figure", "figure with bands"]
    second = layers_page(tiny_bert_dir, monkeypatch)
    assert not errors(first) and not errors(second)
    assert built == ["figure", "figure with bands"]  # none built again
    specs = [at.get("plotly_chart")[0].proto.spec for at in (first, second)]
    assert specs[0] == specs[1] and '"toself"' in specs[1]
    # Another table (another N) is a figure of its own.
    layers_page(tiny_bert_dir, monkeypatch, n=30)
    assert built[2:] == ["figure", "figure with bands"]


def test_a_link_restores_the_pictures_controls_and_its_selected_examples(tiny_bert_dir,
                                                                          monkeypatch):  # fmt: skip
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(layer="1", layers_pic_mistakes="true", picked="3,1", layers_repeats="1",
                           layers_tab="Layer picture")  # fmt: skip
    at.switch_page("views/layers.py").run()  # the link opens the page: its first run
    assert not errors(at), errors(at)
    assert at.slider(key="layer").value == 1
    assert at.toggle(key="layers_pic_mistakes").value
    assert any(m.value.startswith("**2 selected examples** at layer 1") for m in at.markdown)
    picked = next(d.value for d in at.dataframe if "predicted" in d.value.columns)
    assert sorted(picked["example"]) == [1, 3]
    chart = next(c for c in at.get("plotly_chart") if "selectedpoints" in c.proto.spec)
    assert chart  # the selection drawn on the figure too
    open_tab(at, "layers_tab", "Metrics and ℓ*")  # the other tab's control came with the link
    assert at.number_input(key="layers_repeats").value == 1
