"""Method ``lora-eva``: LoRA on query and value, initialised and its ranks allocated by PEFT's EVA
(explained variance adaptation: ``LoraConfig(init_lora_weights="eva")`` and
``initialize_lora_eva_weights``).

EVA runs a few training batches through the encoder, takes an incremental SVD of every target
module's input activations, starts each A with the top right-singular vectors and hands the
total rank r · (number of modules) out by explained variance: a module gets at most rho · r and
may get none. Total rank and trainable count match uniform LoRA of rank r; only where the rank
goes differs. The recommendation's alternative to its own allocation
(docs/explanation/recommendation.md, "The LoRA allocation, and EVA's").

The batches: ``batches`` × ``batch_size`` train examples drawn from the run's method stream
(`analysis.seeding`), padded per batch, padding left out of the SVD (PEFT's attention-mask rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis.config import setting
from analysis.finetune.spec import (
    MethodSpec,
    at_classifier_layer,
    is_int,
    is_number,
    layer_list,
    peft_config,
    refuse_export,
    span,
)

PARTS = ("query", "value")  # as method lora (`analysis.finetune.methods.lora.PARTS`)


@dataclass(frozen=True)
class EvaOptions:
    """Method ``lora-eva``: LoRA whose ranks and start PEFT's EVA takes from activations."""

    layers_to_transform: tuple[int, ...] | None = setting(
        None, help="layers whose query and value get LoRA (default: ℓ_bottom..ℓ_top, else all)",
        flat="eva_layers", kind="layers",
    )  # fmt: skip
    r: int = setting(
        8, help="LoRA rank before EVA redistributes the total r · modules", flat="eva_r",
        kind="int",
    )  # fmt: skip
    alpha: float = setting(
        16, help="LoRA scale numerator at rank r", flat="eva_alpha", kind="float"
    )
    rho: float = setting(
        2.0, help="a module gets at most rho · r of the total rank (PEFT EvaConfig.rho, ≥ 1)",
        flat="eva_rho", kind="float",
    )  # fmt: skip
    batches: int = setting(
        8, help="training batches whose activations EVA's SVD reads", flat="eva_batches",
        kind="int",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.layers_to_transform is not None:
            object.__setattr__(
                self, "layers_to_transform", layer_list(self.layers_to_transform, "eva_layers")
            )
        if not is_int(self.r) or self.r < 1:
            raise ValueError(f"eva_r must be a positive whole number (got {self.r!r}).")
        if not is_number(self.alpha) or not self.alpha > 0:
            raise ValueError(f"eva_alpha must be positive (got {self.alpha!r}).")
        if not is_number(self.rho) or not self.rho >= 1:
            raise ValueError(f"eva_rho must be at least 1 (got {self.rho!r}).")
        if not is_int(self.batches) or self.batches < 1:
            raise ValueError(f"eva_batches must be a positive whole number (got {self.batches!r}).")


def eva_batches(cfg, device) -> list[dict]:
    """``batches`` batches of ``batch_size`` train examples, drawn from the method stream of the
    run's seed, tokenized as the run tokenizes (truncated at ``max_length``, each batch padded to
    its longest)."""
    import numpy as np
    from transformers import AutoTokenizer

    from analysis.data import load_data
    from analysis.extract import pad_id_of, texts_of, tokenize
    from analysis.models import resolve_source
    from analysis.seeding import Stream

    options = cfg.options_for(EvaOptions)
    source, _ = resolve_source(cfg.model.name)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=cfg.model.trust_remote_code)
    train = load_data(cfg.data).parts["train"]
    n = min(len(train), options.batches * cfg.batch_size)
    rows = Stream(cfg.seed, "method").numpy().choice(len(train), size=n, replace=False)
    tokens = tokenize(tokenizer, *texts_of(train.iloc[np.sort(rows)]), cfg.max_length)
    pad = pad_id_of(tokenizer)
    out = []
    for start in range(0, n, cfg.batch_size):
        batch = tokens.pad(range(start, min(start + cfg.batch_size, n)), pad)
        out.append({k: v.to(device) for k, v in batch.items()})
    return out


