"""A run's randomness, one stream per purpose (`analysis.seeding`), on a tiny BERT: under common
random numbers every arm's run with seed s sees full fine-tuning's train subset and batches in
the same order, and starts from its classifier weights and dropout state, whatever its method
draws; under independent seeds it does not; the same config still gives the same numbers."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
import torch
from tiny import WORDS, make_tiny_model_dir

from analysis.config import DataSpec, ModelSpec
from analysis.data import TaskData
from analysis.finetune import engine
from analysis.finetune.config import flat_config
from analysis.heads.select import select_heads
from analysis.models import load_model
from analysis.seeding import INDEPENDENT_BASE, PURPOSES, Stream, arm_seed, independent_seed

# Arms whose preparation draws differently: nothing (layers), LoRA's init from the global
# generator, the adapters' nn.init, and k random layers from the method stream.
ARMS = {
    "layers (2, 2, 2)": {"method": "layers", "layers": (2, 2, 2)},
    "lora": {"method": "lora", "lora_r": 2},
    "adapter": {"method": "adapter", "adapter_size": 4},
    "random layers": {"method": "layer-set", "set_pick": "random", "set_k": 1},
}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_model_dir("bert", tmp_path_factory.mktemp("seeds"), n_layers=3)
    return load_model(ModelSpec(str(folder)), device="cpu")


def part(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, 4)) for _ in range(n)]
    return pd.DataFrame({"text": texts, "label": rng.integers(0, 2, n)})


@pytest.fixture(scope="module")
def data() -> TaskData:
    return TaskData(
        spec=DataSpec("synthetic"), title="synthetic", label_names=("a", "b"),
        parts={"train": part(80, 1), "dev": part(16, 2), "test": part(16, 3)},
        task_type="classification", metric="accuracy", fingerprint="seeds-synthetic",
    )  # fmt: skip


def config(seed: int, **arm):
    base = dict(model=ModelSpec("tiny"), steps=4, eval_every=4, batch_size=8, n_train=48)
    return flat_config(**{**base, **arm, "seed": seed})


def run_seen(monkeypatch, tiny, data, cfg) -> dict:
    """Run ``cfg`` and record what its randomness gave: the train subset (row labels of the train
    part), every batch's rows, the classifier's weights and torch's generator state as the first
    step begins, and the result."""
    seen: dict = {"batches": []}
    real_subset, real_order, real_step = engine._subset, engine._batch_order, engine.train_step

    def subset(rows, n, random_state):
        out = real_subset(rows, n, random_state)
        seen.setdefault("subset", out.index.tolist())  # the first call takes the train part
        return out

    def order(n, batch_size, rng):
        for rows in real_order(n, batch_size, rng):
            seen["batches"].append(list(rows))
            yield rows

    def step(model, *args):
        if "classifier" not in seen:
            seen["classifier"] = {k: v.clone() for k, v in model.classifier.state_dict().items()}
            seen["rng"] = torch.get_rng_state()
        return real_step(model, *args)

    with monkeypatch.context() as patch:
        patch.setattr(engine, "_subset", subset)
        patch.setattr(engine, "_batch_order", order)
        patch.setattr(engine, "train_step", step)
        seen["result"] = engine.run_finetune(cfg, loaded=tiny, data=data)
    return seen


def same_classifier(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("arm", ARMS)
def test_common_random_numbers_give_every_arm_full_fine_tunings_draws(monkeypatch, tiny, data, arm):
    full = run_seen(monkeypatch, tiny, data, config(arm_seed("full", 1, "common"), method="full"))
    other = run_seen(monkeypatch, tiny, data, config(arm_seed(arm, 1, "common"), **ARMS[arm]))
    assert len(full["subset"]) == 48 and other["subset"] == full["subset"]
    assert len(full["batches"]) == 4 and other["batches"] == full["batches"]
    assert same_classifier(other["classifier"], full["classifier"])  # bit-identical
    assert torch.equal(other["rng"], full["rng"])  # dropout starts from one state
    assert other["result"].n_trainable != full["result"].n_trainable  # different arms indeed


def test_independent_seeds_give_an_arm_draws_apart_from_full_fine_tunings(monkeypatch, tiny, data):
    full_seed = arm_seed("full", 1, "independent", reference=True)
    lora_seed = arm_seed("lora", 1, "independent")
    full = run_seen(monkeypatch, tiny, data, config(full_seed, method="full"))
    other = run_seen(monkeypatch, tiny, data, config(lora_seed, **ARMS["lora"]))
    assert full["result"].seed == 1 and other["result"].seed == lora_seed != 1
    assert other["subset"] != full["subset"]
    assert other["batches"] != full["batches"]
    assert not same_classifier(other["classifier"], full["classifier"])
    assert not torch.equal(other["rng"], full["rng"])


def test_the_same_config_gives_the_same_numbers_and_another_seed_other_ones(
    monkeypatch, tiny, data
):
    cfg = config(2, **ARMS["lora"])
    first, again = (run_seen(monkeypatch, tiny, data, cfg) for _ in range(2))
    assert first["result"].curves == again["result"].curves
    assert first["result"].score == again["result"].score
    assert torch.equal(first["rng"], again["rng"])
    other = run_seen(monkeypatch, tiny, data, config(3, **ARMS["lora"]))
    assert other["batches"] != first["batches"]
    assert not same_classifier(other["classifier"], first["classifier"])


def test_a_random_arm_draws_anew_for_every_seed():
    richness = np.zeros((6, 8))
    heads = {s: select_heads(richness, np.zeros((6, 8, 8)), richness, 3, "random", seed=s)
             for s in (0, 1)}  # fmt: skip
    assert heads[0] != heads[1]
    assert heads[0] == select_heads(richness, np.zeros((6, 8, 8)), richness, 3, "random", seed=0)
    for layer, chosen in heads[1].items():  # drawn from seed 1's method stream, layer by layer
        draw = Stream(1, "method").child(layer).numpy().choice(8, 3, replace=False)
        assert chosen == sorted(int(h) for h in draw)


def test_streams_are_separate_per_purpose_seed_and_key():
    draws = {
        (seed, purpose, keys): tuple(Stream(seed, purpose, keys).numpy().integers(0, 2**62, 4))
        for seed in (0, 1)
        for purpose in PURPOSES
        for keys in ((), (1,), (2,))
    }
    assert len(set(draws.values())) == len(draws)
    assert Stream(0, "method").child(3) == Stream(0, "method", (3,))
    assert Stream(5, "dropout").torch().initial_seed() == Stream(5, "dropout").torch_seed()
    with pytest.raises(ValueError, match="Unknown purpose 'order'"):
        Stream(0, "order")
    with pytest.raises(ValueError, match="whole numbers ≥ 0"):
        Stream(-1, "method")


def test_independent_seeds_are_stable_and_never_the_references():
    digest = hashlib.sha256(b"lora\x1f0").digest()
    assert independent_seed("lora", 0) == 2**31 + int.from_bytes(digest[:4], "big") % 2**31
    seeds = {independent_seed(arm, s) for arm in ARMS for s in range(10)}
    assert len(seeds) == 40 and min(seeds) >= INDEPENDENT_BASE and max(seeds) < 2**32
    assert arm_seed("full", 3, "independent", reference=True) == 3
    assert arm_seed("lora", 3, "common") == 3
    assert arm_seed("lora", 3, "independent") == independent_seed("lora", 3)
    with pytest.raises(ValueError, match="Unknown seed design 'paired'"):
        arm_seed("lora", 0, "paired")


def test_the_recipe_module_derives_the_streams_as_tunescope_does():
    from analysis.export import tunescope_recipe as recipe
    from analysis.seeding import GLOBALS_KEY

    assert recipe.GLOBALS_KEY == GLOBALS_KEY
    for purpose, number in recipe.STREAMS.items():
        assert PURPOSES[purpose] == number
        for seed in (0, 7, 2**31 + 5):
            assert recipe.stream_seed(seed, purpose) == Stream(seed, purpose).torch_seed()
            assert (
                recipe.stream_seed(seed, purpose, GLOBALS_KEY)
                == Stream(seed, purpose).child(GLOBALS_KEY).torch_seed()
            )
    rows = recipe.tunescope_batches(20, 8, 4, 5)
    order = engine._batch_order(20, 8, Stream(4, "batch_order").numpy())
    assert rows == [next(order) for _ in range(5)]
