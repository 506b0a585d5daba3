"""Known answers for the head statistics, PageRank, selection and the selection file
(docs/explanation/heads.md, "Heads")."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest
import torch

from analysis.heads.pagerank import initial_distribution, pagerank, transition_matrix
from analysis.heads.select import (
    HeadSelectionConfig,
    analyse_heads,
    rank_agreement,
    scope_layers,
    select_heads,
    selection_overlap,
    total_correlation,
    trainable_parameter_count,
)
from analysis.heads.selection_file import (
    FORMAT,
    HeadSelection,
    SelectionError,
    load_selection,
    save_selection,
    selection_from_dict,
)
from analysis.heads.stats import HeadStats, HeadStatsAccumulator, information_richness


def matrix_with_singular_values(
    sigma: list[float], n_rows: int, seed: int, d_head: int | None = None
) -> torch.Tensor:
    """U diag(σ) Vᵀ, n_rows × d_head, with random orthonormal U (n_rows × r) and V (d_head × r)."""
    gen = torch.Generator().manual_seed(seed)
    rank, d_head = len(sigma), d_head or len(sigma)
    u, _ = torch.linalg.qr(torch.randn(n_rows, rank, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d_head, rank, generator=gen, dtype=torch.float64))
    return u @ torch.diag(torch.tensor(sigma, dtype=torch.float64)) @ v.T


def direct_stats(outputs: list[np.ndarray], xi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example (S_n, H, d_head) arrays → richness mean, std and mean |cov| by plain numpy."""
    richness, correlation = [], []
    for o in outputs:
        per_head = []
        for h in range(o.shape[1]):
            s = np.linalg.svd(o[:, h, :], compute_uv=False)
            ratio = np.cumsum(s) / s.sum()
            per_head.append(int(np.argmax(ratio >= xi)) + 1)
        richness.append(per_head)
        c = np.abs(np.cov(o.mean(axis=0)))  # rows = heads, columns = d_head coordinates
        np.fill_diagonal(c, 0.0)
        correlation.append(c)
    richness = np.array(richness, dtype=np.float64)
    return richness.mean(0), richness.std(0), np.mean(correlation, axis=0)


def random_batch(lengths: list[int], n_heads: int = 4, d_head: int = 8, seed: int = 0):
    gen = np.random.default_rng(seed)
    outputs = [gen.normal(size=(n, n_heads, d_head)) for n in lengths]
    padded = np.zeros((len(lengths), max(lengths), n_heads, d_head))
    for i, o in enumerate(outputs):
        padded[i, : len(o)] = o
    return outputs, torch.tensor(padded, dtype=torch.float32), torch.tensor(lengths)


# ---------------------------------------------------------------------------- richness


SIGMA = [6.0, 2.5, 1.0, 0.3, 0.2]  # cumulative mass 0.60, 0.85, 0.95, 0.98, 1.00


@pytest.mark.parametrize(("xi", "expected"), [(0.5, 1), (0.8, 2), (0.9, 3), (0.97, 4), (1.0, 5)])
def test_richness_of_known_singular_values(xi, expected):
    sigma = torch.linalg.svdvals(matrix_with_singular_values(SIGMA, n_rows=9, seed=1))
    assert torch.allclose(sigma, torch.tensor(SIGMA, dtype=torch.float64))
    assert int(information_richness(sigma, xi)) == expected


def test_richness_of_zero_matrix_is_zero():
    assert int(information_richness(torch.zeros(4), 0.9)) == 0


@pytest.mark.parametrize("xi", [0.0, -0.1, 1.5])
def test_bad_xi(xi):
    with pytest.raises(ValueError, match="ξ"):
        information_richness(torch.ones(3), xi)
    with pytest.raises(ValueError, match="ξ"):
        HeadStatsAccumulator(1, 2, 4, xi=xi)