def prepare(model, cfg, inputs):
    """LoRA with EVA's start and ranks on query and value of the placement's layers."""
    from peft import get_peft_model
    from peft.tuners.lora.config import EvaConfig
    from peft.tuners.lora.eva import initialize_lora_eva_weights

    from analysis.extract import model_inputs
    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared
    from analysis.hf_names import target_name

    options = cfg.options_for(EvaOptions)
    layers = cfg.placement(model.n_layers_total)
    config = peft_config(
        "LoraConfig",
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=0.0,
        bias="none",
        target_modules=[target_name(model.model_family, part) for part in PARTS],
        layers_to_transform=[layer - 1 for layer in layers],
        layers_pattern="layer",
        init_lora_weights="eva",
        eva_config=EvaConfig(rho=float(options.rho)),
    )
    encoder = model.encoder
    device = next(encoder.parameters()).device
    # EVA needs PEFT's model wrapper (its hooks and rank bookkeeping); the wrapper injects into
    # the encoder in place and is dropped afterwards, as method lora's in-place injection.
    wrapped = get_peft_model(encoder, config, low_cpu_mem_usage=True)  # EVA makes the weights

    def forward(_, batch):
        return encoder(**model_inputs(encoder, batch))

    initialize_lora_eva_weights(
        wrapped, eva_batches(cfg, device), forward_fn=forward, show_progress_bar=False
    )
    ranks = eva_ranks(encoder, model.model_family)
    lora = [p for name, p in encoder.named_parameters() if ".lora_" in name]
    train_only(model, lora)
    chosen = ",".join(f"{layer}:{rank}" for layer, rank in sorted(ranks.items()))
    prepared = Prepared.from_model(
        model,
        f"LoRA with EVA (r = {options.r} before redistribution, rho {options.rho:g}) on query "
        f"and value of layers {span(layers)}; ranks by layer (query + value) {chosen}; and the "
        "classifier",
    )
    prepared.trained_layers = tuple(sorted(layer for layer, rank in ranks.items() if rank))
    return prepared


def eva_ranks(encoder, family: str) -> dict[int, int]:
    """Layer (1-based) → the LoRA rank EVA gave its query plus its value (0: none)."""
    from analysis.models import encoder_layers, layer_modules

    out = {}
    for index, block in enumerate(encoder_layers(encoder)):
        parts = layer_modules(block, family)
        total = 0
        for name in PARTS:
            lora_a = getattr(parts[name], "lora_A", None)
            if lora_a is not None and "default" in lora_a:
                total += lora_a["default"].weight.shape[0]
        out[index + 1] = total
    return out


def run_label(config: Mapping[str, Any]) -> str:
    """``lora-eva r=8``, ``lora-eva r=8 3,4`` (explicit layers), from the stored options."""
    options = config.get("options") or {}
    layers = options.get("layers_to_transform")
    where = " " + ",".join(str(x) for x in layers) if layers else ""
    return f"lora-eva r={options.get('r')}{where}" + at_classifier_layer(config)


SPEC = MethodSpec(
    name="lora-eva",
    label="LoRA on query and value, started and its ranks allocated by PEFT's EVA (explained "
    "variance of a few training batches' activations)",
    colour="#f7b6d2",
    default_lr=5e-4,  # as method lora
    prepare=prepare,
    options=EvaOptions,
    order=55,
    run_label=run_label,
    # EVA's start (each A, and where the rank goes) is computed from the run's own training
    # batches: data-dependent weights, which a recipe of settings cannot hold, and a LoraConfig
    # with init_lora_weights="eva" applied without that step would silently train plain LoRA.
    export=refuse_export(
        "EVA's start is data-dependent: each LoRA A and the rank of every module come from an "
        "SVD of the training batches' activations, which a recipe (settings, no weights) cannot "
        "hold; in your own pipeline use PEFT's LoraConfig(init_lora_weights='eva', "
        "eva_config=EvaConfig(rho=...)) and run initialize_lora_eva_weights on your dataloader "
        "before training"
    ),
)
