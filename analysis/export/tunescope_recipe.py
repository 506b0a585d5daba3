"""Apply a tunescope recipe in your own training and record the run: torch and transformers only
(peft too for a PEFT recipe); nothing of tunescope is imported, so none need be installed.

tunescope copies this file into every exported recipe folder. In your training script::

    sys.path.insert(0, "my-recipe")                     # the folder holding this file
    from tunescope_recipe import TunescopeCallback, load_recipe, make_optimizer, model_source

    recipe = load_recipe("my-recipe")
    model = AutoModelForSequenceClassification.from_pretrained(model_source(recipe), num_labels=2)
    trainer = Trainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,
                      optimizers=make_optimizer(model, recipe),
                      callbacks=[TunescopeCallback(recipe=recipe, test_dataset=test)])
    trainer.train()          # the run folder: OUTPUT_DIR/tunescope-runs/<id>/

and ``tunescope runs import OUTPUT_DIR`` (or the Runs page) brings the run into tunescope.

The model. `model_source` says where the recipe's model is here: a folder you name, the local
folder it was exported from, its model hub id, or — for tunescope's built-ins — their installed
copy, else their hub id. `apply_recipe` first checks the model against the recipe: family, layer
count, width, number of labels and a fingerprint of the weights (the embeddings and the kept
layers); a mismatch is one `RecipeError` naming both sides.

`apply_recipe(model, recipe)` then does the work and returns AdamW parameter groups:

1. truncate: the layers above the classifier's layer ℓ_cls are deleted (``num_hidden_layers`` /
   ``n_layers`` updated);
2. insert the modules the recipe adds (``train.adapters``: Houlsby adapters);
3. freeze everything (``requires_grad_(False)``), then unfreeze exactly the recipe's tensors and
   the classifier; a name that matches nothing, or a trainable count that differs from the
   recipe's, is an error (never a silent no-op);
4. partly trained tensors (``train.masks``: the Q/K/V rows of chosen heads): a gradient hook
   zeroes every other row's gradient as it is computed, so before any clipping; those tensors go
   into the weight-decay-0 group, so AdamW leaves their frozen entries bit-identical (zero
   gradient → zero moments → zero update). The tensor keeps its mask (``tunescope_mask``), so
   `count_trainable` counts the rows that train.

PEFT recipes (``train.peft``: LoRA, IA³…): wrap the model with PEFT first (``get_peft_model(model,
PeftConfig.from_pretrained("recipe/"))``, the folder's adapter_config.json); `apply_recipe` then
only truncates, checks what PEFT made trainable and returns the groups.

`make_optimizer` is AdamW over those groups with tunescope's schedule (`RecipeSchedule`: linear
warm-up, then linear decay to zero). `TunescopeCallback` fits the schedule to the number of steps
the Trainer really runs; without it the schedule spans the recipe's steps (or ``steps=``), and a
Trainer that runs past them is stopped with a `RecipeError` rather than trained with a negative
rate.

`TunescopeCallback` writes a self-contained run folder (`RunFolder`): what actually ran (model
class and classifier, pooling, evaluation schedule, precision, steps, learning rates, what
trains), every logged loss and evaluation, the test set's predictions and the timings. Its test
set may be a ``datasets.Dataset``, a list of dicts or any tokenized dataset, raw (a text column
and a label) or tokenized (``input_ids`` and a label); it is checked before training begins.

Layers are 1-based in recipe.json (version 3; versions 1 and 2 are read too).

The classifier. tunescope trains a fresh classifier on the pooled states of the classifier's layer:
dropout → dense (d → d) → tanh → dropout → linear (d → C), pooled as the mean of the real,
non-special tokens (or the first token). `TunescopeClassifier` is exactly that model (same
initialisation at the same seed), so a run reproduces tunescope's numbers. A transformers
``AutoModelForSequenceClassification`` has its own classifier of the same size (a d × d dense layer
and a d × C output in all six families), so the same parameters train and the same count, but it
pools the first token and its activation and dropout differ per family (BERT's pooler has no dropout
before it, DistilBERT uses ReLU, ELECTRA and DeBERTa GELU): expect similar, not identical, scores. A
run records which of the two it trained.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import inspect
import json
import math
import secrets
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

FORMAT = "tunescope-recipe"
FORMAT_VERSION = 3
RUN_FORMAT = "tunescope-run"
RUN_FORMAT_VERSION = 1
RUNS_FOLDER = "tunescope-runs"  # the callback's run folders, inside the Trainer's output_dir
TOKEN_COLUMNS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")


class RecipeError(ValueError):
    """A recipe that does not fit the model it is applied to, or cannot be applied here."""


class CallbackError(ValueError):
    """`TunescopeCallback` cannot record this run: a test set it cannot use, a folder it cannot
    write, or settings that contradict each other."""


def load_recipe(path: str | Path) -> dict[str, Any]:
    """The recipe in ``path`` (a recipe.json or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "recipe.json"
    recipe = json.loads(path.read_text(encoding="utf-8"))
    if recipe.get("format") != FORMAT:
        raise RecipeError(f"{path} is not a tunescope recipe (format {recipe.get('format')!r}).")
    if int(recipe.get("version", 0)) > FORMAT_VERSION:
        raise RecipeError(f"{path} is recipe version {recipe['version']}; update this module.")
    recipe["_folder"] = str(path.parent)
    return _upgrade(recipe)


def _upgrade(recipe: dict[str, Any]) -> dict[str, Any]:
    """An older recipe in version 3's terms. Version 1 had 0-based adapter layers and its PEFT
    settings under ``lora``; version 2 named its model by a path (any model, built-ins too) or,
    without one, by a hub id."""
    version = int(recipe.get("version", 1))
    train = recipe["train"]
    if version < 2 and train.get("adapters"):
        train["adapters"] = {
            **train["adapters"],
            "layers": [i + 1 for i in train["adapters"]["layers"]],
        }
    lora = train.pop("lora", None)
    if lora:
        train["peft"] = {"peft_type": "LORA", "adapter_config": lora["adapter_config"],
                         "layers": [i + 1 for i in lora["layers_to_transform"]]}  # fmt: skip
    if version < 3:
        model = recipe["model"]
        model.setdefault("source", "local" if model.get("path") else "hub")
        model.setdefault("hub_id", None if model.get("path") else model["name"])
    recipe["version"] = FORMAT_VERSION
    return recipe


# -- the model -------------------------------------------------------------------------------------


def model_source(recipe: dict[str, Any], path: str | Path | None = None) -> str:
    """Where to load the recipe's model from on this machine: ``path`` when given; else the
    folder a local model was exported from (as it was given then), a hub model's id, a
    built-in's installed copy (tunescope's packages in this environment) or else its hub id. A
    `RecipeError` when none of these is here: never a built-in's short name, which no hub knows."""
    if path is not None:
        return str(path)
    model = recipe["model"]
    if model.get("source") == "local":
        folder = Path(model["path"]).expanduser()
        if not (folder / "config.json").is_file():
            raise RecipeError(
                f"This recipe's model is the folder {model['path']}, which is not on this machine: "
                "pass the folder that holds it (model_source(recipe, path=…))."
            )
        return str(folder)
    if model.get("source") == "builtin":
        folder = _installed(model.get("installed") or {})
        if folder is not None:
            return str(folder)
    if model.get("hub_id"):
        return str(model["hub_id"])
    raise RecipeError(
        f"This recipe's model is tunescope's built-in {model['name']!r}, which is not installed "
        "here and has no hub id: pass its folder (model_source(recipe, path=…))."
    )


def _installed(place: dict[str, str]) -> Path | None:
    """A built-in's folder in this environment: inside an installed package (``package``,
    ``folder``) or under the environment's prefix (``prefix``); None when it is not there."""
    if place.get("package"):
        spec = importlib.util.find_spec(place["package"])
        locations = list(spec.submodule_search_locations or ()) if spec else []
        folder = Path(locations[0]) / place.get("folder", "") if locations else None
    elif place.get("prefix"):
        folder = Path(sys.prefix) / place["prefix"]
    else:
        folder = None
    return folder if folder is not None and (folder / "config.json").is_file() else None


# tunescope's random streams of a training seed s: np.random.SeedSequence((s, purpose, *keys)),
# one per purpose, so a run's batches, classifier and dropout never depend on what else it drew.
STREAMS = {"batch_order": 2, "classifier": 3, "method": 4, "dropout": 5}
GLOBALS_KEY = 2**32  # the sub-stream that seeds the global generators


def stream_seed(seed: int, purpose: str, *keys: int) -> int:
    """The 64-bit torch seed of tunescope's stream ``purpose`` of training seed ``seed``."""
    import numpy as np

    sequence = np.random.SeedSequence((int(seed), STREAMS[purpose], *keys))
    return int(sequence.generate_state(1, np.uint64)[0])


class Classifier(nn.Module):
    """dropout → dense → tanh → dropout → linear (tunescope's fresh classifier); weights drawn
    from ``generator`` (torch's global generator when None)."""

    def __init__(
        self,
        d_model: int,
        n_outputs: int,
        dropout: float,
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, n_outputs)
        for linear in (self.dense, self.out):
            nn.init.normal_(linear.weight, std=init_std, generator=generator)
            nn.init.zeros_(linear.bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # (B, d) -> (B, C)
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(pooled)))))