def test_accumulator_richness_on_constructed_heads_ignores_padding():
    """Head h gets a matrix whose I_h is known; padding rows (zeros, masked) change nothing."""
    spectra = [[6.0, 2.5, 1.0, 0.3, 0.2], [1.0, 1.0, 1.0, 1.0, 1.0], [9.0, 0.5, 0.3, 0.1, 0.1]]
    expected = [3, 5, 1]
    n_real, n_pad = 7, 4
    heads = [matrix_with_singular_values(s, n_real, seed=h) for h, s in enumerate(spectra)]
    example = torch.stack(heads, dim=1).float()  # (S, H, d_head)
    garbage = torch.full((n_pad, 3, 5), 123.0)  # padding positions hold junk: the mask must drop it

    right = torch.cat([example, garbage])[None]
    left = torch.cat([garbage, example])[None]
    left_mask = torch.cat([torch.zeros(n_pad), torch.ones(n_real)])[None]

    for outputs, mask in [
        (example[None], torch.tensor([n_real])),
        (right, torch.tensor([n_real])),
        (left, left_mask),
    ]:
        acc = HeadStatsAccumulator(n_layers=1, n_heads=3, d_head=5, xi=0.9)
        acc.update(1, outputs, mask)
        assert acc.result().richness[0].tolist() == expected


def test_zero_padding_adds_only_zero_singular_values():
    o = matrix_with_singular_values([3.0, 2.0, 0.5], n_rows=3, seed=4, d_head=5)  # S < d_head
    padded = torch.cat([o, torch.zeros(6, 5, dtype=torch.float64)])
    s, s_pad = torch.linalg.svdvals(o), torch.linalg.svdvals(padded)
    assert torch.allclose(s_pad[: len(s)], s)
    assert torch.allclose(s_pad[len(s) :], torch.zeros(len(s_pad) - len(s), dtype=torch.float64))
    assert information_richness(s, 0.9) == information_richness(s_pad, 0.9)


# ---------------------------------------------------------------------------- correlation


def test_statistics_match_direct_numpy():
    lengths = [6, 4, 2, 5]
    outputs, padded, lens = random_batch(lengths)
    acc = HeadStatsAccumulator(n_layers=2, n_heads=4, d_head=8, xi=0.9)
    acc.update(1, padded, lens)
    acc.update(2, padded * 2.0, lens)  # scaling leaves I_h unchanged, multiplies |cov| by 4
    stats = acc.result()

    richness, richness_std, correlation = direct_stats(outputs, 0.9)
    np.testing.assert_allclose(stats.richness[0], richness)
    np.testing.assert_allclose(stats.richness_std[0], richness_std, atol=1e-12)
    np.testing.assert_allclose(stats.correlation[0], correlation, rtol=1e-5)
    np.testing.assert_allclose(stats.richness[1], richness)
    np.testing.assert_allclose(stats.correlation[1], 4 * correlation, rtol=1e-5)
    assert stats.n == 4
    for layer_corr in stats.correlation:
        np.testing.assert_allclose(layer_corr, layer_corr.T)
        assert np.all(np.diag(layer_corr) == 0)
        assert np.all(layer_corr >= 0)


def test_streaming_equals_all_at_once():
    lengths = [9, 3, 7, 7, 2, 5, 8]
    _, padded, lens = random_batch(lengths, seed=3)
    whole = HeadStatsAccumulator(1, 4, 8)
    whole.update(1, padded, lens)

    streamed = HeadStatsAccumulator(1, 4, 8)
    for chunk in (slice(0, 2), slice(2, 5), slice(5, 7)):
        part_lens = lens[chunk]
        streamed.update(1, padded[chunk, : int(part_lens.max())], part_lens)  # own, tighter padding

    a, b = whole.result(), streamed.result()
    np.testing.assert_allclose(a.richness, b.richness)
    np.testing.assert_allclose(a.richness_std, b.richness_std, atol=1e-12)
    np.testing.assert_allclose(a.correlation, b.correlation, rtol=1e-6)
    assert a.n == b.n == 7


def test_accumulator_errors():
    acc = HeadStatsAccumulator(2, 4, 8)
    _, padded, lens = random_batch([3, 2])
    with pytest.raises(ValueError, match="outside"):
        acc.update(3, padded, lens)
    with pytest.raises(ValueError, match="shape"):
        acc.update(1, padded[..., :4], lens)
    with pytest.raises(ValueError, match="no real tokens"):
        acc.update(1, padded, torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="same, non-zero"):
        acc.result()
    acc.update(1, padded, lens)
    with pytest.raises(ValueError, match="same, non-zero"):
        acc.result()  # layer 2 has seen nothing
    with pytest.raises(ValueError, match="d_head"):
        HeadStatsAccumulator(1, 4, 1)


