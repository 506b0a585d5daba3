"""What each fine-tuning method adds to a recipe, beside what `analysis.export.build` reads off
the prepared model (which tensors have ``requires_grad``, which rows the gradient masks keep).

``FRAGMENTS[method](cfg, model) -> dict`` returns the method's part of ``recipe["train"]``:
the adapters to insert (``adapter``), the PEFT LoRA settings (``lora``), or nothing. A method in
``REFUSED`` cannot be expressed in a plain transformers / PEFT pipeline, and says why. Each
function is small and keyed by its method's name, so it can move into that method's module.

Per family (`LORA_TARGETS`, `HF_HEADS`): the modules PEFT's ``target_modules`` name (query and
value), and the classification head of ``AutoModelForSequenceClassification`` (a d × d dense
layer and a d × C output, as tunescope's classifier) with the ``modules_to_save`` that keep it
trainable under PEFT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from analysis.finetune.adapters import ADAPTER_SITES
from analysis.finetune.config import AdapterOptions, FinetuneConfig, LoraOptions
from analysis.finetune.model import EncoderClassifier
from analysis.models import LAYER_PARTS

# family -> (query, value) module names as PEFT's ``target_modules`` match them (the last part).
LORA_TARGETS: dict[str, tuple[str, str]] = {
    family: (parts["query"].rsplit(".", 1)[-1], parts["value"].rsplit(".", 1)[-1])
    for family, parts in LAYER_PARTS.items()
}
# family -> the AutoModelForSequenceClassification head: dense (d → d), out (d → C), the modules
# that hold them (PEFT ``modules_to_save`` match these by their last name).
HF_HEADS: dict[str, dict[str, Any]] = {
    "bert": {"dense": "bert.pooler.dense", "out": "classifier",
             "modules": ["bert.pooler", "classifier"], "modules_to_save": ["pooler", "classifier"]},
    "roberta": {"dense": "classifier.dense", "out": "classifier.out_proj",
                "modules": ["classifier"], "modules_to_save": ["classifier"]},
    "xlm-roberta": {"dense": "classifier.dense", "out": "classifier.out_proj",
                    "modules": ["classifier"], "modules_to_save": ["classifier"]},
    "electra": {"dense": "classifier.dense", "out": "classifier.out_proj",
                "modules": ["classifier"], "modules_to_save": ["classifier"]},
    "mpnet": {"dense": "classifier.dense", "out": "classifier.out_proj",
              "modules": ["classifier"], "modules_to_save": ["classifier"]},
    "distilbert": {"dense": "pre_classifier", "out": "classifier",
                   "modules": ["pre_classifier", "classifier"],
                   "modules_to_save": ["pre_classifier", "classifier"]},
    "deberta-v2": {"dense": "pooler.dense", "out": "classifier",
                   "modules": ["pooler", "classifier"], "modules_to_save": ["pooler", "classifier"]},
}  # fmt: skip

REFUSED: dict[str, str] = {
    "subspace": "subspace training moves each layer inside a basis read from a tunescope "
    "trajectory (a re-parameterisation with its own forward pass): no transformers or PEFT "
    "setting expresses it",
    "subspace-random": "random-subspace training re-parameterises each layer (a fixed random "
    "basis and its own forward pass): no transformers or PEFT setting expresses it",
}

Fragment = Callable[[FinetuneConfig, EncoderClassifier], dict[str, Any]]


def no_fragment(cfg: FinetuneConfig, model: EncoderClassifier) -> dict[str, Any]:
    return {}


def adapter_fragment(cfg: FinetuneConfig, model: EncoderClassifier) -> dict[str, Any]:
    """Houlsby adapters: where they go (0-based layers, the hooked projections), their size."""
    options = cfg.options_for(AdapterOptions)
    parts = LAYER_PARTS[model.family]
    return {
        "adapters": {
            "kind": "houlsby",
            "size": options.size,
            "init_std": 1e-2,
            "layers": [layer - 1 for layer in cfg.placement(model.n_layers_total)],
            "sites": {name: parts[site] for site, name in ADAPTER_SITES},
        }
    }


def lora_fragment(cfg: FinetuneConfig, model: EncoderClassifier) -> dict[str, Any]:
    """PEFT LoRA on query and value of the chosen layers (0-based ``layers_to_transform``)."""
    options = cfg.options_for(LoraOptions)
    if model.family not in LORA_TARGETS or model.family not in HF_HEADS:
        raise ValueError(f"No LoRA mapping for the {model.family} family.")
    return {
        "lora": {
            "r": options.r,
            "lora_alpha": options.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "target_modules": list(LORA_TARGETS[model.family]),
            "layers_to_transform": [layer - 1 for layer in cfg.placement(model.n_layers_total)],
            "layers_pattern": "layer",
            "modules_to_save": HF_HEADS[model.family]["modules_to_save"],
            "adapter_config": "adapter_config.json",
        }
    }


FRAGMENTS: dict[str, Fragment] = {
    "full": no_fragment,
    "layers": no_fragment,
    "heads": no_fragment,  # the masks are read off the prepared model
    "bitfit": no_fragment,
    "frozen": no_fragment,
    "adapter": adapter_fragment,
    "lora": lora_fragment,
}


def method_fragment(cfg: FinetuneConfig, model: EncoderClassifier) -> dict[str, Any]:
    """The method's part of the recipe, or a ValueError saying why it cannot be exported."""
    if cfg.method in REFUSED:
        raise ValueError(f"Method {cfg.method!r} cannot be exported: {REFUSED[cfg.method]}.")
    if cfg.method not in FRAGMENTS:
        raise ValueError(f"Method {cfg.method!r} has no export.")
    return FRAGMENTS[cfg.method](cfg, model)
