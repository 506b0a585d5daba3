"""Round trip on all six tiny families: a recipe exported from a tunescope config, applied to a
fresh transformers ``AutoModelForSequenceClassification`` (or wrapped by PEFT with the exported
adapter_config.json: LoRA, IA³), trains exactly the parameters the tunescope run trains — the same names
(tunescope's mapped to transformers'), the same count — and two ``Trainer`` steps change exactly
those entries (every frozen entry, and the unselected head rows, stay bit-identical)."""

from __future__ import annotations

import ast
import json
import sys

import pytest
import torch
import transformers as tf
from exported import import_recipe_module
from tiny import make_tiny_model_dir

from analysis.config import ModelSpec
from analysis.export.build import build_recipe, write_recipe
from analysis.finetune.config import flat_config
from analysis.finetune.engine import build_model
from analysis.hf_names import HF_CLASSIFIERS, target_name
from analysis.models import load_model

FAMILIES = ("bert", "roberta", "distilbert", "mpnet", "electra", "deberta-v2")
CASES = {
    "heads": dict(method="heads", heads={"1": [0, 2], "3": [1]}),
    "layers": dict(method="layers", layers=(2, 2, 3)),  # cut at ℓ_cls = 3 of 4
    "lora": dict(method="lora", lora_layers=[2, 3], layers=(2, 3, 3)),
    "lora-ranks": dict(method="lora", lora_ranks={2: 2, 4: 6}, lora_alphas={4: 3.0}),
    "ia3": dict(method="ia3", ia3_layers=[2, 4]),
    "adapter": dict(method="adapter", adapter_layers=[1, 4]),
    "bitfit": dict(method="bitfit"),
}
WORDS = ["good", "great", "fun", "bad", "awful", "dull", "movie", "plot", "the", "a"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory):
    folder = make_tiny_model_dir(request.param, tmp_path_factory.mktemp("export"), n_layers=4)
    return request.param, folder, load_model(ModelSpec(str(folder)), device="cpu")


def tunescope_trainable(cfg, loaded, family: str, prefix: str) -> dict[str, int]:
    """{transformers name: entries that train} of the model a tunescope run of ``cfg`` trains."""
    built = build_model(cfg, loaded, n_outputs=2, device="cpu")
    masks = {id(p): m for p, m in built.prepared.grad_masks.items()}
    hf_classifier = HF_CLASSIFIERS[family]
    out = {}
    for name, param in built.model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("classifier."):
            part, leaf = name.split(".")[1:]
            hf = f"{hf_classifier['dense' if part == 'dense' else 'out']}.{leaf}"
        else:
            hf = f"{prefix}.{name.removeprefix('encoder.')}"
        out[hf] = int(masks[id(param)].sum()) if id(param) in masks else param.numel()
    assert sum(out.values()) == built.n_trainable
    return out


def hf_name(name: str) -> str:
    """A PEFT-wrapped name as the plain model names it."""
    return name.removeprefix("base_model.model.").replace(".modules_to_save.default", "")


def batch_dataset(tokenizer, n: int = 8):
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        label = i % 2
        picks = torch.randint(0, 3, (4,), generator=generator).tolist()
        text = " ".join(WORDS[3 * label + j] for j in picks) + " movie"
        rows.append({**tokenizer(text, truncation=True, max_length=16), "labels": label})
    return rows


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip(family_model, case, tmp_path):
    family, folder, loaded = family_model
    cfg = flat_config(model={"name": str(folder)}, lr=1e-2, weight_decay=0.1, **CASES[case])
    recipe = build_recipe(cfg, loaded, n_outputs=2)
    write_recipe(recipe, tmp_path / "recipe")
    tr = import_recipe_module(tmp_path / "recipe")
    recipe = tr.load_recipe(tmp_path / "recipe")

    torch.manual_seed(1)
    model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    prefix = model.base_model_prefix
    if recipe["train"]["peft"]:
        from peft import PeftConfig, get_peft_model

        config = json.loads((tmp_path / "recipe" / "adapter_config.json").read_text())
        if case == "lora":
            assert config["layers_to_transform"] == [1, 2]  # 0-based
            assert config["layers_pattern"] == "layer"
            assert sorted(config["target_modules"]) == sorted(
                target_name(family, part) for part in ("query", "value")
            )
        if case == "ia3":
            assert config["peft_type"] == "IA3" and recipe["train"]["peft"]["layers"] == [2, 4]
            assert len(config["target_modules"]) == 6 and len(config["feedforward_modules"]) == 2
        model = get_peft_model(model, PeftConfig.from_pretrained(str(tmp_path / "recipe")))
    optimizer, scheduler = tr.make_optimizer(model, recipe, steps=2)

    expected = tunescope_trainable(cfg, loaded, family, prefix)
    masked = {f"{prefix}.{m['param']}": m["rows"] for m in recipe["train"]["masks"]}
    got = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            key = hf_name(name)
            rows = masked.get(key)
            got[key] = param.numel() if rows is None else _entries(param, rows)
    assert got == expected
    assert sum(got.values()) == recipe["train"]["n_trainable"]
    if case == "layers":
        assert len(model.base_model.get_submodule(recipe["layers_module"])) == 3

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = tf.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True, max_grad_norm=1.0,
    )  # fmt: skip
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=batch_dataset(loaded.tokenizer),
        data_collator=tf.DataCollatorWithPadding(loaded.tokenizer),
        optimizers=(optimizer, scheduler),
    )
    trainer.train()
    for name, param in model.named_parameters():
        old, new = before[name], param.detach()
        key = hf_name(name)
        if key not in expected:
            assert torch.equal(old, new), f"frozen {name} changed"
            continue
        changed = old != new
        assert changed.any(), f"trainable {name} did not change"
        if key in masked:
            keep = tr._row_mask(param, masked[key])
            assert not changed[~keep].any(), f"unselected rows of {name} changed"


def _entries(param: torch.Tensor, rows: list[list[int]]) -> int:
    width = param.shape[1] if param.ndim == 2 else 1
    return sum(stop - start for start, stop in rows) * width


def test_recipe_module_imports_torch_and_transformers_only(tmp_path, family_model):
    _family, folder, loaded = family_model
    recipe = build_recipe(flat_config(model={"name": str(folder)}, method="frozen"), loaded, 2)
    write_recipe(recipe, tmp_path / "r")
    tree = ast.parse((tmp_path / "r" / "tunescope_recipe.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - sys.stdlib_module_names <= {"torch", "transformers", "numpy"}


def test_counts_of_every_method(family_model):
    """full, frozen and (1, L, L) on the HF model: everything / only the classifier / everything."""
    _family, folder, loaded = family_model
    n_all = None
    for method, kw in (("full", {}), ("frozen", {}), ("layers", {"layers": (1, 4, 4)})):
        cfg = flat_config(model={"name": str(folder)}, method=method, **kw)
        recipe = build_recipe(cfg, loaded, n_outputs=3)
        import analysis.export.tunescope_recipe as tr

        model = tf.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=3)
        tr.apply_recipe(model, recipe)
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert n == recipe["train"]["n_trainable"]
        n_all = n_all or sum(p.numel() for p in model.parameters())
        if method != "frozen":
            assert n == n_all
        else:
            assert n == recipe["train"]["n_trainable_classifier"]