def test_head_stats_tensor_round_trip():
    _, padded, lens = random_batch([4, 3])
    acc = HeadStatsAccumulator(1, 4, 8, xi=0.8)
    acc.update(1, padded, lens)
    stats = acc.result()
    back = HeadStats.from_tensors(stats.to_tensors(), n=stats.n, xi=stats.xi)
    np.testing.assert_array_equal(back.correlation, stats.correlation)
    np.testing.assert_array_equal(back.richness, stats.richness)
    assert (back.n, back.xi, back.n_layers, back.n_heads) == (2, 0.8, 1, 4)


# ---------------------------------------------------------------------------- PageRank


def random_graph(n_heads: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    richness = gen.uniform(1, 10, n_heads)
    r = np.abs(gen.normal(size=(n_heads, n_heads)))
    r = (r + r.T) / 2
    np.fill_diagonal(r, 0.0)
    return richness, r


def test_transition_matrix_rows_sum_to_one_with_zero_diagonal():
    _, r = random_graph()
    m = transition_matrix(r)
    np.testing.assert_allclose(m.sum(axis=1), 1.0)
    assert np.all(np.diag(m) == 0)
    np.testing.assert_allclose(m[0, 1], r[0, 1] / r[0].sum())


def test_transition_matrix_dangling_row_links_to_every_other_head():
    _, r = random_graph(4)
    r[2, :] = 0.0
    m = transition_matrix(r)
    np.testing.assert_allclose(m[2], [1 / 3, 1 / 3, 0.0, 1 / 3])


@pytest.mark.parametrize("damping", [0.5, 0.85, 0.95])
def test_pagerank_matches_networkx(damping):
    richness, r = random_graph(seed=2)
    p0 = initial_distribution(richness)
    graph = nx.from_numpy_array(r, create_using=nx.DiGraph)  # edge h → h' weighted r_{h,h'}
    start = dict(enumerate(p0))

    paper = pagerank(richness, r, damping=damping, tol=1e-13)
    expected = nx.pagerank(graph, alpha=damping, nstart=start, tol=1e-15, max_iter=10_000)
    np.testing.assert_allclose(paper.scores, [expected[h] for h in range(len(p0))], atol=1e-10)

    personal = pagerank(richness, r, damping=damping, tol=1e-13, variant="personalised")
    expected = nx.pagerank(
        graph, alpha=damping, personalization=start, nstart=start, tol=1e-15, max_iter=10_000
    )
    np.testing.assert_allclose(personal.scores, [expected[h] for h in range(len(p0))], atol=1e-10)


def test_pagerank_with_dangling_head_matches_networkx_on_the_filled_graph():
    richness, r = random_graph(5, seed=5)
    r[1, :] = 0.0
    ours = pagerank(richness, r, tol=1e-13)
    graph = nx.from_numpy_array(transition_matrix(r), create_using=nx.DiGraph)
    expected = nx.pagerank(graph, alpha=0.85, tol=1e-15, max_iter=10_000)
    np.testing.assert_allclose(ours.scores, [expected[h] for h in range(5)], atol=1e-10)
    assert ours.scores.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("variant", ["paper", "personalised"])
def test_pagerank_sums_to_one_and_is_a_fixed_point(variant):
    richness, r = random_graph(8, seed=7)
    result = pagerank(richness, r, damping=0.85, tol=1e-12, variant=variant)
    assert result.scores.sum() == pytest.approx(1.0, abs=1e-12)
    m = transition_matrix(r)
    teleport = 0.15 * (
        initial_distribution(richness) if variant == "personalised" else np.full(8, 1 / 8)
    )
    np.testing.assert_allclose(0.85 * m.T @ result.scores + teleport, result.scores, atol=1e-11)
    assert 1 < result.iterations < 500


def test_pagerank_iteration_count():
    richness, r = random_graph(seed=3)
    # d = 0: the first update lands on the uniform vector; the second changes nothing.
    assert pagerank(richness, r, damping=0.0).iterations == 2
    assert pagerank(np.ones(6), r, damping=0.0).iterations == 1  # P⁽⁰⁾ is already uniform
    loose = pagerank(richness, r, tol=1e-3).iterations
    tight = pagerank(richness, r, tol=1e-10).iterations
    assert loose < tight
    slow = pagerank(richness, r, damping=0.95, tol=1e-10).iterations
    assert tight < slow  # iterations grow with d (paper Fig. 6)


def test_uniform_teleport_ignores_richness_personalised_does_not():
    richness, r = random_graph(seed=4)
    other = richness[::-1].copy()
    a = pagerank(richness, r, tol=1e-13)
    b = pagerank(other, r, tol=1e-13)
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-11)
    pa = pagerank(richness, r, tol=1e-13, variant="personalised")
    pb = pagerank(other, r, tol=1e-13, variant="personalised")
    assert np.abs(pa.scores - pb.scores).max() > 1e-3


