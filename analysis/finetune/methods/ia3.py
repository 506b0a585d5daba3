"""Method ``ia3``: IA³ through PEFT: learned vectors rescale the keys, the values and the
feed-forward activations of the chosen layers (Liu et al. 2022, T-Few); the weights stay frozen.

Per layer, ``key`` and ``value`` outputs are multiplied by a vector of d_model entries, and the
input of the feed-forward output projection (the d_ff activations) by one of d_ff entries; all
start at 1, so the model starts unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.config import setting
from analysis.finetune.spec import (
    Exported,
    MethodSpec,
    layer_list,
    peft_config,
    peft_layer_key,
    placement_label,
    recognise_peft,
    span,
)

PARTS = ("key", "value", "ffn_out")  # the layer parts IA³ rescales (`analysis.models.LAYER_PARTS`)
FEED_FORWARD = (
    "ffn_out"  # rescaled at its input (PEFT's feedforward_modules), the others at their output
)


@dataclass(frozen=True)
class IA3Options:
    """Method ``ia3``: IA³ vectors on key, value and the feed-forward of the chosen layers."""

    layers_to_transform: tuple[int, ...] | None = setting(
        None, help="layers that get IA³ vectors, e.g. 3,4 (default: ℓ_bottom..ℓ_top, else all)",
        flat="ia3_layers", kind="layers",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.layers_to_transform is not None:
            object.__setattr__(
                self, "layers_to_transform", layer_list(self.layers_to_transform, "ia3_layers")
            )


def ia3_config(cfg, family: str, n_layers: int, **fields):
    """The ``peft.IA3Config`` of a run: each chosen layer's key, value and feed-forward output
    projection, named by their suffix under the blocks' ModuleList ``layer`` (PEFT's IA3Config
    has no ``layers_to_transform``; the feed-forward's bare names would also match the attention
    output in BERT-style blocks). ``fields``: more IA3Config fields (the export's)."""
    from analysis.models import LAYER_PARTS

    parts = LAYER_PARTS[family]
    layers = cfg.placement(n_layers)
    return peft_config(
        "IA3Config",
        target_modules=[peft_layer_key(layer, parts[p]) for layer in layers for p in PARTS],
        feedforward_modules=[peft_layer_key(layer, parts[FEED_FORWARD]) for layer in layers],
        **fields,
    )


def prepare(model, cfg, inputs):
    """PEFT's IA³ (`ia3_config`) injected into the encoder in place (no wrapper)."""
    from peft import inject_adapter_in_model

    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared

    layers = cfg.placement(model.n_layers_total)
    inject_adapter_in_model(
        ia3_config(cfg, model.model_family, model.n_layers_total), model.encoder
    )
    vectors = [p for name, p in model.encoder.named_parameters() if ".ia3_l." in name]
    if len(vectors) != len(PARTS) * len(layers):
        raise RuntimeError(
            f"IA³ landed on {len(vectors)} modules, expected {len(PARTS) * len(layers)} (key, "
            f"value and feed-forward of layers {span(layers)})."
        )
    train_only(model, vectors)
    return Prepared.from_model(
        model,
        f"IA³ vectors on key, value and feed-forward of layers {span(layers)}, and the classifier",
    )


def export(cfg, loaded) -> Exported:
    """The run's `ia3_config` for a sequence classifier (the classifier in ``modules_to_save``),
    and its exact trainable count: per layer, d_out of key and value plus d_in of the
    feed-forward output projection."""
    from analysis.hf_names import hf_classifier
    from analysis.models import encoder_layers, layer_modules

    family = loaded.model_family
    config = ia3_config(
        cfg, family, loaded.n_layers, task_type="SEQ_CLS",
        modules_to_save=hf_classifier(family)["modules_to_save"],
    )  # fmt: skip
    blocks = encoder_layers(loaded.model)
    layers = cfg.placement(loaded.n_layers)
    n_trainable = 0
    for layer in layers:
        modules = layer_modules(blocks[layer - 1], family)
        n_trainable += modules["key"].out_features + modules["value"].out_features
        n_trainable += modules[FEED_FORWARD].in_features
    return Exported(peft=config, layers=layers, n_trainable=n_trainable)


SPEC = MethodSpec(
    name="ia3",
    label="IA³ (PEFT): vectors rescale keys, values and feed-forward activations of chosen layers",
    colour="#e7ba52",
    default_lr=3e-3,  # T-Few trains IA³ at 3e-3; vectors that start at 1
    prepare=prepare,
    options=IA3Options,
    order=55,
    sweep=6,
    export=export,
    recognise=recognise_peft("IA3"),
    run_label=placement_label("ia3"),
    title="IA³",
)