class TunescopeClassifier(nn.Module):
    """An encoder (``transformers.AutoModel``) and tunescope's classifier on its pooled states.

    ``forward`` takes what a tokenizer and ``DataCollatorWithPadding`` give (input_ids,
    attention_mask, token_type_ids, special_tokens_mask, labels) and returns a
    ``SequenceClassifierOutput`` (loss when ``labels`` is given), so ``Trainer`` trains it as is.
    """

    is_tunescope_classifier = True  # what a run records as its classifier (any copy of this file)

    def __init__(
        self, encoder: nn.Module, recipe: dict[str, Any], generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        spec = recipe["classifier"]
        self.encoder = encoder
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # unused: the classifier reads the pooled token states
        self.pooling = spec["pooling"]
        self.n_outputs = int(spec["n_outputs"])
        self.special_ids = [int(i) for i in recipe["model"].get("special_token_ids", [])]
        self.classifier = Classifier(
            int(spec["d_model"]), self.n_outputs, float(spec["dropout"]), float(spec["init_std"]),
            generator,
        )  # fmt: skip

    @classmethod
    def from_pretrained(
        cls, recipe: dict[str, Any], path: str | Path | None = None, seed: int | None = None
    ) -> TunescopeClassifier:
        """Load the encoder (`model_source`: ``path``, else where the recipe's model is here) and
        build the classifier from the classifier stream of the recipe's seed (or ``seed``): the
        same initial classifier as tunescope's run. Then torch is seeded from the seed's method
        stream, so the adapters `apply_recipe` inserts (or PEFT's LoRA, wrapped next) start as
        in tunescope's run."""
        from transformers import AutoModel

        encoder = AutoModel.from_pretrained(model_source(recipe, path))
        seed = recipe["training"]["seed"] if seed is None else seed
        generator = torch.Generator().manual_seed(stream_seed(seed, "classifier"))
        model = cls(encoder, recipe, generator)
        torch.manual_seed(stream_seed(seed, "method", GLOBALS_KEY))
        return model

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, S)
        attention_mask: torch.Tensor,  # (B, S) 1 = real token
        token_type_ids: torch.Tensor | None = None,
        special_tokens_mask: torch.Tensor | None = None,  # (B, S) 1 = special token
        labels: torch.Tensor | None = None,  # (B,)
    ):
        from transformers.modeling_outputs import SequenceClassifierOutput

        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and "token_type_ids" in _forward_args(self.encoder):
            inputs["token_type_ids"] = token_type_ids
        hidden = self.encoder(**inputs).last_hidden_state  # (B, S, d)
        if self.pooling == "first":
            pooled = hidden[:, 0]
        else:
            real = attention_mask.bool()
            if special_tokens_mask is None:
                special = torch.tensor(self.special_ids, device=input_ids.device)
                special_tokens_mask = torch.isin(input_ids, special)
            real = real & ~special_tokens_mask.bool()
            weights = real.to(hidden.dtype)
            empty = weights.sum(dim=1) == 0  # only special tokens: every non-padding token
            weights = torch.where(empty[:, None], attention_mask.to(hidden.dtype), weights)
            weights = weights / weights.sum(dim=1, keepdim=True)
            pooled = torch.einsum("bsd,bs->bd", hidden, weights)  # (B, d)
        logits = self.classifier(pooled).float()  # (B, C)
        loss = None
        if labels is not None:
            if self.n_outputs == 1:
                loss = nn.functional.mse_loss(logits[:, 0], labels.float())
            else:
                loss = nn.functional.cross_entropy(logits, labels.long())
        return SequenceClassifierOutput(loss=loss, logits=logits)


def _forward_args(module: nn.Module) -> set[str]:
    return set(inspect.signature(type(module).forward).parameters)


