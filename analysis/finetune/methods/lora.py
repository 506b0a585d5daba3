"""Method ``lora``: LoRA on query and value of the chosen layers (PEFT), optionally with a rank
and an alpha per layer."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.config import setting
from analysis.finetune.spec import (
    Exported,
    MethodSpec,
    is_int,
    is_number,
    layer_list,
    layer_values,
    peft_config,
    peft_layer_key,
    placement_label,
    recognise_peft,
    span,
)

PARTS = ("query", "value")  # the layer parts LoRA adapts (`analysis.models.LAYER_PARTS`)


@dataclass(frozen=True)
class LoraOptions:
    """Method ``lora``: ΔW = (alpha / r) · B A on query and value of the chosen layers.

    ranks / alphas: a rank and an alpha per layer (1-based layer → value), for the layers they
    name; the other LoRA layers take ``r`` / ``alpha``. A rank allocation places LoRA: without
    ``layers_to_transform``, the layers of ``ranks`` get LoRA; with it, ``ranks`` names some of
    them. An alpha allocation needs the layers named (``layers_to_transform`` or ``ranks``).
    """

    layers_to_transform: tuple[int, ...] | None = setting(
        None, help="layers that get LoRA, e.g. 3,4 (default: ℓ_bottom..ℓ_top, else all)",
        flat="lora_layers", kind="layers",
    )  # fmt: skip
    r: int = setting(8, help="LoRA rank r", flat="lora_r", kind="int")
    alpha: float = setting(
        16, help="LoRA scale numerator: ΔW = (alpha / r) · B A", flat="lora_alpha", kind="float"
    )
    ranks: tuple[tuple[int, int], ...] | None = setting(
        None, help="a rank per layer, e.g. 3:16,4:4 (these layers get LoRA at these ranks; with "
        "lora_layers, the others take lora_r)", flat="lora_ranks", kind="per_layer",
    )  # fmt: skip
    alphas: tuple[tuple[int, float], ...] | None = setting(
        None, help="an alpha per layer, e.g. 3:32 (the other LoRA layers take lora_alpha)",
        flat="lora_alphas", kind="per_layer",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.layers_to_transform is not None:
            object.__setattr__(
                self, "layers_to_transform", layer_list(self.layers_to_transform, "lora_layers")
            )
        if not is_int(self.r) or self.r < 1:
            raise ValueError(f"lora_r must be a positive whole number (got {self.r!r}).")
        if not is_number(self.alpha) or not self.alpha > 0:
            raise ValueError(f"lora_alpha must be positive (got {self.alpha!r}).")
        if self.ranks is not None:
            ranks = layer_values(self.ranks, "lora_ranks", whole=True)
            object.__setattr__(self, "ranks", ranks)
            if self.layers_to_transform is None:
                object.__setattr__(self, "layers_to_transform", tuple(layer for layer, _ in ranks))
        if self.alphas is not None:
            object.__setattr__(self, "alphas", layer_values(self.alphas, "lora_alphas", False))
            if self.layers_to_transform is None:
                raise ValueError(
                    "lora_alphas needs the layers that get LoRA named (lora_layers or lora_ranks)."
                )
        for name in ("ranks", "alphas") if self.layers_to_transform is not None else ():
            outside = sorted(
                {layer for layer, _ in getattr(self, name) or ()} - set(self.layers_to_transform)
            )
            if outside:
                raise ValueError(
                    f"lora_{name} names layer {outside[0]}, which gets no LoRA (lora_layers "
                    f"{span(self.layers_to_transform)})."
                )

    def rank(self, layer: int) -> int:
        return dict(self.ranks or ()).get(layer, self.r)


def lora_config(cfg, family: str, n_layers: int, **fields):
    """The ``peft.LoraConfig`` of a run: query and value (their last names, with 0-based
    ``layers_to_transform`` under the blocks' ModuleList ``layer``), per-layer ranks and alphas
    as ``rank_pattern`` / ``alpha_pattern`` (keyed by each module's name suffix), B = 0 at the
    start (so the model starts unchanged), no dropout, no bias training. ``fields``: more
    LoraConfig fields (the export's task type and classifier)."""
    from analysis.hf_names import target_name
    from analysis.models import LAYER_PARTS

    options = cfg.options_for(LoraOptions)
    parts = LAYER_PARTS[family]

    def pattern(values):
        return {peft_layer_key(layer, parts[p]): v for layer, v in values or () for p in PARTS}

    return peft_config(
        "LoraConfig",
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=0.0,
        bias="none",
        target_modules=[target_name(family, part) for part in PARTS],
        layers_to_transform=[layer - 1 for layer in cfg.placement(n_layers)],
        layers_pattern="layer",
        rank_pattern=pattern(options.ranks),
        alpha_pattern=pattern(options.alphas),
        **fields,
    )


def prepare(model, cfg, inputs):
    """PEFT's LoRA (`lora_config`) injected into the encoder in place (no wrapper)."""
    from peft import inject_adapter_in_model

    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared

    options = cfg.options_for(LoraOptions)
    layers = cfg.placement(model.n_layers_total)
    inject_adapter_in_model(
        lora_config(cfg, model.model_family, model.n_layers_total), model.encoder
    )
    lora = [p for name, p in model.encoder.named_parameters() if ".lora_" in name]
    n_expected = 2 * len(PARTS) * len(layers)  # A and B of each part
    if len(lora) != n_expected:
        raise RuntimeError(
            f"LoRA landed on {len(lora) // 2} modules, expected {n_expected // 2} "
            f"(query and value of layers {span(layers)})."
        )
    train_only(model, lora)
    given = options.ranks
    ranks = "ranks " + ", ".join(f"{x}:{r}" for x, r in given) if given else f"r={options.r}"
    return Prepared.from_model(
        model,
        f"LoRA {ranks}, alpha={options.alpha} on query and value of layers {span(layers)}, "
        "and the classifier",
    )


def export(cfg, loaded) -> Exported:
    """The run's `lora_config` for a sequence classifier (the classifier in
    ``modules_to_save``), and its exact trainable count: Σ over LoRA layers and parts of
    r_layer · (d_in + d_out)."""
    from analysis.hf_names import hf_classifier
    from analysis.models import encoder_layers, layer_modules

    options = cfg.options_for(LoraOptions)
    family = loaded.model_family
    config = lora_config(
        cfg, family, loaded.n_layers, task_type="SEQ_CLS",
        modules_to_save=hf_classifier(family)["modules_to_save"],
    )  # fmt: skip
    blocks = encoder_layers(loaded.model)
    layers = cfg.placement(loaded.n_layers)
    n_trainable = 0
    for layer in layers:
        modules = layer_modules(blocks[layer - 1], family)
        for part in PARTS:
            linear = modules[part]
            n_trainable += options.rank(layer) * (linear.in_features + linear.out_features)
    return Exported(peft=config, layers=layers, n_trainable=n_trainable)


SPEC = MethodSpec(
    name="lora",
    label="LoRA on query and value (PEFT), optionally in chosen layers only",
    colour="#e377c2",
    default_lr=5e-4,  # LoRA / HiFi tables use 1e-4 .. 5e-4
    prepare=prepare,
    options=LoraOptions,
    order=50,
    sweep=1,
    export=export,
    recognise=recognise_peft("LORA"),
    run_label=placement_label("lora"),
    title="LoRA",
)