def test_pagerank_single_head_and_bad_arguments():
    assert pagerank(np.array([2.0]), np.zeros((1, 1))).scores.tolist() == [1.0]
    richness, r = random_graph(3)
    with pytest.raises(ValueError, match="damping"):
        pagerank(richness, r, damping=1.0)
    with pytest.raises(ValueError, match="variant"):
        pagerank(richness, r, variant="teleport")
    with pytest.raises(ValueError, match="negative"):
        pagerank(richness, -r)
    with pytest.raises(ValueError, match="3 richness values"):
        pagerank(richness, np.ones((4, 4)))


def test_zero_richness_starts_uniform():
    np.testing.assert_allclose(initial_distribution(np.zeros(4)), 0.25)


# ---------------------------------------------------------------------------- selection


def toy_stats(n_layers: int = 4, n_heads: int = 6) -> HeadStats:
    """Richness rising with the head index; head 0 strongly tied to everyone (a hub)."""
    richness = np.tile(np.arange(1, n_heads + 1, dtype=float), (n_layers, 1))
    r = np.full((n_heads, n_heads), 0.1)
    r[0, :] = r[:, 0] = 1.0
    np.fill_diagonal(r, 0.0)
    correlation = np.stack([r] * n_layers)
    return HeadStats(richness, np.zeros_like(richness), correlation, n=10, xi=0.9)


def test_scope_layers():
    assert scope_layers(12, "layer-wise") == list(range(1, 13))
    assert scope_layers(12, "mid-top") == list(range(7, 13))
    assert scope_layers(5, "mid-top") == [3, 4, 5]
    assert scope_layers(1, "mid-top") == [1]
    with pytest.raises(ValueError, match="scope"):
        scope_layers(4, "top")


def test_selectors_known_answers():
    stats = toy_stats()
    pr = np.tile([0.5, 0.1, 0.1, 0.1, 0.05, 0.15], (4, 1))

    def pick(selector: str, k: int = 2) -> list[int]:
        return select_heads(stats.richness, stats.correlation, pr, k=k, selector=selector)[1]

    assert pick("pagerank") == [0, 5]
    assert pick("pagerank-lowest") == [1, 4]  # the 0.1 tie goes to the lower head index
    assert pick("richness") == [4, 5]
    assert pick("richness-lowest") == [0, 1]
    assert pick("correlation") == [0, 1]  # hub first; the rest tie → lowest index
    np.testing.assert_allclose(
        total_correlation(stats.correlation)[0], [5.0, 1.4, 1.4, 1.4, 1.4, 1.4]
    )