# -- checking the model against the recipe ---------------------------------------------------------


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model inside a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "peft_config") else model


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder inside ``model`` (a TunescopeClassifier, an HF model with a classifier, a PEFT model)."""
    model = _unwrapped(model)
    if getattr(model, "is_tunescope_classifier", False):
        return model.encoder
    base = getattr(model, "base_model", model)
    return base if isinstance(base, nn.Module) else model


def _module(root: nn.Module, path: str) -> nn.Module:
    try:
        return root.get_submodule(path)
    except AttributeError:
        raise RecipeError(f"The model has no module {path!r}: is it the recipe's model?") from None


def _maybe_module(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _blocks(base: nn.Module, layers_module: str | None = None) -> nn.ModuleList | None:
    """The transformer blocks of an encoder: the recipe's module, else where the supported
    families keep them (``encoder.layer``; DistilBERT's ``transformer.layer``)."""
    for path in (layers_module, "encoder.layer", "transformer.layer"):
        found = _maybe_module(base, path) if path else None
        if isinstance(found, nn.ModuleList):
            return found
    return None


def _classifier_modules(model: nn.Module, recipe: dict[str, Any]) -> list[nn.Module]:
    """The classifier's modules: TunescopeClassifier's own, or the HF model's."""
    if hasattr(model, "peft_config"):
        return []  # PEFT's modules_to_save copies of the classifier train; PEFT set them up
    if getattr(model, "is_tunescope_classifier", False):
        return [model.classifier]
    names = recipe["classifier"]["hf_modules"]
    found = [m for name in names if (m := _maybe_module(model, name)) is not None]
    if not found:
        return []  # a bare encoder: no classifier to train
    if len(found) != len(names):
        raise RecipeError(f"The model has only some of the classifier modules {names}.")
    return found


def num_labels(model: nn.Module) -> int | None:
    """The classifier's outputs C: a TunescopeClassifier's, a transformers
    ``…ForSequenceClassification``'s ``num_labels``; None for a model without a classifier."""
    model = _unwrapped(model)
    if getattr(model, "is_tunescope_classifier", False):
        return int(model.n_outputs)
    if type(model).__name__.endswith("ForSequenceClassification"):
        return int(model.config.num_labels)
    return None


def _shape(model: nn.Module, recipe: dict[str, Any]) -> dict[str, Any]:
    """What `check_model` compares: family, layers, d_model, labels (None: not known)."""
    base = encoder_of(model)
    config = base.config
    blocks = _blocks(base, recipe["layers_module"])
    return {
        "family": getattr(config, "model_type", None),
        "layers": len(blocks) if blocks is not None else None,
        "d_model": getattr(config, "hidden_size", None) or getattr(config, "dim", None),
        "labels": num_labels(model),
    }


CHECKED = {"family": "family", "layers": "layer count", "d_model": "width",
           "labels": "number of labels"}  # fmt: skip


def _described(shape: dict[str, Any]) -> str:
    parts = [str(shape["family"]), f"{shape['layers']} layers", f"d_model {shape['d_model']}"]
    if shape["labels"] is not None:
        parts.append(f"{shape['labels']} labels")
    return ", ".join(parts)


def check_model(model: nn.Module, recipe: dict[str, Any]) -> None:
    """A RecipeError naming both sides unless ``model`` is the recipe's model: its family, layer
    count (all of them, or already cut to ``keep_layers``), width, number of labels (a model with
    a classifier) and, where the recipe has one, its weights' fingerprint (`weights_fingerprint`;
    not checked, with a warning, when the weights are in another dtype than the recipe's)."""
    if getattr(encoder_of(model), "config", None) is None:
        raise RecipeError("apply_recipe needs a transformers model (one with a .config).")
    want = recipe["model"]
    wanted = {"family": want["model_type"], "layers": want["n_layers"], "d_model": want["d_model"],
              "labels": recipe["classifier"]["n_outputs"]}  # fmt: skip
    got = _shape(model, recipe)
    if got["layers"] == recipe["keep_layers"]:
        got["layers"] = want["n_layers"]  # cut already (apply_recipe is idempotent)
    differ = [k for k, v in wanted.items() if got[k] is not None and got[k] != v]
    if got["layers"] is None and got["family"] == wanted["family"]:
        differ.append("layers")
    if differ:
        shown = {**got, "layers": _shape(model, recipe)["layers"]}
        raise RecipeError(
            f"This recipe is for {want['name']} ({_described(wanted)}); this model is "
            f"{_described(shown)}: its {' and '.join(CHECKED[k] for k in differ)} "
            f"{'differs' if len(differ) == 1 else 'differ'}."
        )
    fingerprint = want.get("fingerprint")
    if not fingerprint:
        return
    found = weights_fingerprint(model, recipe)
    if found["dtype"] != fingerprint["dtype"]:
        warnings.warn(
            f"The model's weights are {found['dtype']} and the recipe's fingerprint is of "
            f"{fingerprint['dtype']} weights: the weights are not checked.",
            stacklevel=3,
        )
    elif found["sha256"] != fingerprint["sha256"]:
        raise RecipeError(
            f"This recipe is for the weights of {want['name']} (fingerprint "
            f"{fingerprint['sha256'][:12]}…); this model's weights differ ({found['sha256'][:12]}…): "
            "load the recipe's model (model_source(recipe)) or export a recipe for this one."
        )


def weights_fingerprint(
    model: nn.Module, recipe: dict[str, Any] | None = None, *, layers_module: str = "",
    keep_layers: int = 0,
) -> dict[str, str]:  # fmt: skip
    """{sha256, dtype} of the encoder's embeddings and its first ``keep_layers`` layers (the
    recipe's, by default): SHA-256 over each parameter's shape and bytes, in the model's order.
    What PEFT or `add_adapters` added is left out, so a wrapped model has its base's fingerprint;
    names are left out, so transformers' renames do not change it."""
    if recipe is not None:
        layers_module, keep_layers = recipe["layers_module"], int(recipe["keep_layers"])
    added = set(((recipe or {}).get("train", {}).get("adapters") or {}).get("sites", {}))
    for module in model.modules():
        added |= set(getattr(module, "adapter_layer_names", ()))  # PEFT's tuner layers
    digest = hashlib.sha256()
    dtypes = set()
    prefix = f"{layers_module}."
    for name, param in encoder_of(model).named_parameters():
        if added & set(name.split(".")):
            continue
        if name.startswith(prefix):
            if int(name[len(prefix) :].split(".")[0]) >= keep_layers:
                continue
        elif not name.startswith("embeddings."):
            continue
        tensor = param.detach().cpu().contiguous()
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        dtypes.add(str(tensor.dtype).removeprefix("torch."))
    return {"sha256": digest.hexdigest(), "dtype": ",".join(sorted(dtypes))}


# -- applying the recipe ---------------------------------------------------------------------------


def truncate(model: nn.Module, recipe: dict[str, Any]) -> None:
    """Delete the layers above the classifier's layer and update the config (idempotent)."""
    base = encoder_of(model)
    layers = _module(base, recipe["layers_module"])
    keep = int(recipe["keep_layers"])
    del layers[keep:]
    for key in ("num_hidden_layers", "n_layers"):
        if hasattr(base.config, key):
            setattr(base.config, key, keep)


class HoulsbyAdapter(nn.Module):
    """x + up(gelu(down(x))), exact identity at initialisation (Houlsby et al. 2019)."""

    def __init__(self, d_model: int, size: int, init_std: float = 1e-2) -> None:
        super().__init__()
        self.down = nn.Linear(d_model, size)
        self.act = nn.GELU()
        self.up = nn.Linear(size, d_model)
        nn.init.normal_(self.down.weight, std=init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, d_model) -> same
        return x + self.up(self.act(self.down(x)))


def add_adapters(model: nn.Module, recipe: dict[str, Any]) -> None:
    """Two adapters per listed layer, on the attention and feed-forward output projections,
    before the block's residual + LayerNorm (forward hooks), as children of the block."""
    spec = recipe["train"].get("adapters")
    if not spec:
        return
    layers = _module(encoder_of(model), recipe["layers_module"])
    for layer in spec["layers"]:  # 1-based
        block = layers[layer - 1]
        for name, site in spec["sites"].items():
            if hasattr(block, name):
                continue  # applied already
            target = _module(block, site)
            adapter = HoulsbyAdapter(target.out_features, int(spec["size"]), spec["init_std"])
            adapter.to(device=target.weight.device, dtype=target.weight.dtype)
            block.add_module(name, adapter)
            target.register_forward_hook(lambda m, a, out, adapter=adapter: adapter(out))


def _row_mask(param: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
    keep = torch.zeros(param.shape[0], dtype=torch.bool, device=param.device)
    for start, stop in rows:
        keep[start:stop] = True
    return keep[:, None].expand_as(param).clone() if param.ndim == 2 else keep


def count_trainable(model: nn.Module) -> int:
    """Entries that train: every entry of a tensor with ``requires_grad``, but of a tensor that
    `apply_recipe` masked (the rows of chosen heads) only the rows it keeps."""
    return sum(_entries(p) for p in model.parameters() if p.requires_grad)


def _entries(param: torch.Tensor) -> int:
    mask = getattr(param, "tunescope_mask", None)
    return int(mask.sum()) if mask is not None else param.numel()


def apply_recipe(
    model: nn.Module,
    recipe: dict[str, Any],
    *,
    lr: float | None = None,
    classifier_lr: float | None = None,
    weight_decay: float | None = None,
) -> list[dict[str, Any]]:
    """Check, truncate, add adapters, freeze, unfreeze and mask as the recipe says (module
    docstring); returns AdamW parameter groups (body / classifier × decay / no decay, each with
    its ``role``) for ``torch.optim.AdamW(groups)`` in your own loop, or `make_optimizer` for
    ``Trainer(optimizers=…)``."""
    check_model(model, recipe)
    train = recipe["train"]
    opt = recipe["optimizer"]
    lr = opt["lr"] if lr is None else lr
    classifier_lr = opt["classifier_lr"] if classifier_lr is None else classifier_lr
    weight_decay = opt["weight_decay"] if weight_decay is None else weight_decay
    truncate(model, recipe)
    base = encoder_of(model)
    if train.get("peft"):
        if not hasattr(model, "peft_config"):
            raise RecipeError(
                f"A {train['peft']['peft_type']} recipe is applied with PEFT: model = "
                "get_peft_model(model, PeftConfig.from_pretrained(RECIPE_DIR)), then "
                "apply_recipe(model, recipe)."
            )
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        body = [p for n, p in trained if ".modules_to_save." not in n]  # what PEFT adds
        classifier = [p for n, p in trained if ".modules_to_save." in n]  # PEFT's copy
    else:
        add_adapters(model, recipe)
        model.requires_grad_(False)
        body = []
        for name in train["params"]:
            param = _parameter(base, name)
            param.requires_grad_(True)
            body.append(param)
        for entry in train["masks"]:
            param = _parameter(base, entry["param"])
            mask = _row_mask(param, entry["rows"])
            param.requires_grad_(True)
            # The hook runs as the gradient is computed: before clipping and the optimizer.
            param.register_hook(lambda grad, mask=mask: grad.masked_fill(~mask, 0.0))
            param.tunescope_mask = mask
            body.append(param)
        classifier = [p for m in _classifier_modules(model, recipe) for p in m.parameters()]
        for param in classifier:
            param.requires_grad_(True)
    n_body = sum(_entries(p) for p in body)
    if n_body != train["n_trainable_body"]:
        raise RecipeError(
            f"The recipe trains {train['n_trainable_body']:,} encoder entries; on this model it "
            f"found {n_body:,}: the model is not the recipe's model."
        )
    groups = []
    for role, params, rate in (("body", body, lr), ("classifier", classifier, classifier_lr)):
        masked = {id(p) for p in params if getattr(p, "tunescope_mask", None) is not None}
        decay = [p for p in params if p.ndim >= 2 and id(p) not in masked]
        no_decay = [p for p in params if p.ndim < 2 or id(p) in masked]
        groups.append({"params": decay, "weight_decay": weight_decay, "lr": rate, "role": role})
        groups.append({"params": no_decay, "weight_decay": 0.0, "lr": rate, "role": role})
    return [g for g in groups if g["params"]]


def _parameter(root: nn.Module, name: str) -> nn.Parameter:
    try:
        return root.get_parameter(name)
    except AttributeError:
        raise RecipeError(
            f"The model has no parameter {name!r}: the recipe is for another model or family."
        ) from None


# -- optimizer and schedule ------------------------------------------------------------------------


class WarmupDecay:
    """tunescope's learning-rate factor of the i-th update (0-based) of ``steps``: linear warm-up
    over round(warmup × steps) updates to the full rate, then linear decay, min((i + 1) / warm-up,
    (steps − i) / (steps − warm-up)); zero after the last update. Past it the factor would turn
    negative (gradient ascent), so it is a `RecipeError` instead."""

    def __init__(self, steps: int, warmup: float) -> None:
        self.steps, self.warmup = int(steps), float(warmup)

    def __call__(self, i: int) -> float:
        if i > self.steps:
            raise RecipeError(
                f"The learning-rate schedule covers {self.steps} steps and the Trainer is past "
                "them: add TunescopeCallback to the Trainer's callbacks (it fits the schedule to "
                "the Trainer's steps) or pass steps=<the Trainer's max_steps> to make_optimizer."
            )
        warm = round(self.warmup * self.steps)
        k = i + 1
        decay = (self.steps - k + 1) / max(self.steps - warm, 1)
        return min(k / warm, decay) if warm else decay


class RecipeSchedule(torch.optim.lr_scheduler.LambdaLR):
    """The recipe's schedule (`WarmupDecay`) over ``steps`` updates. ``fixed``: the steps were
    given, and a Trainer that runs another number is refused (`fit`); else `TunescopeCallback`
    fits the schedule to the Trainer's number of steps when training begins."""

    def __init__(self, optimizer, steps: int, warmup: float, fixed: bool = False) -> None:
        self.fixed = fixed
        super().__init__(optimizer, WarmupDecay(steps, warmup))

    @property
    def steps(self) -> int:
        return self.lr_lambdas[0].steps

    def fit(self, steps: int) -> None:
        """Span ``steps`` updates from here (a RecipeError when the steps were fixed to another
        number), the current learning rates set accordingly."""
        if steps == self.steps:
            return
        if self.fixed:
            raise RecipeError(
                f"make_optimizer was given steps={self.steps}, but the Trainer runs {steps} steps: "
                "give make_optimizer the Trainer's max_steps (or no steps: the callback fits them)."
            )
        for factor in self.lr_lambdas:
            factor.steps = int(steps)
        rates = [base * f(self.last_epoch)
                 for base, f in zip(self.base_lrs, self.lr_lambdas, strict=True)]  # fmt: skip
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        self._last_lr = rates


def make_optimizer(model: nn.Module, recipe: dict[str, Any], steps: int | None = None, **rates):
    """`apply_recipe`, then AdamW over its groups (torch's fused kernel where it can) and the
    recipe's schedule (`RecipeSchedule`): ``(optimizer, scheduler)``, what
    ``Trainer(optimizers=…)`` takes. ``steps`` fixes the schedule's length; without it the
    schedule spans the recipe's steps until `TunescopeCallback` fits it to the Trainer's."""
    groups = apply_recipe(model, recipe, **rates)
    opt = recipe["optimizer"]
    params = [p for g in groups for p in g["params"]]
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(
        groups,
        lr=groups[0]["lr"],
        betas=tuple(opt["betas"]),
        eps=opt["eps"],
        fused=True if fused else None,
    )
    length = steps or recipe["training"]["steps"]
    return optimizer, RecipeSchedule(optimizer, length, opt["warmup"], fixed=steps is not None)


def tunescope_batches(n_examples: int, batch_size: int, seed: int, steps: int) -> list[list[int]]:
    """The rows of tunescope's first ``steps`` batches at training seed ``seed`` (a fresh numpy
    permutation each epoch from the seed's batch-order stream, the last short batch kept): to
    feed a loop the very batches a tunescope run saw."""
    import numpy as np

    rng = np.random.default_rng(np.random.SeedSequence((int(seed), STREAMS["batch_order"])))
    out: list[list[int]] = []
    while len(out) < steps:
        perm = rng.permutation(n_examples)
        for start in range(0, n_examples, batch_size):
            out.append(perm[start : start + batch_size].tolist())
            if len(out) == steps:
                break
    return out


def replay_randomness_callback(recipe: dict[str, Any], seed: int | None = None):
    """A ``TrainerCallback`` that seeds torch (every device) from the dropout stream of the
    recipe's seed (or ``seed``) right before the first training step, as tunescope's loop does:
    ``Trainer`` re-seeds and its DataLoader draws a number when it starts, so without it dropout
    draws differ from a tunescope run at the same seed."""
    seed = recipe["training"]["seed"] if seed is None else seed
    value = stream_seed(seed, "dropout", GLOBALS_KEY)

    class ReplayRandomness(TrainerCallback):
        def on_step_begin(self, args, trainer_state, control, **kwargs):
            if trainer_state.global_step == 0:
                torch.manual_seed(value)

    return ReplayRandomness()


# -- the test set ------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A tensor or array as a list (a tokenized dataset in torch or numpy format)."""
    return value.tolist() if hasattr(value, "tolist") else value


class TestSet:
    """The examples `TunescopeCallback` scores when training ends: a ``datasets.Dataset``, a list
    of dicts, a dict of columns or any dataset indexable by position, each example with a label
    (``labels`` or ``label``) and either ``input_ids`` (tokenized) or a text column (raw: tokenized
    with the Trainer's tokenizer when training begins). Checked when made (`CallbackError`);
    `prepare` checks the rest (a tokenizer, the labels against the model) before training."""

    __test__ = False  # not a pytest class

    def __init__(self, data: Any, texts: Any = None, text_column: str = "text") -> None:
        rows = self._rows(data)
        if not rows:
            raise CallbackError("The test set is empty.")
        self.text_column = text_column
        for i, row in enumerate(rows):
            self._check(i, row)
        self.rows = rows
        self.labels = [float(_plain(row.get("labels", row.get("label")))) for row in rows]
        self.tokenized = "input_ids" in rows[0]
        if texts is not None:
            texts = [str(t) for t in texts]
            if len(texts) != len(rows):
                raise CallbackError("test_texts must hold one text per test example.")
        elif all(isinstance(row.get(text_column), str) for row in rows):
            texts = [row[text_column] for row in rows]
        self.texts = texts
        self.encoded: list[dict[str, Any]] = []

    @staticmethod
    def _rows(data: Any) -> list[dict[str, Any]]:
        if isinstance(data, dict) or (hasattr(data, "keys") and hasattr(data, "items")):
            columns = {k: _plain(v) for k, v in data.items()}  # a dict of columns
            lengths = {len(v) for v in columns.values() if isinstance(v, list)}
            if len(lengths) != 1 or len(lengths) != len({len(v) for v in columns.values()}):
                raise CallbackError("A test set given as columns needs columns of one length.")
            return [{k: v[i] for k, v in columns.items()} for i in range(lengths.pop())]
        if isinstance(data, (str, bytes)) or not hasattr(data, "__len__"):
            raise CallbackError(
                "The test set must be a datasets.Dataset, a list of dicts or a tokenized "
                f"dataset; got {type(data).__name__}."
            )
        rows = []
        for i in range(len(data)):
            row = data[i]
            if not hasattr(row, "items"):
                raise CallbackError(
                    f"Test example {i} is a {type(row).__name__}, not a dict of columns."
                )
            rows.append({k: _plain(v) for k, v in row.items()})
        return rows

    def _check(self, i: int, row: dict[str, Any]) -> None:
        label = row.get("labels", row.get("label"))
        columns = ", ".join(map(str, row)) or "none"
        if label is None:
            raise CallbackError(
                f"Test example {i} has no label ('labels' or 'label'); its columns: {columns}."
            )
        if not isinstance(label, (int, float)) or isinstance(label, bool) or math.isnan(label):
            raise CallbackError(f"Test example {i}'s label is {label!r}, not a number.")
        if "input_ids" not in row and not isinstance(row.get(self.text_column), str):
            raise CallbackError(
                f"Test example {i} has neither input_ids (tokenized) nor a text column "
                f"'{self.text_column}' (its columns: {columns}): tokenize it, or pass "
                "text_column=…."
            )

    def __len__(self) -> int:
        return len(self.rows)

    def prepare(self, model: nn.Module, tokenizer, max_length: int | None) -> None:
        """Tokenize raw examples, check the labels against the model's classes and score one
        batch: whatever would fail at the end fails now, before any training step."""
        if tokenizer is None:
            raise CallbackError(
                "Scoring the test set needs the Trainer's processing_class (tokenizer)."
            )
        if self.tokenized:
            self.encoded = [{k: v for k, v in row.items() if k in TOKEN_COLUMNS}
                            for row in self.rows]  # fmt: skip
        else:
            texts = [row[self.text_column] for row in self.rows]
            length = {"max_length": max_length} if max_length else {}
            encoded = tokenizer(texts, truncation=True, return_special_tokens_mask=True, **length)
            self.encoded = [{k: encoded[k][i] for k in encoded if k in TOKEN_COLUMNS}
                            for i in range(len(texts))]  # fmt: skip
        classes = num_labels(model)
        if classes and classes > 1:
            bad = [y for y in self.labels if y != int(y) or not 0 <= y < classes]
            if bad:
                raise CallbackError(
                    f"The test labels must be 0 … {classes - 1} (the model has {classes} "
                    f"classes); the test set has {bad[0]:g}."
                )
        self.predict(model, tokenizer, limit=min(len(self), 2))

    def predict(self, model: nn.Module, tokenizer, autocast=None, limit: int | None = None):
        """(predictions (N,), regression): argmax class ids, or the single output of a
        regression model; in eval mode, batches of 32 padded by the tokenizer."""
        from transformers import DataCollatorWithPadding

        collate = DataCollatorWithPadding(tokenizer)
        accepted = _forward_args(_unwrapped(model))
        device = next(model.parameters()).device
        rows = self.encoded[:limit]
        out, regression = [], False
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode(), autocast() if autocast else contextlib.nullcontext():
                for start in range(0, len(rows), 32):
                    batch = collate(rows[start : start + 32])
                    inputs = {k: v.to(device) for k, v in batch.items() if k in accepted}
                    output = model(**inputs)
                    logits = (output.logits if hasattr(output, "logits") else output[0]).float()
                    regression = logits.shape[-1] == 1
                    out += (logits[:, 0] if regression else logits.argmax(dim=-1)).tolist()
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise CallbackError(f"The model cannot score the test set: {exc}") from None
        finally:
            model.train(was_training)
        return [float(v) for v in out], regression

    def record(self, predictions: list[float], regression: bool) -> dict[str, Any]:
        """test.json: predictions, labels and what identifies the examples (their texts, else
        their token ids) for pairing runs scored on the same examples."""
        keys = self.texts or [" ".join(map(str, row["input_ids"])) for row in self.encoded]
        return {"n": len(predictions), "regression": regression, "predictions": predictions,
                "labels": self.labels, "keys": keys,
                "keys_are": "texts" if self.texts else "token ids"}  # fmt: skip


# -- the run folder ----------------------------------------------------------------------------------


def _write_json(path: Path, value: Any) -> None:
    """Write a file whole or not at all (a temporary file renamed over it). This module runs
    where tunescope is not installed, so it cannot use tunescope's own atomic writer."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    temporary.write_text(json.dumps(value, indent=1, default=str), encoding="utf-8")
    temporary.replace(path)


class RunFolder:
    """One run's folder, written as the run goes (a crash leaves what was logged):

    - ``run.json``: ``format`` (tunescope-run), ``version``, ``id``, ``status`` (running, done,
      failed, cancelled), ``error``, ``started`` / ``finished`` (UNIX seconds), ``ran`` (what
      actually ran: `TunescopeCallback`), ``result`` (timings, memory, steps; once ended);
    - ``steps.jsonl``: one logged step a line, ``{"step", "kind": "train" | "dev", values…}``;
    - ``test.json``: the test set's predictions (`TestSet.record`), when there is a test set.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def start(self, run_id: str, ran: dict[str, Any]) -> None:
        if (self.path / "run.json").exists():
            raise CallbackError(f"{self.path} holds a run already: give each run its own folder.")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CallbackError(f"Cannot write the run folder {self.path}: {exc}") from None
        self.run = {"format": RUN_FORMAT, "version": RUN_FORMAT_VERSION, "id": run_id,
                    "status": "running", "error": None, "started": time.time(), "finished": None,
                    "ran": ran, "result": None}  # fmt: skip
        _write_json(self.path / "run.json", self.run)

    def log(self, step: int, kind: str, values: dict[str, float]) -> None:
        line = json.dumps({"step": int(step), "kind": kind, **values})
        with (self.path / "steps.jsonl").open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    def end(self, status: str, error: str | None = None, result=None, test=None) -> None:
        if test is not None:
            _write_json(self.path / "test.json", test)
        self.run.update(status=status, error=error, finished=time.time(), result=result)
        _write_json(self.path / "run.json", self.run)


def read_run_folder(path: str | Path) -> dict[str, Any]:
    """A run folder's run.json with its ``steps`` (steps.jsonl; a last line a crash cut short
    is left out) and ``test`` (test.json, or None); a CallbackError when it is not one."""
    path = Path(path)
    try:
        run = json.loads((path / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CallbackError(f"{path} is not a readable run folder ({exc}).") from None
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise CallbackError(f"{path / 'run.json'} is not a tunescope run (format {RUN_FORMAT}).")
    if int(run.get("version", 0)) > RUN_FORMAT_VERSION:
        raise CallbackError(f"{path} is run format version {run['version']}: update tunescope.")
    steps = []
    with contextlib.suppress(OSError):
        for line in (path / "steps.jsonl").read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                steps.append(json.loads(line))
    run["steps"] = steps
    try:
        run["test"] = json.loads((path / "test.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run["test"] = None
    return run


# -- the callback ------------------------------------------------------------------------------------


class ExitWatch:
    """Fails a run the process leaves unfinished: while started, ``fail(why)`` runs at exit, and
    an uncaught exception (the process is ending) gives ``why`` its reason (``describe(exc)``)."""

    def __init__(self, fail: Callable[[str], None], describe: Callable[[BaseException], str]):
        self.fail, self.describe = fail, describe
        self.crash: BaseException | None = None
        self._previous_hook = None

    def start(self) -> None:
        atexit.register(self._at_exit)
        previous = sys.excepthook

        def hook(kind, value, tb):
            self.crash = value
            previous(kind, value, tb)

        self._previous_hook = previous
        sys.excepthook = hook

    def stop(self) -> None:
        atexit.unregister(self._at_exit)
        if self._previous_hook is not None:
            sys.excepthook, self._previous_hook = self._previous_hook, None

    def _at_exit(self) -> None:
        why = "the training process ended before the run finished"
        if self.crash is not None:
            why += f" ({self.describe(self.crash)})"
        self.fail(why)


def new_run_id() -> str:
    """A run's id: when it started (UTC) and six random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


class TunescopeCallback(TrainerCallback):
    """Record a ``Trainer`` run as a run folder (`RunFolder`) that ``tunescope runs import`` (or
    the Runs page) brings into tunescope's runs database.

    folder: the run folder (default: ``<output_dir>/tunescope-runs/<run id>``); model_name /
    data_name: what tunescope shows (default: the recipe's model, else the model's own name);
    recipe: the applied recipe (a dict, or its folder / recipe.json), whose method and settings
    the run takes; test_dataset: scored when training ends (`TestSet`: a ``datasets.Dataset``, a
    list of dicts or a tokenized dataset; raw examples need a ``text_column``); test_texts: the
    texts of a tokenized test set, so tunescope pairs runs scored on the same examples; metric:
    the task's score (``accuracy``, ``f1``, ``mcc``, ``spearman``…), ``eval_<metric>`` being the
    dev curve; data_fingerprint: any string naming the training data (runs on other data never
    group together); join_groups: the run reproduces tunescope's own loop (`TunescopeClassifier`,
    `make_optimizer`, the recipe's batches and seed), so it joins the run group of tunescope's
    runs of its setting; tags / note: set on the run.

    As a context manager (``with callback: trainer.train()``) an exception inside marks the run
    failed (a KeyboardInterrupt: cancelled), with every step it logged; a process that ends with
    the run unfinished marks it failed too.
    """

    def __init__(
        self,
        folder: str | Path | None = None,
        model_name: str | None = None,
        data_name: str = "custom",
        *,
        recipe: dict[str, Any] | str | Path | None = None,
        test_dataset: Any = None,
        test_texts: Any = None,
        text_column: str = "text",
        metric: str = "accuracy",
        data_fingerprint: str | None = None,
        join_groups: bool = False,
        tags: Any = (),
        note: str = "",
    ) -> None:
        if recipe is not None and not isinstance(recipe, dict):
            try:
                recipe = load_recipe(recipe)
            except (OSError, ValueError) as exc:
                raise CallbackError(f"Cannot read the recipe {recipe}: {exc}") from None
        self.recipe = recipe
        self.test = (
            TestSet(test_dataset, test_texts, text_column) if test_dataset is not None else None
        )
        if test_dataset is None and test_texts is not None:
            raise CallbackError("test_texts go with a test_dataset.")
        self.folder_path = Path(folder) if folder is not None else None
        self.model_name, self.data_name = model_name, str(data_name)
        self.metric, self.data_fingerprint = metric, data_fingerprint
        self.join_groups = bool(join_groups)
        self.tags, self.note = tuple(tags), note
        self.run_id: str | None = None
        self.status: str | None = None
        self.folder: RunFolder | None = None
        self._device = "cpu"
        self._start = 0.0
        self._step_start: float | None = None
        self._step_times: list[float] = []
        self._best_dev: float | None = None
        self._n_eval: int | None = None
        self._exit_watch = ExitWatch(self.fail, self._describe)

    # -- how a run ends when the training does not ------------------------------------------------
    def __enter__(self) -> TunescopeCallback:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None:
            self.fail(exc)
        return False

    def fail(self, exc: BaseException | str, status: str = "failed") -> None:
        """End the run ``failed`` (``cancelled`` for a KeyboardInterrupt) with the reason, unless
        it ended already; its logged steps stay."""
        if self.folder is None or self.status is not None:
            return
        message = exc if isinstance(exc, str) else self._describe(exc)
        self.status = "cancelled" if isinstance(exc, KeyboardInterrupt) else status
        self._exit_watch.stop()
        with contextlib.suppress(OSError):
            self.folder.end(self.status, message)
        self._ended(self.status, message)

    def _describe(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__

    # -- what tunescope's own callback adds (analysis.runs.callback) ------------------------------
    def _open(self, args, ran: dict[str, Any]) -> Path:
        """The run's id (``self.run_id``) and its folder."""
        self.run_id = new_run_id()
        return self.folder_path or Path(args.output_dir) / RUNS_FOLDER / self.run_id

    def _logged(self, step: int, kind: str, values: dict[str, float]) -> None:
        """A step written to the run folder."""

    def _ended(self, status: str, error: str | None) -> None:
        """The run folder holds the run's end."""

    def _memory_begin(self, device: str) -> None:
        self._cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device)
            self._memory_base = torch.cuda.memory_allocated(device)

    def _memory_peak(self) -> float | None:
        """Peak memory the run added (MiB): the CUDA allocator's; None on the CPU."""
        if not self._cuda:
            return None
        return (torch.cuda.max_memory_allocated(self._device) - self._memory_base) / 2**20

    # -- Trainer events -----------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.folder is not None:
            raise CallbackError("This callback recorded a run already: use one per Trainer run.")
        tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        if self.test is not None:
            max_length = (self.recipe or {}).get("training", {}).get("max_length")
            self.test.prepare(model, tokenizer, max_length)
        scheduler = kwargs.get("lr_scheduler")
        if isinstance(getattr(scheduler, "fixed", None), bool):  # make_optimizer's, any copy
            scheduler.fit(int(state.max_steps))
        ran = self._ran(args, state, model, kwargs.get("optimizer"), scheduler)
        self._device = ran["device"]
        folder = RunFolder(self._open(args, ran))
        try:
            folder.start(self.run_id, ran)
        except CallbackError as exc:
            self._ended("failed", str(exc))
            raise
        self.folder = folder
        self._exit_watch.start()
        self._memory_begin(self._device)
        self._start = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_start is not None:
            self._step_times.append(time.perf_counter() - self._step_start)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or self.folder is None or self.status is not None:
            return
        step = int(state.global_step)
        names = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}
        train = {v: float(logs[k]) for k, v in names.items() if _number(logs.get(k))}
        if train:
            train["elapsed_s"] = time.perf_counter() - self._start
            self._log(step, "train", train)
        dev = {}
        if _number(logs.get(f"eval_{self.metric}")):
            dev["dev"] = float(logs[f"eval_{self.metric}"])
            self._best_dev = max(dev["dev"], self._best_dev or -math.inf)
        if _number(logs.get("eval_loss")):
            dev["loss"] = float(logs["eval_loss"])
        if dev:
            self._log(step, "dev", dev)

    def _log(self, step: int, kind: str, values: dict[str, float]) -> None:
        self.folder.log(step, kind, values)
        self._logged(step, kind, values)

    def on_evaluate(self, args, state, control, **kwargs):
        with contextlib.suppress(TypeError, AttributeError):
            self._n_eval = len(kwargs["eval_dataloader"].dataset)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.folder is None or self.status is not None:
            return
        try:
            test = None
            if self.test is not None and model is not None:
                tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
                test = self.test.record(*self.test.predict(model, tokenizer, _autocast(args)))
            self.folder.end("done", result=self._result(state), test=test)
        except Exception as exc:
            self.fail(exc)
            raise
        self._exit_watch.stop()
        self.status = "done"
        self._ended("done", None)

    # -- what ran, and how long it took ---------------------------------------------------------
    def _ran(self, args, state, model, optimizer, scheduler) -> dict[str, Any]:
        """The config of what actually ran (`RunFolder`'s ``ran``)."""
        recipe = self.recipe
        facts = _model_facts(model, recipe)
        if self.join_groups and (recipe is None or facts["classifier"] != "tunescope"
                                 or not _roles(optimizer)):  # fmt: skip
            raise CallbackError(
                "join_groups=True is for a run that reproduces tunescope's own: a "
                "TunescopeClassifier trained with make_optimizer(model, recipe); this one trains "
                f"a {facts['class']}{'' if _roles(optimizer) else ' with its own optimizer'}, so "
                "it keeps a run group of its own."
            )
        name = self.model_name or (recipe["model"]["name"] if recipe else facts.pop("name"))
        facts.pop("name", None)
        steps = int(state.max_steps or args.max_steps or 0)
        strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
        every = (args.eval_steps or args.logging_steps) if strategy == "steps" else None
        if every is not None and every < 1:
            every = math.ceil(every * steps)  # a share of the steps
        provenance = (recipe or {}).get("provenance", {})
        return {
            "model": {"name": str(name), **facts},
            "data": {"name": self.data_name, "fingerprint": self.data_fingerprint},
            "recipe": None if recipe is None else {
                "method": recipe["method"], "description": recipe["description"],
                "config": provenance.get("config"), "source": provenance.get("source"),
                "run_id": provenance.get("run_id"), "n_trainable": recipe["train"]["n_trainable"],
                "n_params": recipe["train"]["n_params"],
            },
            "optimizer": _optimizer_facts(optimizer, scheduler, args, steps),
            "evaluation": {"strategy": strategy, "every": int(every) if every else None,
                           "best_at_end": bool(args.load_best_model_at_end)},
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else facts["dtype"],
            "steps": steps,
            "batch_size": int(args.per_device_train_batch_size * args.gradient_accumulation_steps
                              * max(1, args.world_size)),
            "seed": int(args.seed),
            "max_grad_norm": float(args.max_grad_norm),
            "device": str(args.device),
            "metric": self.metric,
            "test": None if self.test is None else {"n": len(self.test),
                                                    "texts": self.test.texts is not None},
            "join_groups": self.join_groups,
            "tags": list(self.tags),
            "note": self.note,
        }  # fmt: skip

    def _result(self, state) -> dict[str, Any]:
        timed = self._step_times[1:] if len(self._step_times) > 1 else self._step_times
        ordered = sorted(timed)
        return {
            "wall_s": time.perf_counter() - self._start,
            "step_time_s": sum(timed) / len(timed) if timed else None,  # the first step left out
            "step_time_median_s": ordered[len(ordered) // 2] if ordered else None,
            "peak_mem_mb": self._memory_peak(),
            "global_step": int(state.global_step),
            "best_dev": self._best_dev,
            "n_eval": self._n_eval,
        }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _roles(optimizer) -> dict[str, dict[str, Any]]:
    """`apply_recipe`'s groups by role (``body``, ``classifier``); {} for another optimizer."""
    groups = getattr(optimizer, "param_groups", None) or []
    return {g["role"]: g for g in groups if g.get("role")}


def _optimizer_facts(optimizer, scheduler, args, steps: int) -> dict[str, Any]:
    """The learning rates, weight decay and warm-up the run trained with: `make_optimizer`'s
    groups and schedule, else the optimizer's first group and the Trainer's settings."""
    roles = _roles(optimizer)
    groups = getattr(optimizer, "param_groups", None) or []
    rate = lambda group: float(group.get("initial_lr", group["lr"]))  # noqa: E731
    if roles:
        body = roles.get("body") or roles["classifier"]
        lr, classifier_lr = rate(body), rate(roles.get("classifier", body))
    else:
        lr = classifier_lr = rate(groups[0]) if groups else float(args.learning_rate)
    decay = max((float(g.get("weight_decay", 0.0)) for g in groups), default=args.weight_decay)
    if isinstance(getattr(scheduler, "fixed", None), bool):
        warmup, schedule = scheduler.lr_lambdas[0].warmup, "recipe"
    else:
        warmup = args.get_warmup_steps(steps) / steps if steps else 0.0
        schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    return {"from_recipe": bool(roles), "lr": lr, "classifier_lr": classifier_lr,
            "weight_decay": float(decay), "warmup": float(warmup), "schedule": schedule}  # fmt: skip


def _model_facts(model: nn.Module, recipe: dict[str, Any] | None) -> dict[str, Any]:
    """The model as it trains: its class and classifier, pooling, depth, what trains."""
    inner, base = _unwrapped(model), encoder_of(model)
    config = base.config
    tunescope = getattr(inner, "is_tunescope_classifier", False)
    labels = num_labels(model)
    classifier = "tunescope" if tunescope else "transformers" if labels is not None else None
    peft = next(iter((getattr(model, "peft_config", None) or {}).values()), None)
    kind = getattr(peft, "peft_type", None)
    blocks = _blocks(base, recipe["layers_module"] if recipe else None)
    named = list(base.named_parameters())
    params = list(model.parameters())
    return {
        "name": getattr(config, "_name_or_path", "") or type(inner).__name__,
        "class": type(inner).__name__,
        "classifier": classifier,
        "pooling": inner.pooling if tunescope else "first" if classifier else None,
        "peft_type": None if kind is None else str(getattr(kind, "value", kind)),
        "model_type": getattr(config, "model_type", None),
        "n_layers": len(blocks) if blocks is not None else None,
        "num_labels": labels,
        "dtype": str(params[0].dtype).removeprefix("torch.") if params else None,
        "names": [n for n, _ in named],
        "trained": [n for n, p in named if p.requires_grad],
        "n_trainable": count_trainable(model),
        "n_params": sum(p.numel() for p in params),
    }


def _autocast(args):
    """The Trainer's mixed precision for scoring the test set as ``trainer.predict`` would."""
    if not (args.bf16 or args.fp16) or torch.device(args.device).type != "cuda":
        return None
    dtype = torch.bfloat16 if args.bf16 else torch.float16
    return lambda: torch.autocast("cuda", dtype=dtype)
