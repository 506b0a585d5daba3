"""What trains, per method (SPEC "Strategies" and "Heads").

``METHODS[name]`` is ``prepare(model, cfg, inputs) -> Prepared``. A preparer may add modules to
the model (adapters, LoRA), sets ``requires_grad`` on exactly the parameters that train, and
returns a `Prepared` (`analysis.finetune.prepared`): the optimizer's parameter groups and, for
partly trained tensors, gradient masks. ``inputs`` carries what a method needs besides the model
and the config (the subspace methods' trajectory).

The classifier always trains. Embeddings and LayerNorms stay frozen unless the method says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from analysis.finetune.adapters import add_adapters
from analysis.finetune.config import AdapterOptions, FinetuneConfig, HeadsOptions, LoraOptions
from analysis.finetune.model import EncoderClassifier
from analysis.finetune.prepared import MethodInputs, Prepared
from analysis.finetune.subspace import prepare_subspace, prepare_subspace_random
from analysis.models import LAYER_PARTS, embeddings, layer_modules

Preparer = Callable[[EncoderClassifier, FinetuneConfig, MethodInputs], Prepared]


def train_only(model: EncoderClassifier, params: Iterable[nn.Parameter]) -> None:
    """Freeze everything, then unfreeze ``params`` and the classifier."""
    model.requires_grad_(False)
    for param in params:
        param.requires_grad_(True)
    model.classifier.requires_grad_(True)


def _blocks(model: EncoderClassifier, layers: Iterable[int]) -> list[nn.Module]:
    return [model.layers[layer - 1] for layer in layers]


def prepare_full(model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs) -> Prepared:
    model.requires_grad_(True)
    return Prepared.from_model(model, "everything: embeddings, every kept layer, classifier")


def prepare_frozen(model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs) -> Prepared:
    train_only(model, ())
    return Prepared.from_model(model, "classifier only (frozen encoder)")


def prepare_layers(model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs) -> Prepared:
    n_layers = model.n_layers_total
    bottom, top, head = cfg.resolved_layers(n_layers)
    if (bottom, top, head) == (1, n_layers, n_layers):
        model.requires_grad_(True)  # (1, L, L) is full fine-tuning: embeddings train too
        return Prepared.from_model(model, f"layers (1, {n_layers}, {n_layers}): full fine-tuning")
    blocks = _blocks(model, range(bottom, top + 1))
    train_only(model, (p for block in blocks for p in block.parameters()))
    return Prepared.from_model(
        model, f"layers {bottom}..{top} and the classifier; classifier on layer {head}"
    )


def prepare_bitfit(model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs) -> Prepared:
    biases = [p for name, p in model.encoder.named_parameters() if name.endswith("bias")]
    train_only(model, biases)
    return Prepared.from_model(model, f"every bias ({len(biases)} tensors) and the classifier")


def prepare_heads(model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs) -> Prepared:
    """Q, K, V rows h·d_head:(h+1)·d_head (output features) and bias entries of chosen heads."""
    n_heads = model.n_heads
    masks: dict[nn.Parameter, torch.Tensor] = {}
    selection = cfg.options_for(HeadsOptions).heads
    for layer, heads in selection.layers:
        parts = layer_modules(model.layers[layer - 1], model.family)
        for key in ("query", "key", "value"):
            linear = parts[key]
            d_head = linear.out_features // n_heads
            rows = torch.zeros(linear.out_features, dtype=torch.bool, device=linear.weight.device)
            for h in heads:
                rows[h * d_head : (h + 1) * d_head] = True
            masks[linear.weight] = rows[:, None].expand_as(linear.weight).clone()
            if linear.bias is not None:
                masks[linear.bias] = rows.clone()
    train_only(model, masks)
    n_chosen = selection.n_selected
    layers = ", ".join(str(layer) for layer, _ in selection.layers)
    return Prepared.from_model(
        model,
        f"Q/K/V rows of {n_chosen} heads in layers {layers}, and the classifier",
        grad_masks=masks,
    )


def prepare_adapter(
    model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs
) -> Prepared:
    options = cfg.options_for(AdapterOptions)
    layers = cfg.placement(model.n_layers_total)
    adapters = add_adapters(model.layers, model.family, layers, options.size)
    norms = []
    for block in _blocks(model, layers):
        parts = layer_modules(block, model.family)
        norms += [*parts["attn_norm"].parameters(), *parts["ffn_norm"].parameters()]
    train_only(model, [*(p for a in adapters for p in a.parameters()), *norms])
    return Prepared.from_model(
        model,
        f"Houlsby adapters (size {options.size}) and LayerNorms in layers "
        f"{_span(layers)}, and the classifier",
    )


def prepare_lora(model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs) -> Prepared:
    """PEFT's LoRA on query and value of the chosen layers, injected in place (no wrapper).

    ΔW = (lora_alpha / r) · B A with B = 0 at the start (so the model starts unchanged), no LoRA
    dropout, no bias training. ``layers_to_transform`` takes 0-based indices under the
    ``layer`` ModuleList, which is how every supported family names its blocks.
    """
    from peft import LoraConfig, inject_adapter_in_model

    options = cfg.options_for(LoraOptions)
    layers = cfg.placement(model.n_layers_total)
    parts = LAYER_PARTS[model.family]
    lora_config = LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=0.0,
        target_modules=[parts["query"], parts["value"]],
        layers_to_transform=[layer - 1 for layer in layers],
        layers_pattern="layer",
        bias="none",
    )
    inject_adapter_in_model(lora_config, model.encoder)
    lora = [p for name, p in model.encoder.named_parameters() if ".lora_" in name]
    n_expected = 4 * len(layers)  # A and B, for query and value
    if len(lora) != n_expected:
        raise RuntimeError(
            f"LoRA landed on {len(lora) // 2} modules, expected {n_expected // 2} "
            f"(query and value of layers {_span(layers)})."
        )
    train_only(model, lora)
    return Prepared.from_model(
        model,
        f"LoRA r={options.r}, alpha={options.alpha} on query and value of layers "
        f"{_span(layers)}, and the classifier",
    )


METHODS: dict[str, Preparer] = {
    "full": prepare_full,
    "layers": prepare_layers,
    "heads": prepare_heads,
    "adapter": prepare_adapter,
    "lora": prepare_lora,
    "bitfit": prepare_bitfit,
    "frozen": prepare_frozen,
    "subspace": prepare_subspace,
    "subspace-random": prepare_subspace_random,
}


def prepare_method(
    model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs | None = None
) -> Prepared:
    """Run the preparer of ``cfg.method`` on ``model`` (in place) and return what it trains."""
    prepared = METHODS[cfg.method](model, cfg, inputs or MethodInputs())
    if not isinstance(prepared, Prepared):
        raise TypeError(f"The preparer of {cfg.method!r} returned {type(prepared).__name__}.")
    return prepared


def _span(layers: tuple[int, ...]) -> str:
    if len(layers) > 1 and layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


def trainable_layers(model: EncoderClassifier) -> tuple[int, ...]:
    """1-based kept layers with at least one trainable parameter."""
    return tuple(
        i + 1
        for i, block in enumerate(model.layers)
        if any(p.requires_grad for p in block.parameters())
    )


def embeddings_train(model: EncoderClassifier) -> bool:
    return any(p.requires_grad for p in embeddings(model.encoder).parameters())
