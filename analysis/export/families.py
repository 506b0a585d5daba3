"""What the export knows per model family (not per method: each method's part of a recipe is its
``MethodSpec.export`` hook, in its own module under ``analysis/finetune/methods/``).

`LORA_TARGETS`: the query and value modules as PEFT's ``target_modules`` match them (the last part
of their name; PEFT has no defaults for DistilBERT and MPNet). `HF_HEADS`: the classification head
of ``AutoModelForSequenceClassification`` (a d × d dense layer and a d × C output, as tunescope's
classifier) with the ``modules_to_save`` that keep it trainable under PEFT.
"""

from __future__ import annotations

from typing import Any

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


def lora_targets(family: str) -> tuple[str, str]:
    """(query, value) of ``family`` for PEFT's ``target_modules``; a ValueError for a family
    without a mapping."""
    if family not in LORA_TARGETS or family not in HF_HEADS:
        raise ValueError(f"no LoRA mapping for the {family} family")
    return LORA_TARGETS[family]