def test_select_heads_scopes_and_random_seed():
    stats = toy_stats(n_layers=6)
    pr = stats.richness / stats.richness.sum(axis=1, keepdims=True)
    wise = select_heads(stats.richness, stats.correlation, pr, k=3)
    assert sorted(wise) == [1, 2, 3, 4, 5, 6]
    assert all(len(h) == 3 for h in wise.values())
    top = select_heads(stats.richness, stats.correlation, pr, k=3, scope="mid-top")
    assert sorted(top) == [4, 5, 6]

    rand_a = select_heads(stats.richness, stats.correlation, pr, k=3, selector="random", seed=1)
    rand_b = select_heads(stats.richness, stats.correlation, pr, k=3, selector="random", seed=1)
    rand_top = select_heads(
        stats.richness, stats.correlation, pr, k=3, selector="random", seed=1, scope="mid-top"
    )
    rand_c = select_heads(stats.richness, stats.correlation, pr, k=3, selector="random", seed=2)
    assert rand_a == rand_b
    assert all(rand_top[layer] == rand_a[layer] for layer in rand_top)
    assert rand_a != rand_c
    assert all(len(set(h)) == 3 and all(0 <= x < 6 for x in h) for h in rand_a.values())


def test_k_larger_than_heads_is_a_clear_error():
    stats = toy_stats(n_heads=4)
    with pytest.raises(ValueError, match=r"k = 5 .* only 4"):
        select_heads(stats.richness, stats.correlation, stats.richness, k=5)
    with pytest.raises(ValueError, match="k = 5"):
        analyse_heads(stats, HeadSelectionConfig(k=5))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k must"),
        ({"damping": 1.2}, "damping"),
        ({"tol": 0.0}, "tolerance"),
        ({"variant": "x"}, "variant"),
        ({"scope": "x"}, "scope"),
        ({"selector": "x"}, "selector"),
    ],
)
def test_selection_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HeadSelectionConfig(**kwargs)


def test_analyse_heads_end_to_end():
    stats = toy_stats()
    result = analyse_heads(stats, HeadSelectionConfig(k=2))
    assert result.pagerank.shape == (4, 6)
    np.testing.assert_allclose(result.pagerank.sum(axis=1), 1.0)
    assert result.iterations.shape == (4,)
    # Paper variant: the hub wins; heads 1..5 are alike in the graph, so I_h cannot split them.
    assert all(heads == [0, 1] for heads in result.selected.values())
    personal = analyse_heads(stats, HeadSelectionConfig(k=2, variant="personalised"))
    assert all(heads == [0, 5] for heads in personal.selected.values())  # richest of the rest
    table = result.layers_table()
    assert [row["layer"] for row in table] == [1, 2, 3, 4]
    assert set(table[0]) >= {"layer", "richness", "correlation", "pagerank", "selected"}
    json.dumps(table)  # JSON-ready
    frame = result.heads_frame()
    assert len(frame) == 4 * 6 and frame["selected"].sum() == 4 * 2
    row = frame[(frame["layer"] == 2) & (frame["head"] == 0)].iloc[0]
    assert row.selected and row.total_correlation == pytest.approx(5.0)
    assert row.pagerank == pytest.approx(result.pagerank[1, 0])


# ---------------------------------------------------------------------------- robustness / cost


def test_rank_agreement():
    a = np.array([[1.0, 2, 3, 4], [4, 3, 2, 1], [1, 1, 1, 1]])
    same = rank_agreement(a[:2], a[:2] * 10)
    np.testing.assert_allclose(same.per_layer, [1.0, 1.0])
    flipped = rank_agreement(a[:2], -a[:2])
    np.testing.assert_allclose(flipped.per_layer, [-1.0, -1.0])
    with_flat = rank_agreement(a, a)
    assert np.isnan(with_flat.per_layer[2])
    assert with_flat.overall == pytest.approx(1.0)
    with pytest.raises(ValueError, match="same shape"):
        rank_agreement(a, a[:2])


def test_selection_overlap():
    assert selection_overlap(
        {1: [0, 1, 2], 2: [3, 4, 5]}, {1: [0, 1, 5], 2: [0, 1, 2], 3: [1]}
    ) == {
        1: pytest.approx(2 / 3),
        2: 0.0,
    }


def test_trainable_parameters_reproduce_the_paper_share():
    """BERT-large (24 × 16 heads, d_model 1024, 335M parameters), k = 3: 4.2 %, mid-top 2.1 %."""
    n_params = 335_141_888
    layer_wise = trainable_parameter_count(
        {layer: [0, 1, 2] for layer in range(1, 25)}, 1024, 64, n_params
    )
    assert layer_wise.n_trainable == 72 * 3 * (64 * 1024 + 64)
    assert round(layer_wise.share * 100, 1) == 4.2
    mid_top = trainable_parameter_count(
        {layer: [0, 1, 2] for layer in range(13, 25)}, 1024, 64, n_params
    )
    assert round(mid_top.share * 100, 1) == 2.1
    assert trainable_parameter_count({1: [0]}, 32, 8).share is None


