"""The attention pattern of one example (analysis.heads.attention) on the tiny model of every
family: A_h mixes the values into exactly the head output the heads analysis captures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.config import ModelSpec
from analysis.heads.attention import attention_pattern
from analysis.models import encoder_layers, layer_modules, load_model


def captured_values_and_outputs(loaded, text: str, layer: int):
    """V (S, H·d_head) out of the value projection and the head outputs O (S, H·d_head) going
    into the attention output projection, for ``text`` at ``layer`` (1-based)."""
    block = encoder_layers(loaded.model)[layer - 1]
    parts = layer_modules(block, loaded.model_family)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        parts["value"].register_forward_hook(lambda m, a, out: seen.__setitem__("v", out)),
        parts["attn_out"].register_forward_pre_hook(lambda m, a: seen.__setitem__("o", a[0])),
    ]
    try:
        enc = loaded.tokenizer([text], return_tensors="pt")
        accepted = {
            k: v
            for k, v in enc.items()
            if k != "token_type_ids" or loaded.model_family != "distilbert"
        }
        with torch.inference_mode():
            loaded.model(**accepted)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["v"][0].double(), seen["o"][0].double()


def test_every_family_gives_row_stochastic_patterns_that_make_the_head_outputs(tiny_family_dir):
    family, folder = tiny_family_dir
    loaded = load_model(ModelSpec(str(folder)), device="cpu")
    text = "the film was not good but the music was great"
    pattern = attention_pattern(loaded, text, max_length=32)
    n_tokens = len(pattern.tokens)
    assert pattern.weights.shape == (loaded.n_layers, loaded.n_heads, n_tokens, n_tokens)
    assert n_tokens == len(loaded.tokenizer(text)["input_ids"])
    assert "good" in pattern.tokens, family
    np.testing.assert_allclose(pattern.weights.sum(axis=-1), 1.0, atol=1e-5, err_msg=family)
    layer, d_head = loaded.n_layers, loaded.d_head
    values, outputs = captured_values_and_outputs(loaded, text, layer)
    for head in range(loaded.n_heads):
        a = torch.from_numpy(pattern.head(layer, head)).double()  # (S, S)
        cols = slice(head * d_head, (head + 1) * d_head)
        torch.testing.assert_close(a @ values[:, cols], outputs[:, cols], atol=1e-4, rtol=1e-3)


def test_truncation_pairs_and_bad_input(tiny_bert_dir):
    loaded = load_model(ModelSpec(str(tiny_bert_dir)), device="cpu")
    long = attention_pattern(loaded, " ".join(["good"] * 50), max_length=8)
    assert len(long.tokens) == 8 and long.tokens[0] == "[CLS]" and long.tokens[-1] == "[SEP]"
    pair = attention_pattern(loaded, "who is it", "the actor")
    assert pair.tokens.count("[SEP]") == 2
    with pytest.raises(ValueError, match="non-empty"):
        attention_pattern(loaded, "  ")
    with pytest.raises(ValueError, match=r"layer must be within 1\.\.2"):
        pair.head(3, 0)
    with pytest.raises(ValueError, match=r"head must be within 0\.\.3"):
        pair.head(1, 4)
