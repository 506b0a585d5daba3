import numpy as np
import pandas as pd
import pytest
import torch

from analysis.cache import DiskCache
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
from analysis.extract import extract_states, iter_encoded_batches, model_inputs, pool
from analysis.models import load_model

TEXTS = [
    "the movie was good",
    "bad",
    "a very long and boring film with awful acting and a dull plot",
    "",
    "great fun",
    "the worst script",
    "i loved the music and the ending",
    "no",
]


@pytest.fixture
def csv_data(tmp_path):
    path = tmp_path / "tiny.csv"
    rows = [(t or "  ", i % 2) for i, t in enumerate(TEXTS * 5)]
    pd.DataFrame(rows, columns=["text", "label"]).assign(
        text=lambda f: [f"{t} {i}" for i, t in enumerate(f.text)]
    ).to_csv(path, index=False)
    return path


@pytest.fixture
def loaded(tiny_bert_dir):
    return load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")


def test_batches_are_sorted_by_length_and_padded_per_batch(loaded):
    batches = list(iter_encoded_batches(loaded.tokenizer, TEXTS, None, 64, 3))
    widths = [b.inputs["input_ids"].shape[1] for b in batches]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    seen = torch.cat([b.indices for b in batches])
    assert sorted(seen.tolist()) == list(range(len(TEXTS)))
    for b in batches:  # special tokens and padding are never "real"
        ids = b.inputs["input_ids"]
        assert not b.real_mask[ids == loaded.tokenizer.cls_token_id].any()
        assert not b.real_mask[b.inputs["attention_mask"] == 0].any()


def test_pooling_matches_a_hand_computation(loaded):
    """Batched, padded extraction equals a one-example-at-a-time hand computation."""
    from analysis.extract import forward_all_layers

    for pooling in ("mean", "first"):
        batched = forward_all_layers(loaded, TEXTS, None, pooling, 64, 4)
        assert batched.shape == (3, len(TEXTS), 32)
        for i, text in enumerate(TEXTS):
            enc = loaded.tokenizer(text, return_tensors="pt", return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask")[0].bool()
            with torch.no_grad():
                hidden = loaded.model(**enc, output_hidden_states=True).hidden_states
            for layer, h in enumerate(hidden):
                h = h[0]  # (S, d)
                if pooling == "first":
                    expected = h[0]
                elif (~special).any():
                    expected = h[~special].mean(0)
                else:  # empty text: only [CLS] [SEP]
                    expected = h.mean(0)
                torch.testing.assert_close(batched[layer, i], expected, atol=1e-5, rtol=1e-4)


def test_mean_and_first_differ(loaded):
    from analysis.extract import forward_all_layers

    mean = forward_all_layers(loaded, TEXTS, None, "mean", 64, 4)
    first = forward_all_layers(loaded, TEXTS, None, "first", 64, 4)
    assert not torch.allclose(mean[1:], first[1:])


def test_pool_weights():
    hidden = torch.arange(12.0).reshape(1, 4, 3)
    real = torch.tensor([[False, True, True, False]])
    attention = torch.tensor([[1, 1, 1, 0]])
    assert torch.equal(pool(hidden, real, attention, "mean")[0], hidden[0, 1:3].mean(0))
    assert torch.equal(pool(hidden, real, attention, "first")[0], hidden[0, 0])


def test_text_pairs_are_encoded_as_pairs(loaded):
    batches = list(iter_encoded_batches(loaded.tokenizer, ["good", "bad"], ["fun", "dull"], 32, 2))
    ids = batches[0].inputs["input_ids"][0].tolist()
    assert ids.count(loaded.tokenizer.sep_token_id) == 2
    assert batches[0].inputs["token_type_ids"].max() == 1


def test_distilbert_gets_no_token_type_ids(tiny_root):
    from tiny import make_tiny_model_dir

    loaded = load_model(ModelSpec(str(make_tiny_model_dir("distilbert", tiny_root))), device="cpu")
    batch = next(iter_encoded_batches(loaded.tokenizer, ["good"], None, 16, 1))
    assert "token_type_ids" not in model_inputs(loaded.model, batch.inputs)


def test_extract_states_caches_and_serves(tmp_path, csv_data, loaded):
    cfg = ExtractConfig(
        model=ModelSpec(str(loaded.spec.name)),
        data=DataSpec(str(csv_data)),
        sample=SampleSpec(n=20, seed=3),
        max_length=32,
        batch_size=4,
    )
    cache = DiskCache(tmp_path / "cache")
    seen = []
    first = extract_states(cfg, progress=lambda f, m: seen.append(f), cache=cache, loaded=loaded)
    assert first.states.shape == (3, 20, 32) and first.labels.shape == (20,)
    assert not first.meta["cache_hit"] and seen[-1] == pytest.approx(1.0)
    second = extract_states(cfg, cache=cache, loaded=loaded)
    assert second.meta["cache_hit"]
    assert torch.equal(first.states, second.states) and torch.equal(first.rows, second.rows)
    # Another sample seed is another entry.
    other = extract_states(
        ExtractConfig(cfg.model, cfg.data, SampleSpec(n=20, seed=4), max_length=32),
        cache=cache,
        loaded=loaded,
    )
    assert not other.meta["cache_hit"]
    assert not np.array_equal(other.rows.numpy(), first.rows.numpy())


def test_cancelled_extraction_writes_nothing(tmp_path, csv_data, loaded):
    from analysis.progress import Cancelled

    cfg = ExtractConfig(
        model=ModelSpec(loaded.spec.name), data=DataSpec(str(csv_data)),
        sample=SampleSpec(n=20), max_length=32, batch_size=4,
    )  # fmt: skip
    cache = DiskCache(tmp_path / "cache")

    def cancel(fraction, message):
        if fraction > 0.3:
            raise Cancelled("stop")

    with pytest.raises(Cancelled):
        extract_states(cfg, progress=cancel, cache=cache, loaded=loaded)
    assert list(cache.entries()) == []
    assert not extract_states(cfg, cache=cache, loaded=loaded).meta["cache_hit"]


def test_two_sessions_asking_for_the_same_extraction_compute_once(
    tmp_path, csv_data, loaded, monkeypatch
):
    import threading

    import analysis.extract as extract

    calls = []
    real = extract.iter_pooled_windows

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(extract, "iter_pooled_windows", counting)
    cfg = ExtractConfig(
        model=ModelSpec(loaded.spec.name), data=DataSpec(str(csv_data)),
        sample=SampleSpec(n=20), max_length=32,
    )  # fmt: skip
    cache = DiskCache(tmp_path / "cache")
    results = []
    threads = [
        threading.Thread(
            target=lambda: results.append(extract_states(cfg, cache=cache, loaded=loaded))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]
    assert torch.equal(results[0].states, results[1].states)
    assert sorted(r.meta["cache_hit"] for r in results) == [False, True]