# ---------------------------------------------------------------------------- selection file


def test_selection_file_round_trip(tmp_path):
    result = analyse_heads(
        toy_stats(), HeadSelectionConfig(k=2, scope="mid-top", variant="personalised")
    )
    selection = result.to_selection("tiny-bert", {"data": "movie-snippets"})
    path = save_selection(selection, tmp_path / "sel" / "heads.json")
    back = load_selection(path)
    assert back == selection
    assert back.as_dict() == {3: [0, 5], 4: [0, 5]}
    assert back.settings["k"] == 2 and back.settings["data"] == "movie-snippets"
    record = json.loads(path.read_text())
    assert record["format"] == FORMAT
    assert record["layers"] == {"3": [0, 5], "4": [0, 5]}
    back.check_fits(n_layers=4, n_heads=6)
    with pytest.raises(SelectionError, match="made for 4 layers; this model has 12"):
        back.check_fits(n_layers=12, n_heads=6)


GOOD = {
    "format": FORMAT,
    "model": "m",
    "n_layers": 2,
    "n_heads": 4,
    "settings": {},
    "layers": {"1": [0, 2]},
}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format": "other/1"}, "Not a head-selection file"),
        ({"layers": None}, "layers"),
        ({"layers": {"one": [0]}}, "not a layer number"),
        ({"layers": {"0": [0]}}, "numbered from 1"),
        ({"layers": {"3": [0]}}, "beyond the model's 2 layers"),
        ({"layers": {"1": [4]}}, r"heads run 0\.\.3"),
        ({"layers": {"1": [1, 1]}}, "twice"),
        ({"layers": {"1": ["a"]}}, "0-based head numbers"),
        ({"layers": {"1": []}}, "no heads"),
        ({"n_heads": 0}, "n_heads"),
    ],
)
def test_bad_selection_documents(change, match):
    with pytest.raises(SelectionError, match=match):
        selection_from_dict({**GOOD, **change})


def test_bad_selection_files(tmp_path):
    with pytest.raises(SelectionError, match="does not exist"):
        load_selection(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(SelectionError, match="not valid JSON"):
        load_selection(broken)
    no_layers = tmp_path / "no_layers.json"
    no_layers.write_text(json.dumps({"format": FORMAT, "model": "m"}))
    with pytest.raises(SelectionError, match="lacks layers"):
        load_selection(no_layers)
    bare = tmp_path / "bare.json"  # model and settings are provenance: optional
    bare.write_text(json.dumps({"format": FORMAT, "layers": {"2": [3, 1], "1": [0]}}))
    assert load_selection(bare).layers == ((1, (0,)), (2, (1, 3)))
    assert isinstance(SelectionError("x"), ValueError)


def test_selection_check_fits_heads():
    selection = HeadSelection({2: [5]}, model="m")
    selection.check_fits(n_layers=2, n_heads=6)
    with pytest.raises(SelectionError, match=r"heads run 0\.\.3"):
        selection.check_fits(n_layers=2, n_heads=4)


# ---------------------------------------------------------------------------- models


TEXTS = [
    "the film was great",
    "a bad movie",
    "i loved the acting and the music very much",
    "boring",
    "the plot is slow but the ending is beautiful",
]


def sharpen_attention(loaded, scale: float = 40.0) -> None:
    """Random tiny models attend almost uniformly (every head output then has rank 1); larger
    query weights make attention peaky, so I_h varies and padding mistakes would show."""
    from analysis.models import encoder_layers, layer_modules

    with torch.no_grad():
        for block in encoder_layers(loaded.model):
            layer_modules(block, loaded.model_family)["query"].weight.mul_(scale)


def test_captured_head_outputs_are_attention_times_values(tiny_bert_dir):
    """The hooked input of attn_out, split into heads, is softmax(QKᵀ)·V of each head."""
    from analysis.config import ModelSpec
    from analysis.extract import iter_encoded_batches, model_inputs
    from analysis.heads.collect import collect_head_stats
    from analysis.models import encoder_layers, layer_modules, load_model

    loaded = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
    sharpen_attention(loaded)
    block = encoder_layers(loaded.model)[1]
    parts = layer_modules(block, loaded.model_family)
    seen = {}
    handles = [
        parts["attn_out"].register_forward_pre_hook(lambda m, a: seen.__setitem__("ctx", a[0])),
        block.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0])),
    ]
    batch = next(iter_encoded_batches(loaded.tokenizer, TEXTS, None, 32, len(TEXTS)))
    with torch.inference_mode():
        out = loaded.model(**model_inputs(loaded.model, batch.inputs), output_attentions=True)
    for handle in handles:
        handle.remove()
    b, s = batch.inputs["input_ids"].shape
    h, dh = loaded.n_heads, loaded.d_head
    values = parts["value"](seen["x"]).view(b, s, h, dh).transpose(1, 2)  # (B, H, S, dh)
    expected = (out.attentions[1] @ values).transpose(1, 2)  # (B, S, H, dh)
    torch.testing.assert_close(seen["ctx"].view(b, s, h, dh), expected, atol=1e-5, rtol=1e-4)

    manual = HeadStatsAccumulator(1, h, dh)  # layer 2 alone
    manual.update(1, seen["ctx"].view(b, s, h, dh), batch.inputs["attention_mask"])
    stats = collect_head_stats(loaded, TEXTS, batch_size=2)
    np.testing.assert_allclose(stats.richness[1], manual.result().richness[0])
    np.testing.assert_allclose(stats.correlation[1], manual.result().correlation[0], rtol=1e-4)
    assert stats.richness.max() > 1  # sharpened: not every head output has rank 1


