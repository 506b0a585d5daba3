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
        calls.append(len(args[1]))  # the texts (a first extraction also times a small piece)
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
    assert [n for n in calls if n == 20] == [20]
    assert torch.equal(results[0].states, results[1].states)
    assert sorted(r.meta["cache_hit"] for r in results) == [False, True]


# --- streaming to the cache ----------------------------------------------------------------------


def _cfg(loaded, csv_data, **kwargs):
    return ExtractConfig(
        model=ModelSpec(loaded.spec.name), data=DataSpec(str(csv_data)),
        sample=SampleSpec(n=20, seed=3), max_length=32, batch_size=4, **kwargs,
    )  # fmt: skip


def test_windows_stream_the_same_states_as_one_pass(tmp_path, csv_data, loaded, monkeypatch):
    import analysis.extract as extract

    cfg = _cfg(loaded, csv_data)
    one = extract_states(cfg, cache=DiskCache(tmp_path / "one"), loaded=loaded)
    monkeypatch.setattr(extract, "WINDOW_BYTES", 3 * 32 * 4 * 6)  # 6 examples per window
    assert extract.window_rows(3, 32) == 6
    many = extract_states(cfg, cache=DiskCache(tmp_path / "many"), loaded=loaded)
    torch.testing.assert_close(many.states, one.states, rtol=1e-5, atol=1e-6)
    assert torch.equal(many.labels, one.labels) and torch.equal(many.rows, one.rows)
    # Served memory-mapped, and locatable for chunked reads.
    assert many.stored is not None and many.stored.shape == (3, 20, 32)
    np.testing.assert_array_equal(many.stored.read_rows(1, 0, 20), many.states[1].numpy())


def test_precision_is_part_of_the_key_only_when_not_float32(tmp_path, csv_data, loaded):
    from analysis.extract import extraction_inputs

    plain = extraction_inputs(_cfg(loaded, csv_data), loaded, "fp")
    assert "precision" not in plain
    bf16 = extraction_inputs(_cfg(loaded, csv_data, precision="bfloat16"), loaded, "fp")
    assert bf16["precision"] == "bfloat16"
    with pytest.raises(ValueError, match="Unknown precision"):
        _cfg(loaded, csv_data, precision="int8")
    # bf16 autocast runs on the CPU too (the GPU check compares it with float32 there).
    cache = DiskCache(tmp_path / "cache")
    low = extract_states(_cfg(loaded, csv_data, precision="bfloat16"), cache=cache, loaded=loaded)
    full = extract_states(_cfg(loaded, csv_data), cache=cache, loaded=loaded)
    assert not full.meta["cache_hit"] and low.meta["cache_path"] != full.meta["cache_path"]
    torch.testing.assert_close(low.states, full.states, rtol=0.1, atol=0.1)


def test_truncated_states_file_is_detected_deleted_and_recomputed(tmp_path, csv_data, loaded):
    from pathlib import Path

    cfg = _cfg(loaded, csv_data)
    cache = DiskCache(tmp_path / "cache")
    first = extract_states(cfg, cache=cache, loaded=loaded)
    expected = first.states.clone()
    data = Path(first.meta["cache_path"]) / "data.safetensors"
    del first  # (a live memory map of a file truncated in place would fault on access)
    data.write_bytes(data.read_bytes()[:-100])
    again = extract_states(cfg, cache=cache, loaded=loaded)
    assert not again.meta["cache_hit"] and torch.equal(again.states, expected)


KILLED_WRITER = """
import os, sys, time
sys.path.insert(0, {root!r})
import analysis.extract as extract
from analysis.cache import DiskCache
from analysis.config import DataSpec, ExtractConfig, ModelSpec, SampleSpec
extract.WINDOW_BYTES = 3 * 32 * 4 * 4  # 4 examples per window: 5 windows
cfg = ExtractConfig(ModelSpec({model!r}), DataSpec({data!r}), SampleSpec(n=20, seed=3),
                    max_length=32, batch_size=2)

def progress(fraction, message):
    if fraction >= 0.5:  # two windows are on disk, the third is being computed
        open({marker!r}, "w").close()
        time.sleep(60)

extract.extract_states(cfg, progress=progress, cache=DiskCache({cache!r}))
"""


def test_extraction_killed_mid_write_leaves_nothing_that_reads_as_valid(tmp_path, csv_data, loaded):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    marker, root = tmp_path / "writing", Path(__file__).resolve().parent.parent
    script = KILLED_WRITER.format(
        root=str(root), model=loaded.spec.name, data=str(csv_data), marker=str(marker),
        cache=str(tmp_path / "cache"),
    )  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "the writer never reached the middle"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    cache = DiskCache(tmp_path / "cache")
    partial = list((tmp_path / "cache" / "states").iterdir())
    assert len(partial) == 1 and partial[0].name.startswith(".tmp-")  # only the temporary folder
    data = partial[0] / "data.safetensors"
    assert data.exists() and not (partial[0] / "meta.json").exists()
    assert list(cache.entries()) == []
    cfg = ExtractConfig(
        ModelSpec(loaded.spec.name), DataSpec(str(csv_data)), SampleSpec(n=20, seed=3),
        max_length=32, batch_size=2,
    )  # fmt: skip
    result = extract_states(cfg, cache=cache, loaded=loaded)  # recomputed, not the partial file
    assert not result.meta["cache_hit"] and torch.isfinite(result.states).all()
    assert cache.clear_stale_temp(older_than_s=-1) == 1
    assert [p.name for p in (tmp_path / "cache" / "states").iterdir()] == [
        Path(result.meta["cache_path"]).name
    ]
