"""What trains, per method (SPEC "Strategies" and "Heads").

``METHODS[name]`` is ``prepare(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared``, or a
``"module:function"`` string resolved at call time (the subspace methods live in
``analysis.subspace_train``). A preparer may add modules to the model (adapters, LoRA), sets
``requires_grad`` on exactly the parameters that train, and returns a `Prepared`: the optimizer's
parameter groups and, for partly trained tensors, gradient masks.

The classifier always trains. Embeddings and LayerNorms stay frozen unless the method says so.

Partly trained tensors (method ``heads``): the gradient of every entry outside the mask is set to
zero after each backward pass, and the tensor is kept out of weight decay. With AdamW, an entry
whose gradient is always exactly zero keeps both moments at exactly zero, so its update is
0 / (0 + eps) = 0 and the entry stays bit-identical. (Weight decay would shrink it, hence the
no-decay group; the selected entries of such a tensor therefore get no weight decay either.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from analysis.finetune.adapters import add_adapters
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.model import EncoderClassifier
from analysis.models import LAYER_PARTS, embeddings, layer_modules

Preparer = Callable[[EncoderClassifier, FinetuneConfig], "Prepared"]


@dataclass
class Prepared:
    """What a method trains.

    decay / no_decay: the trainable parameters, split for AdamW's weight decay (matrices decay;
    biases, LayerNorm weights and masked tensors do not).
    grad_masks: {parameter: bool mask of its shape}, True = this entry trains; the engine zeroes
    the other entries' gradients after every backward pass (`apply_grad_masks`).
    after_step: called after every optimizer step (e.g. to refresh a re-parameterisation), and
    once more after the best-dev state is restored.
    trained_layers: the 1-based layers this method updates, for ``layers_backward``; None = every
    kept layer holding a parameter with ``requires_grad``.
    """

    decay: list[nn.Parameter]
    no_decay: list[nn.Parameter]
    grad_masks: dict[nn.Parameter, torch.Tensor] = field(default_factory=dict)
    description: str = ""
    after_step: Callable[[], None] | None = None
    trained_layers: tuple[int, ...] | None = None

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        description: str,
        grad_masks: dict[nn.Parameter, torch.Tensor] | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> Prepared:
        """Every parameter of ``model`` with ``requires_grad``, split into decay / no-decay."""
        masks = grad_masks or {}
        decay: list[nn.Parameter] = []
        no_decay: list[nn.Parameter] = []
        for param in model.parameters():
            if not param.requires_grad:
                continue
            if param in masks or param.ndim < 2:
                no_decay.append(param)
            else:
                decay.append(param)
        if not decay and not no_decay:
            raise ValueError(f"Nothing to train ({description}).")
        return cls(decay, no_decay, dict(masks), description, after_step)

    @property
    def params(self) -> list[nn.Parameter]:
        return self.decay + self.no_decay

    @property
    def n_trainable(self) -> int:
        """Entries that train: whole tensors, plus the True entries of masked ones."""
        return sum(
            int(self.grad_masks[p].sum()) if p in self.grad_masks else p.numel()
            for p in self.params
        )

    def param_groups(self, weight_decay: float) -> list[dict]:
        groups = [
            {"params": self.decay, "weight_decay": weight_decay},
            {"params": self.no_decay, "weight_decay": 0.0},
        ]
        return [g for g in groups if g["params"]]

    def apply_grad_masks(self) -> None:
        for param, mask in self.grad_masks.items():
            if param.grad is not None:
                # masked_fill, not a multiply: an inf or NaN gradient times 0 is still NaN
                param.grad.masked_fill_(~mask, 0.0)


def train_only(model: EncoderClassifier, params: Iterable[nn.Parameter]) -> None:
    """Freeze everything, then unfreeze ``params`` and the classifier."""
    model.requires_grad_(False)
    for param in params:
        param.requires_grad_(True)
    model.classifier.requires_grad_(True)


def _blocks(model: EncoderClassifier, layers: Iterable[int]) -> list[nn.Module]:
    return [model.layers[layer - 1] for layer in layers]


def prepare_full(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    model.requires_grad_(True)
    return Prepared.from_model(model, "everything: embeddings, every kept layer, classifier")


def prepare_frozen(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    train_only(model, ())
    return Prepared.from_model(model, "classifier only (frozen encoder)")


def prepare_layers(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
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


def prepare_bitfit(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    biases = [p for name, p in model.encoder.named_parameters() if name.endswith("bias")]
    train_only(model, biases)
    return Prepared.from_model(model, f"every bias ({len(biases)} tensors) and the classifier")


def prepare_heads(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    """Q, K, V rows h·d_head:(h+1)·d_head (output features) and bias entries of chosen heads."""
    n_heads = _n_heads(model)
    masks: dict[nn.Parameter, torch.Tensor] = {}
    for layer, heads in cfg.heads or ():
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
    n_chosen = sum(len(h) for _, h in cfg.heads or ())
    layers = ", ".join(str(layer) for layer, _ in cfg.heads or ())
    return Prepared.from_model(
        model,
        f"Q/K/V rows of {n_chosen} heads in layers {layers}, and the classifier",
        grad_masks=masks,
    )


def prepare_adapter(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    layers = cfg.placement(model.n_layers_total)
    adapters = add_adapters(model.layers, model.family, layers, cfg.adapter_size)
    norms = []
    for block in _blocks(model, layers):
        parts = layer_modules(block, model.family)
        norms += [*parts["attn_norm"].parameters(), *parts["ffn_norm"].parameters()]
    train_only(model, [*(p for a in adapters for p in a.parameters()), *norms])
    return Prepared.from_model(
        model,
        f"Houlsby adapters (size {cfg.adapter_size}) and LayerNorms in layers "
        f"{_span(layers)}, and the classifier",
    )


def prepare_lora(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    """PEFT's LoRA on query and value of the chosen layers, injected in place (no wrapper).

    ΔW = (lora_alpha / r) · B A with B = 0 at the start (so the model starts unchanged), no LoRA
    dropout, no bias training. ``layers_to_transform`` takes 0-based indices under the
    ``layer`` ModuleList, which is how every supported family names its blocks.
    """
    from peft import LoraConfig, inject_adapter_in_model

    layers = cfg.placement(model.n_layers_total)
    parts = LAYER_PARTS[model.family]
    lora_config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
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
        f"LoRA r={cfg.lora_r}, alpha={cfg.lora_alpha} on query and value of layers "
        f"{_span(layers)}, and the classifier",
    )


METHODS: dict[str, Preparer | str] = {
    "full": prepare_full,
    "layers": prepare_layers,
    "heads": prepare_heads,
    "adapter": prepare_adapter,
    "lora": prepare_lora,
    "bitfit": prepare_bitfit,
    "frozen": prepare_frozen,
    "subspace": "analysis.subspace_train:prepare_subspace",
    "subspace-random": "analysis.subspace_train:prepare_subspace_random",
}


def resolve(method: str) -> Preparer:
    """The preparer of ``method``, importing ``"module:function"`` entries on first use."""
    try:
        entry = METHODS[method]
    except KeyError:
        raise ValueError(
            f"Unknown fine-tuning method {method!r}: choose one of {', '.join(METHODS)}."
        ) from None
    if not isinstance(entry, str):
        return entry
    module_name, _, func_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ValueError(
            f"Method {method!r} needs {module_name}, which is not available in this installation."
        ) from None
    return getattr(module, func_name)


def prepare_method(model: EncoderClassifier, cfg: FinetuneConfig) -> Prepared:
    """Run the preparer of ``cfg.method`` on ``model`` (in place) and return what it trains."""
    prepared = resolve(cfg.method)(model, cfg)
    if not isinstance(prepared, Prepared):
        raise TypeError(f"The preparer of {cfg.method!r} returned {type(prepared).__name__}.")
    return prepared


def _n_heads(model: EncoderClassifier) -> int:
    config = model.encoder.config
    return getattr(config, "num_attention_heads", None) or config.n_heads


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