def test_every_family_gives_padding_free_statistics(tiny_family_dir):
    from analysis.config import ModelSpec
    from analysis.heads.collect import collect_head_stats
    from analysis.models import load_model

    family, folder = tiny_family_dir
    loaded = load_model(ModelSpec(str(folder)), device="cpu")
    sharpen_attention(loaded)
    pairs = ["what", "who is it", "the end", "a b c d e f", "no"]
    one_by_one = collect_head_stats(loaded, TEXTS, pairs, batch_size=1)
    padded = collect_head_stats(loaded, TEXTS, pairs, batch_size=5)
    assert one_by_one.richness.shape == (loaded.n_layers, loaded.n_heads)
    assert one_by_one.correlation.shape == (loaded.n_layers, loaded.n_heads, loaded.n_heads)
    assert one_by_one.n == len(TEXTS)
    np.testing.assert_allclose(padded.richness, one_by_one.richness, err_msg=family)
    np.testing.assert_allclose(
        padded.correlation, one_by_one.correlation, rtol=1e-4, err_msg=family
    )
    assert np.all(np.diagonal(padded.correlation, axis1=1, axis2=2) == 0)


def test_head_stats_are_cached_and_keyed_by_xi(tiny_bert_dir):
    from analysis.cache import DiskCache
    from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
    from analysis.heads.collect import HeadStatsConfig, head_stats
    from analysis.models import load_model

    extract = ExtractConfig(
        ModelSpec(str(tiny_bert_dir)), DataSpec("movie-snippets"), SampleSpec(n=6)
    )
    loaded = load_model(extract.model, device="cpu")
    first, meta = head_stats(HeadStatsConfig(extract), loaded=loaded)
    again, meta_again = head_stats(HeadStatsConfig(extract), loaded=loaded)
    assert (meta["cache_hit"], meta_again["cache_hit"]) == (False, True)
    np.testing.assert_array_equal(first.correlation, again.correlation)
    assert again.n == 6 and meta_again["d_head"] == loaded.d_head
    other, meta_other = head_stats(HeadStatsConfig(extract, xi=0.5), loaded=loaded)
    assert not meta_other["cache_hit"] and other.xi == 0.5
    assert len(list(DiskCache().entries())) == 2
    with pytest.raises(ValueError, match="ξ"):
        HeadStatsConfig(extract, xi=0.0)
