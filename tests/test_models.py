import json

import pytest
import torch
import transformers as tf

from analysis.config import ModelError, ModelSpec
from analysis.models import (
    HUB_TIMEOUT_S,
    LAYER_PARTS,
    OFFLINE_ENV,
    check_family,
    encoder_layers,
    layer_modules,
    load_model,
    trainable_copy,
)


def test_every_family_loads_with_its_parts(tiny_family_dir):
    family, folder = tiny_family_dir
    loaded = load_model(ModelSpec(str(folder)), device="cpu")
    assert loaded.model_family == family
    assert (loaded.n_layers, loaded.n_heads, loaded.d_model, loaded.d_head) == (2, 4, 32, 8)
    layers = encoder_layers(loaded.model)
    assert len(layers) == 2
    parts = layer_modules(layers[0], family)
    assert set(parts) == set(LAYER_PARTS[family])
    assert parts["attn_out"].in_features == loaded.n_heads * loaded.d_head
    assert all(not p.requires_grad for p in loaded.model.parameters())
    assert not loaded.model.training


def test_fingerprint_is_stable_and_weight_sensitive(tiny_bert_dir):
    a = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
    b = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
    assert a.fingerprint == b.fingerprint
    copy = trainable_copy(a)
    with torch.no_grad():
        encoder_layers(copy)[0].attention.self.query.weight.add_(1.0)
    from analysis.models import weights_fingerprint

    assert weights_fingerprint(copy) != a.fingerprint


def test_trainable_copy_leaves_shared_model_untouched(tiny_bert_dir):
    loaded = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    copy = trainable_copy(loaded)
    assert copy.training and all(p.requires_grad for p in copy.parameters())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(1.0)
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, before[k])


def test_builtin_minilm_loads_offline():
    loaded = load_model(ModelSpec("minilm"), device="cpu")
    assert (loaded.model_family, loaded.n_layers, loaded.n_heads, loaded.d_model) == (
        "bert",
        6,
        12,
        384,
    )


def test_missing_folder(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(ModelSpec(str(tmp_path / "nope")))


def test_folder_without_weights(tmp_path, tiny_bert_dir):
    folder = tmp_path / "noweights"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (tiny_bert_dir / name).exists():
            (folder / name).write_bytes((tiny_bert_dir / name).read_bytes())
    with pytest.raises(ModelError, match="weights"):
        load_model(ModelSpec(str(folder)))


def test_corrupt_safetensors(tmp_path, tiny_bert_dir):
    folder = tmp_path / "corrupt"
    folder.mkdir()
    for f in tiny_bert_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelError, match="weights"):
        load_model(ModelSpec(str(folder)))


def test_decoder_only_model_is_refused(tmp_path, tiny_bert_dir):
    folder = tmp_path / "gpt2"
    tf.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=100).save_pretrained(folder)
    with pytest.raises(ModelError, match="not an encoder"):
        load_model(ModelSpec(str(folder)))


def test_decoder_configured_bert_is_refused():
    with pytest.raises(ModelError, match="decoder"):
        check_family(tf.BertConfig(is_decoder=True))


def test_unknown_family_is_refused():
    with pytest.raises(ModelError, match="not a supported encoder family"):
        check_family(tf.ViTConfig())


def test_tokenizer_model_mismatch(tmp_path, tiny_bert_dir):
    folder = tmp_path / "mismatch"
    folder.mkdir()
    for f in tiny_bert_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = 10
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError):
        load_model(ModelSpec(str(folder)))


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_a_hub_id_with_the_hub_off_is_refused_at_once(monkeypatch, capsys, variable):
    """Not built in, not a folder, the hub off: one message, before anything is tried."""
    import time

    from tunescope.cli import main

    for name in OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "1")
    started = time.perf_counter()
    with pytest.raises(ModelError) as refused:
        load_model(ModelSpec("no-such-org/no-such-model"))
    assert time.perf_counter() - started < 3.0  # (the hub client's imports, on a busy machine)
    assert str(refused.value).startswith(
        "Model 'no-such-org/no-such-model' is neither a built-in model nor a folder, and the "
        "model hub is off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set) with no copy of it in "
        "this machine's hub cache. Built-in models: minilm, mpnet"
    ), refused.value
    assert main(["layers", "--model", "no-such-model-xyz", "--n", "40"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: Model 'no-such-model-xyz' is neither a built-in"), err
    assert "the model hub is off" in err[-1]


SILENT_HUB = """
import time
from analysis.config import ModelError, ModelSpec
from analysis.models import load_model
started = time.perf_counter()
try:
    load_model(ModelSpec("no-such-model-xyz"))
except ModelError as exc:
    print(f"{time.perf_counter() - started:.2f}")
    print(exc)
"""


def test_a_hub_id_is_looked_up_once_within_a_bounded_time(tmp_path):
    """The hub allowed but silent (a closed port on loopback): one look-up, no retries (the hub
    client's own retries waited about 25 s here), then one message naming the hub."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_ENV}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run(
        [sys.executable, "-c", SILENT_HUB], cwd=Path(__file__).resolve().parent.parent,
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    seconds, message = done.stdout.strip().splitlines()[-2:]
    assert float(seconds) < 5.0, done.stdout + done.stderr
    assert message.startswith(
        "Model 'no-such-model-xyz' is neither a built-in model nor a folder, and the model hub "
        f"(http://127.0.0.1:9) could not say within {HUB_TIMEOUT_S:g} s whether it has it ("
    ), message
    assert "Retrying" not in done.stderr, done.stderr


RACE = """
import sys, threading
from analysis.config import ModelSpec
from analysis.models import load_model, n_layers_of
errors = []
def go(f):
    try:
        f()
    except Exception as exc:
        errors.append(repr(exc))
jobs = [lambda: load_model(ModelSpec(sys.argv[1]), device="cpu"),
        lambda: n_layers_of(ModelSpec(sys.argv[1])),
        lambda: load_model(ModelSpec(sys.argv[1]), device="cpu")]
threads = [threading.Thread(target=go, args=(job,)) for job in jobs]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def test_first_loads_from_several_threads_at_once(tiny_bert_dir):
    """A fresh process (nothing of transformers imported yet) loading from three threads at once,
    as the dashboard's warm-up thread and its first page do: without the load lock one of them
    got "cannot import name 'AutoConfig'" from the half-imported package, every time."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", RACE, str(tiny_bert_dir)],
        cwd=root, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
