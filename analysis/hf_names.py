"""What transformers and PEFT call a model family's parts, beside the models' own table of them
(`analysis.models.LAYER_PARTS`): the classifier of ``AutoModelForSequenceClassification`` and the
names PEFT's ``target_modules`` match.

`HF_CLASSIFIERS`: per family, that classifier (a d × d dense layer and a d × C output, as
tunescope's classifier has), the modules holding them, and the ``modules_to_save`` that keep them
trainable under PEFT (PEFT matches those by their last name).
"""

from __future__ import annotations

from typing import Any

from analysis.models import LAYER_PARTS

HF_CLASSIFIERS: dict[str, dict[str, Any]] = {
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


def hf_classifier(family: str) -> dict[str, Any]:
    """``HF_CLASSIFIERS[family]``, or a ValueError for a family without a mapping."""
    if family not in HF_CLASSIFIERS:
        raise ValueError(f"The {family} family has no export mapping yet.")
    return HF_CLASSIFIERS[family]


def target_name(family: str, part: str) -> str:
    """The last name of a layer part (``query`` → ``query``, ``q_lin``, ``q``, ``query_proj``),
    as PEFT's ``target_modules`` match it together with ``layers_to_transform``."""
    return LAYER_PARTS[family][part].rsplit(".", 1)[-1]
