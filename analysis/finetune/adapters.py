"""Houlsby adapters (Houlsby et al. 2019), written here: the AdapterHub package pins transformers 4.x.

An adapter is a bottleneck MLP with a residual, ``a(x) = x + W_up · act(W_down · x + b_down) + b_up``
with x of shape (B, S, d_model) and a bottleneck of ``size`` units. Two per adapted layer: on the
output of the attention output projection and on the output of the feed-forward output projection,
both before the block's residual + LayerNorm (forward hooks on ``layer_modules(...)['attn_out']``
and ``['ffn_out']``). ``W_up`` and ``b_up`` start at zero, so a fresh adapter is exactly the
identity; ``W_down`` starts small and random, so the gradient reaches it once ``W_up`` moves.

The adapters are registered as children of their block (``adapter_attn``, ``adapter_ffn``), so they
belong to that layer's parameters (state dict, device moves, per-layer bookkeeping).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from analysis.models import layer_modules

ADAPTER_SITES = (("attn_out", "adapter_attn"), ("ffn_out", "adapter_ffn"))
INIT_STD = 1e-2  # the down projection's init; the up projection starts at zero


class HoulsbyAdapter(nn.Module):
    """x + up(gelu(down(x))), exact identity at initialisation."""

    def __init__(self, d_model: int, size: int, init_std: float = INIT_STD) -> None:
        super().__init__()
        self.down = nn.Linear(d_model, size)
        self.act = nn.GELU()
        self.up = nn.Linear(size, d_model)
        nn.init.normal_(self.down.weight, std=init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, d_model) -> same
        return x + self.up(self.act(self.down(x)))


def _hook(adapter: HoulsbyAdapter):
    def replace_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return adapter(output)

    return replace_output


def add_adapters(
    blocks: nn.ModuleList, family: str, layers: Sequence[int], size: int
) -> list[HoulsbyAdapter]:
    """Insert two adapters into each of ``layers`` (1-based) of ``blocks``; returns them all."""
    added: list[HoulsbyAdapter] = []
    for layer in layers:
        block = blocks[layer - 1]
        parts = layer_modules(block, family)
        for site, name in ADAPTER_SITES:
            if hasattr(block, name):
                raise ValueError(f"Layer {layer} already has adapters.")
            target = parts[site]
            adapter = HoulsbyAdapter(target.out_features, size)
            adapter.to(device=target.weight.device, dtype=target.weight.dtype)
            block.add_module(name, adapter)
            target.register_forward_hook(_hook(adapter))
            added.append(adapter)
    return added
