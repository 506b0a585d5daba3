"""The Heads page (AppTest) and its figure builders (inspected through fig.data / fig.layout)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from apptest_utils import browser_writes_link, errors, make_app, open_tab

from ui.figures import heads as figures

PAGE = "views/heads.py"


def heads_page(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.session_state["heads_n"] = 12  # keep the forward pass tiny
    at.switch_page(PAGE)
    return at.run()


def test_heads_page_renders_every_view(tiny_bert_dir, monkeypatch):
    at = heads_page(tiny_bert_dir, monkeypatch)
    assert not errors(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["n_trainable"] == f"{2 * 3 * 3 * (8 * 32 + 8):,}"  # 2 layers × k = 3 × Q/K/V
    assert len(at.get("plotly_chart")) == 2  # PageRank, variants: only the chosen tab runs
    assert len(at.latex) >= 1
    drawn = {"What a head attends to": 1, "Information richness": 1, "Correlation": 1}
    for tab, charts in drawn.items():
        open_tab(at, "heads_tab", tab)
        assert not errors(at) and len(at.get("plotly_chart")) == charts, tab
    selection = next(iter(at.session_state["suggested_heads"].values()))
    assert selection["format"] == "tunescope-heads/1"
    assert sorted(selection["layers"]) == ["1", "2"]
    assert all(len(heads) == 3 for heads in selection["layers"].values())
    assert selection["settings"]["n"] == 12


def test_changing_k_reuses_the_statistics_and_mid_top_drops_layers(tiny_bert_dir, monkeypatch):
    at = heads_page(tiny_bert_dir, monkeypatch)
    stats_caption = next(c.value for c in at.caption if "statistics" in c.value)
    at.number_input(key="heads_k").set_value(1)
    at.selectbox(key="heads_scope").set_value("mid-top")
    at.button[0].click()  # the form's Apply
    at.run()
    assert not errors(at)
    layers = next(iter(at.session_state["suggested_heads"].values()))["layers"]
    assert list(layers) == ["2"] and len(layers["2"]) == 1
    # Same statistics object (a recomputation would report a new duration): k and scope are cheap.
    assert stats_caption in [c.value for c in at.caption]


def test_robustness_comparison(tiny_bert_dir, monkeypatch):
    at = open_tab(heads_page(tiny_bert_dir, monkeypatch), "heads_tab", "Robustness")
    at.radio(key="heads_vary").set_value("max length")
    at.number_input(key="heads_other_len").set_value(16)
    next(b for b in at.button if b.label == "Compare").click()
    at.run()
    assert not errors(at)
    assert any("Kendall τ of I_h" in m.label for m in at.metric)
    assert len(at.get("plotly_chart")) == 2  # the two settings' profiles, side by side


def test_bad_k_state_is_clamped_not_a_crash(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.session_state["heads_n"] = 12
    at.session_state["heads_k"] = 99  # more heads than the model has (4)
    at.switch_page(PAGE)
    at.run()
    assert not at.exception


# ---------------------------------------------------------------------------- figures


def test_correlation_grid_shares_one_colour_scale():
    correlation = np.random.default_rng(0).uniform(0, 2, (5, 4, 4))
    fig = figures.correlation_grid(correlation, n_cols=3)
    assert len(fig.data) == 5
    assert {trace.coloraxis for trace in fig.data} == {"coloraxis"}
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == pytest.approx(
        correlation.max()
    )
    assert [a.text for a in fig.layout.annotations] == [f"layer {i}" for i in range(1, 6)]
    np.testing.assert_array_equal(np.array(fig.data[2].z), correlation[2])


def test_pagerank_heatmap_marks_the_selected_heads():
    scores = np.full((3, 4), 0.25)
    fig = figures.pagerank_heatmap(scores, {2: [0, 3], 3: [1, 2]})
    heat, marks = fig.data
    assert list(heat.y) == [1, 2, 3] and list(heat.x) == [0, 1, 2, 3]
    assert list(marks.x) == [0, 3, 1, 2] and list(marks.y) == [2, 2, 3, 3]
    assert fig.layout.xaxis.title.text == "head" and fig.layout.yaxis.title.text == "layer"


def test_richness_heatmap_and_variant_bars():
    richness = np.arange(6.0).reshape(2, 3)
    fig = figures.richness_heatmap(richness, richness / 10)
    np.testing.assert_array_equal(np.array(fig.data[0].z), richness)
    assert list(fig.data[0].y) == [1, 2]
    bars = figures.variant_bars(np.array([0.5, 0.5]), np.array([0.7, 0.3]), np.array([0.6, 0.4]), 2)
    assert [t.name for t in bars.data] == [
        "P⁽⁰⁾ = I_h / Σ I",
        "paper (uniform teleport)",
        "personalised teleport",
    ]
    assert bars.layout.title.text == "layer 2"


def test_robustness_figures():
    tau = {"I_h": np.array([1.0, np.nan, 0.2]), "PageRank": np.array([0.5, 0.4, -0.1])}
    fig = figures.agreement_bars(tau)
    assert [t.name for t in fig.data] == ["I_h", "PageRank"]
    assert list(fig.data[1].x) == [1, 2, 3] and tuple(fig.layout.yaxis.range) == (-1, 1)
    a, b = np.ones((5, 3)), np.zeros((5, 3))
    prof = figures.richness_profiles(a, b, "n = 300", "n = 1000", a / 10, None)
    assert len(prof.data) == 10
    assert [t.name for t in prof.data if t.showlegend] == ["n = 300", "n = 1000"]
    assert prof.data[0].error_y.array is not None and prof.data[5].error_y.array is None


# ------------------------------------------------------------------ what a head attends to


def test_attention_tab_shows_the_linked_head_on_the_linked_example(tiny_bert_dir, monkeypatch):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.query_params.update(layer="2", head="3", example="4", heads_tab="What a head attends to")
    at.session_state["heads_n"] = 12
    at.switch_page(PAGE).run()
    assert not errors(at)
    assert at.select_slider(key="layer").value == 2 and at.select_slider(key="head").value == 3
    assert at.selectbox(key="example").value == 4
    heatmap = next(c for c in at.get("plotly_chart") if '"attended token (key)"' in c.proto.spec)
    spec = json.loads(heatmap.proto.spec)
    tokens = spec["layout"]["xaxis"]["ticktext"]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert spec["layout"]["title"]["text"] == "layer 2, head 3"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["rank in its layer"].endswith("of 4") and metrics["selected"] in ("yes", "no")
    at.text_input(key="heads_own_text").set_value("the film was great").run()
    spec = json.loads(
        next(c for c in at.get("plotly_chart") if "attended token" in c.proto.spec).proto.spec
    )
    assert spec["layout"]["xaxis"]["ticktext"][1:-1] == ["the", "film", "was", "great"]

    bad = make_app(tiny_bert_dir, monkeypatch)
    bad.query_params.update(head="7", heads_tab="What a head attends to")
    bad.session_state["heads_n"] = 12
    bad.switch_page(PAGE).run()
    assert not bad.exception
    assert any("head='7' is not within 0..3 here" in w.value for w in bad.sidebar.warning)
    assert bad.select_slider(key="head").value == 0


def test_the_form_keeps_its_values_across_pages_and_heads_are_kept_per_data(
    tiny_bert_dir, monkeypatch
):
    at = make_app(tiny_bert_dir, monkeypatch)
    at.run()
    at.session_state["heads_n"] = 12
    at.switch_page(PAGE).run()
    at.number_input(key="heads_k").set_value(1)
    at.button[0].click().run()  # Apply
    browser_writes_link(at, "heads_k", "heads_n")
    at.switch_page("views/data.py").run()
    at.switch_page(PAGE).run()
    assert at.number_input(key="heads_k").value == 1 and at.number_input(key="heads_n").value == 12
    assert len(at.session_state["suggested_heads"]) == 1
    at.sidebar.selectbox(key="data").set_value("trec6").run()
    assert not errors(at)
    assert len(at.session_state["suggested_heads"]) == 2  # one selection per data set


def test_attention_heatmap_keeps_repeated_tokens_apart():
    tokens = ["[CLS]", "the", "film", "the", "[SEP]"]
    weights = np.full((5, 5), 0.2)
    fig = figures.attention_heatmap(weights, tokens, 2, 1)
    assert list(fig.data[0].x) == [0, 1, 2, 3, 4]  # positions, not names: "the" twice
    assert list(fig.layout.xaxis.ticktext) == ["[CLS]", "the ·1", "film", "the ·3", "[SEP]"]
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.data[0].customdata[1][3] == "the → the"


def test_correlation_grid_labels_head_indices():
    fig = figures.correlation_grid(np.ones((2, 12, 12)), n_cols=2)
    assert list(fig.layout.xaxis.tickvals) == list(range(12))
    assert fig.layout.xaxis.title.text == "head" and fig.layout.yaxis.title.text == "head"
    assert figures.head_ticks(40) == list(range(0, 40, 4))


@pytest.mark.usefixtures("stop_leftover_worker")
def test_pagerank_vs_random_heads_queues_once_and_reuses(tiny_bert_dir, monkeypatch):
    from analysis.runs.db import RunsDB

    at = open_tab(heads_page(tiny_bert_dir, monkeypatch), "heads_tab", "PageRank vs random heads")
    assert any("No finished heads runs" in i.value for i in at.info)
    at.number_input(key="heads_cmp_seeds").set_value(1)
    at.number_input(key="heads_cmp_steps").set_value(2)
    submit = next(b for b in at.button if b.label.startswith("Estimate and queue"))
    submit.click().run()
    assert not errors(at), errors(at)
    db = RunsDB()
    queued = db.list_runs()
    assert len(queued) == 4 and set(queued["method"]) == {"heads"}  # 4 selectors × 1 seed
    labels = set(queued["label"])
    assert {"heads ×6 pagerank", "heads ×6 random"} <= labels
    next(b for b in at.button if b.label.startswith("Estimate and queue")).click().run()
    assert any("already there" in s.value for s in at.success)  # nothing queued twice
    assert len(db.list_runs()) == 4
    for run_id in queued["id"]:
        db.request_cancel(run_id)


@pytest.mark.parametrize("n_layers", [6, 12, 24])
def test_layer_heatmaps_give_every_layer_a_readable_row(n_layers):
    """The I_h and PageRank heatmaps were squashed to ~70 px under plotly's default 100 px top
    margin: the plot area must now hold ≥ 30 px per layer, with little blank space above."""
    scores = np.random.default_rng(0).uniform(size=(n_layers, 12))
    for fig in (
        figures.richness_heatmap(scores),
        figures.pagerank_heatmap(scores, {1: [0, 1, 2]}),
    ):
        margin = fig.layout.margin
        plot_px = fig.layout.height - margin.t - margin.b
        assert plot_px >= 30 * n_layers, (fig.layout.height, margin)
        assert margin.t <= 80


def test_correlation_grid_leaves_room_between_rows_for_ticks_and_titles():
    """Each row's "layer ℓ" title sat on the tick labels of the row above: the gap between two
    rows of panels must hold both (≥ 55 px)."""
    fig = figures.correlation_grid(np.ones((12, 12, 12)), n_cols=4)
    margin = fig.layout.margin
    plot_px = fig.layout.height - margin.t - margin.b
    top_row, next_row = fig.layout.yaxis.domain, fig.layout.yaxis5.domain
    gap_px = (top_row[0] - next_row[1]) * plot_px
    panel_px = (top_row[1] - top_row[0]) * plot_px
    assert gap_px >= 55 and panel_px >= 180, (gap_px, panel_px)
