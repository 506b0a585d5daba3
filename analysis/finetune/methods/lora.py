"""Method ``lora``: LoRA on query and value of the chosen layers (PEFT)."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.config import setting
from analysis.finetune.methods.adapter import placement_label
from analysis.finetune.spec import MethodSpec, is_int, is_number, layer_list, span


@dataclass(frozen=True)
class LoraOptions:
    """Method ``lora``: LoRA on query and value of the chosen layers (PEFT)."""

    layers: tuple[int, ...] | None = setting(
        None, help="layers that get LoRA, e.g. 3,4 (default: ℓ_bottom..ℓ_top, else all)",
        flat="lora_layers", kind="layers",
    )  # fmt: skip
    r: int = setting(8, help="LoRA rank r", flat="lora_r", kind="int")
    alpha: float = setting(
        16, help="LoRA scale numerator: ΔW = (alpha / r) · B A", flat="lora_alpha", kind="float"
    )

    def __post_init__(self) -> None:
        if self.layers is not None:
            object.__setattr__(self, "layers", layer_list(self.layers, "lora_layers"))
        if not is_int(self.r) or self.r < 1:
            raise ValueError(f"lora_r must be a positive whole number (got {self.r!r}).")
        if not is_number(self.alpha) or not self.alpha > 0:
            raise ValueError(f"lora_alpha must be positive (got {self.alpha!r}).")

    def layers_used(self) -> tuple[int, ...]:
        return self.layers or ()


def prepare(model, cfg, inputs):
    """PEFT's LoRA on query and value of the chosen layers, injected in place (no wrapper).

    ΔW = (lora_alpha / r) · B A with B = 0 at the start (so the model starts unchanged), no LoRA
    dropout, no bias training. ``layers_to_transform`` takes 0-based indices under the
    ``layer`` ModuleList, which is how every supported family names its blocks.
    """
    from peft import LoraConfig, inject_adapter_in_model

    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared
    from analysis.models import LAYER_PARTS

    options = cfg.options_for(LoraOptions)
    layers = cfg.placement(model.n_layers_total)
    parts = LAYER_PARTS[model.model_family]
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
            f"(query and value of layers {span(layers)})."
        )
    train_only(model, lora)
    return Prepared.from_model(
        model,
        f"LoRA r={options.r}, alpha={options.alpha} on query and value of layers "
        f"{span(layers)}, and the classifier",
    )


def export(cfg, loaded):
    """PEFT LoRA in the recipe: query and value (the family's names, `LORA_TARGETS`) of the
    chosen layers (0-based ``layers_to_transform``), the classifier in ``modules_to_save``."""
    from analysis.export.families import HF_HEADS, lora_targets

    options = cfg.options_for(LoraOptions)
    targets = lora_targets(loaded.model_family)
    return {
        "lora": {
            "r": options.r,
            "lora_alpha": options.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "target_modules": list(targets),
            "layers_to_transform": [layer - 1 for layer in cfg.placement(loaded.n_layers)],
            "layers_pattern": "layer",
            "modules_to_save": HF_HEADS[loaded.model_family]["modules_to_save"],
            "adapter_config": "adapter_config.json",
        }
    }


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
    run_label=lambda config: placement_label("lora", config),
)
