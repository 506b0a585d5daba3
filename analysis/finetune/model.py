"""The model a run trains: the encoder cut at the classifier's layer ℓ_cls, then a fresh classifier.

``EncoderClassifier(encoder, family, n_outputs, classifier_layer, pooling)``:

- ``encoder``: the HF base encoder with the layers above the classifier's layer deleted from its
  ModuleList (and ``num_hidden_layers`` / ``n_layers`` of its config updated), so they cost neither
  time nor memory. Its ``last_hidden_state`` is therefore hidden_states[ℓ_cls]. The pooler, if any,
  is dropped: the fresh classifier replaces it.
- ``classifier``: dropout → dense (d_model → d_model) → tanh → dropout → linear (d_model → C), on
  the pooled representation (docs/explanation/layer-metrics.md, "Pooling": the mean over real,
  non-special tokens, or the first token). Regression tasks have C = 1.

Frozen layers below the lowest trainable one build no autograd graph: their parameters do not
require grad and neither does their input, so autograd records nothing for them (no saved
activations, no backward work) — the same effect as running them under ``torch.no_grad``.
The tests check this with a hook (``requires_grad`` of the frozen layers' outputs is False).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from analysis.config import POOLINGS
from analysis.extract import model_inputs, pool
from analysis.models import LoadedModel, config_dims, encoder_layers


def truncate_encoder(encoder: nn.Module, classifier_layer: int) -> None:
    """Delete the layers above ``classifier_layer`` (1-based) in place and update the config."""
    layers = encoder_layers(encoder)
    if not 1 <= classifier_layer <= len(layers):
        raise ValueError(
            f"The classifier's layer must be within 1..{len(layers)} (got {classifier_layer})."
        )
    del layers[classifier_layer:]
    config = encoder.config
    for key in ("num_hidden_layers", "n_layers"):
        if hasattr(config, key):
            setattr(config, key, classifier_layer)


def truncated_copy(loaded: LoadedModel, classifier_layer: int | None = None) -> nn.Module:
    """A trainable deep copy of the shared encoder holding only layers 1..``classifier_layer``.

    Like `analysis.models.trainable_copy` (requires_grad on, train mode), but the layers above
    the classifier's layer are never copied (not even for a moment), so a cut run's memory peak
    does not include them. The shared ``loaded.model`` is not touched.
    """
    layers = encoder_layers(loaded.model)
    classifier_layer = classifier_layer or len(layers)
    if not 1 <= classifier_layer <= len(layers):
        raise ValueError(
            f"The classifier's layer must be within 1..{len(layers)} (got {classifier_layer})."
        )
    memo = {id(block): None for block in layers[classifier_layer:]}  # deepcopy yields None for them
    clone = copy.deepcopy(loaded.model, memo)
    truncate_encoder(clone, classifier_layer)
    clone.requires_grad_(True)
    clone.train()
    return clone


def use_fast_attention(encoder: nn.Module) -> str:
    """Switch the (copied) encoder to PyTorch SDPA attention where the family supports it.

    The analyses load models with eager attention (they need attention weights); training does not,
    and SDPA is faster and lighter. Returns the implementation in use.
    """
    if getattr(encoder, "_supports_sdpa", False):  # MPNet and DeBERTa-v2 stay eager
        with contextlib.suppress(ValueError, ImportError, AttributeError, NotImplementedError):
            encoder.set_attn_implementation("sdpa")
    return getattr(encoder.config, "_attn_implementation", None) or "eager"


class Classifier(nn.Module):
    """dropout → dense → tanh → dropout → linear, as RoBERTa's sequence classifier is; weights
    N(0, 0.02²) drawn from ``generator`` (torch's global generator when None), biases zero."""

    def __init__(
        self,
        d_model: int,
        n_outputs: int,
        dropout: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, n_outputs)
        for linear in (self.dense, self.out):
            nn.init.normal_(linear.weight, std=0.02, generator=generator)
            nn.init.zeros_(linear.bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # (B, d) -> (B, C)
        hidden = torch.tanh(self.dense(self.dropout(pooled)))
        return self.out(self.dropout(hidden))


class EncoderClassifier(nn.Module):
    """A truncated encoder and a fresh classifier (module docstring).

    n_layers_total: L of the uncut model, when ``encoder`` comes already cut (`truncated_copy`);
    None = the encoder's own layer count. generator: what the classifier's weights are drawn
    from (`Classifier`).
    """

    def __init__(
        self,
        encoder: nn.Module,
        family: str,
        n_outputs: int,
        classifier_layer: int | None = None,
        pooling: str = "mean",
        n_layers_total: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"Unknown pooling {pooling!r}: choose {' or '.join(POOLINGS)}.")
        if n_outputs < 1:
            raise ValueError(f"A classifier needs at least one output (got {n_outputs}).")
        n_layers = n_layers_total or len(encoder_layers(encoder))
        truncate_encoder(encoder, classifier_layer or len(encoder_layers(encoder)))
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # unused: the fresh classifier reads the pooled states
        config = encoder.config
        d_model, n_heads = config_dims(config)
        dropout = getattr(config, "hidden_dropout_prob", None)
        if dropout is None:
            dropout = getattr(config, "dropout", 0.1)
        self.encoder = encoder
        self.model_family = family
        self.pooling = pooling
        self.n_layers_total = n_layers
        self.n_outputs = n_outputs
        self.d_model, self.n_heads = d_model, n_heads
        self.classifier = Classifier(d_model, n_outputs, float(dropout), generator)

    @property
    def n_layers_kept(self) -> int:
        return len(encoder_layers(self.encoder))

    @property
    def layers(self) -> nn.ModuleList:
        """The kept transformer blocks, bottom to top (layer ℓ is ``layers[ℓ - 1]``)."""
        return encoder_layers(self.encoder)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, S)
        attention_mask: torch.Tensor,  # (B, S) 1 = real token
        token_type_ids: torch.Tensor | None = None,
        special_tokens_mask: torch.Tensor | None = None,  # (B, S) 1 = special token
    ) -> torch.Tensor:  # (B, C) logits, or (B, 1) for regression
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        hidden = self.encoder(**model_inputs(self.encoder, inputs)).last_hidden_state  # (B, S, d)
        real = attention_mask.bool()
        if special_tokens_mask is not None:
            real = real & ~special_tokens_mask.bool()
        pooled = pool(hidden, real, attention_mask, self.pooling)  # (B, d)
        return self.classifier(pooled)
