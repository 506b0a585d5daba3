"""Apply a tunescope recipe to your own model: torch and transformers only, no tunescope import.

tunescope copies this file into every exported recipe folder. Three lines in your training script::

    recipe = load_recipe("recipe/")                    # recipe.json beside this file
    model = TunescopeClassifier.from_pretrained(recipe)  # or your AutoModelForSequenceClassification
    optimizers = make_optimizer(model, recipe)         # Trainer(..., optimizers=optimizers)

`apply_recipe(model, recipe)` does the work and returns AdamW parameter groups for your own loop:

1. truncate: the layers above the classifier's layer ℓ_head are deleted (``num_hidden_layers`` /
   ``n_layers`` updated);
2. insert the modules the recipe adds (``train.adapters``: Houlsby adapters);
3. freeze everything (``requires_grad_(False)``), then unfreeze exactly the recipe's tensors and
   the classifier; a name that matches nothing, or a trainable count that differs from the
   recipe's, is an error (never a silent no-op);
4. partly trained tensors (``train.masks``: the Q/K/V rows of chosen heads): a gradient hook
   zeroes every other row's gradient as it is computed, so before any clipping; those tensors go
   into the weight-decay-0 group, so AdamW leaves their frozen entries bit-identical (zero
   gradient → zero moments → zero update).

PEFT recipes (``train.peft``: LoRA, IA³…): wrap the model with PEFT first (``get_peft_model(model,
PeftConfig.from_pretrained("recipe/"))``, the folder's adapter_config.json); `apply_recipe` then
only truncates, checks what PEFT made trainable and returns the groups.

Layers are 1-based in recipe.json (version 2; a version-1 recipe, with 0-based adapter layers and
its PEFT settings under ``lora``, is read too).

The classifier. tunescope trains a fresh classifier on the pooled states of layer ℓ_head: dropout →
dense (d → d) → tanh → dropout → linear (d → C), pooled as the mean of the real, non-special tokens
(or the first token). `TunescopeClassifier` is exactly that model (same initialisation at the same
seed), so a run reproduces tunescope's numbers. A transformers ``AutoModelForSequenceClassification``
has its own classifier of the same size (a d × d dense layer and a d × C output in all six families), so
the same parameters train and the same count, but it pools the first token and its activation and
dropout differ per family (BERT's pooler has no dropout before it, DistilBERT uses ReLU, ELECTRA and
DeBERTa GELU): expect similar, not identical, scores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = "tunescope-recipe"
FORMAT_VERSION = 2


class RecipeError(ValueError):
    """A recipe that does not fit the model it is applied to, or cannot be applied here."""


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
    """A version-1 recipe in version 2's terms: 1-based adapter layers, ``peft`` for ``lora``."""
    if int(recipe.get("version", 1)) >= 2:
        return recipe
    train = recipe["train"]
    if train.get("adapters"):
        train["adapters"] = {
            **train["adapters"],
            "layers": [i + 1 for i in train["adapters"]["layers"]],
        }
    lora = train.pop("lora", None)
    if lora:
        train["peft"] = {"peft_type": "LORA", "adapter_config": lora["adapter_config"],
                         "layers": [i + 1 for i in lora["layers_to_transform"]]}  # fmt: skip
    recipe["version"] = 2
    return recipe


# -- the model -------------------------------------------------------------------------------------


class ClassifierHead(nn.Module):
    """dropout → dense → tanh → dropout → linear (tunescope's fresh classifier)."""

    def __init__(self, d_model: int, n_outputs: int, dropout: float, init_std: float = 0.02):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, n_outputs)
        for linear in (self.dense, self.out):
            nn.init.normal_(linear.weight, std=init_std)
            nn.init.zeros_(linear.bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # (B, d) -> (B, C)
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(pooled)))))


class TunescopeClassifier(nn.Module):
    """An encoder (``transformers.AutoModel``) and tunescope's classifier on its pooled states.

    ``forward`` takes what a tokenizer and ``DataCollatorWithPadding`` give (input_ids,
    attention_mask, token_type_ids, special_tokens_mask, labels) and returns a
    ``SequenceClassifierOutput`` (loss when ``labels`` is given), so ``Trainer`` trains it as is.
    """

    def __init__(self, encoder: nn.Module, recipe: dict[str, Any]) -> None:
        super().__init__()
        spec = recipe["classifier"]
        self.encoder = encoder
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # unused: the classifier reads the pooled token states
        self.pooling = spec["pooling"]
        self.n_outputs = int(spec["n_outputs"])
        self.special_ids = [int(i) for i in recipe["model"].get("special_token_ids", [])]
        self.classifier = ClassifierHead(
            int(spec["d_model"]), self.n_outputs, float(spec["dropout"]), float(spec["init_std"])
        )

    @classmethod
    def from_pretrained(
        cls, recipe: dict[str, Any], path: str | Path | None = None, seed: int | None = None
    ) -> TunescopeClassifier:
        """Load the encoder (``path``, default the recipe's model path), seed torch with the
        recipe's seed and build the classifier: the same initial classifier as tunescope's run."""
        from transformers import AutoModel

        source = path or recipe["model"].get("path") or recipe["model"]["name"]
        encoder = AutoModel.from_pretrained(str(source))
        torch.manual_seed(recipe["training"]["seed"] if seed is None else seed)
        return cls(encoder, recipe)

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
                special_tokens_mask = torch.isin(input_ids, torch.tensor(self.special_ids))
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
    import inspect

    return set(inspect.signature(type(module).forward).parameters)


# -- applying the recipe ---------------------------------------------------------------------------


def _base(model: nn.Module) -> nn.Module:
    """The encoder inside ``model`` (a TunescopeClassifier, an HF model with a classifier, a PEFT model)."""
    if hasattr(model, "peft_config"):  # PeftModel → its transformers model
        model = model.get_base_model()
    if isinstance(model, TunescopeClassifier):
        return model.encoder
    base = getattr(model, "base_model", model)
    return base if isinstance(base, nn.Module) else model


def _module(root: nn.Module, path: str) -> nn.Module:
    try:
        return root.get_submodule(path)
    except AttributeError:
        raise RecipeError(f"The model has no module {path!r}: is it the recipe's model?") from None


def _classifier_modules(model: nn.Module, recipe: dict[str, Any]) -> list[nn.Module]:
    """The classifier's modules: TunescopeClassifier's own, or the HF model's."""
    if hasattr(model, "peft_config"):
        return []  # PEFT's modules_to_save copies of the classifier train; PEFT set them up
    if isinstance(model, TunescopeClassifier):
        return [model.classifier]
    names = recipe["classifier"]["hf_modules"]
    found = [m for name in names if (m := _maybe_module(model, name)) is not None]
    if not found:
        return []  # a bare encoder: no classifier to train
    if len(found) != len(names):
        raise RecipeError(f"The model has only some of the classifier modules {names}.")
    return found


def _maybe_module(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def check_model(model: nn.Module, recipe: dict[str, Any]) -> None:
    """A RecipeError unless ``model`` is of the recipe's family and shape."""
    config = getattr(_base(model), "config", None)
    want = recipe["model"]
    if config is None:
        raise RecipeError("apply_recipe needs a transformers model (one with a .config).")
    model_type = getattr(config, "model_type", None)
    if model_type != want["model_type"]:
        raise RecipeError(
            f"This recipe is for a {want['model_type']} model ({want['name']}); "
            f"this one is {model_type}."
        )
    d_model = getattr(config, "hidden_size", None) or getattr(config, "dim", None)
    if d_model != want["d_model"]:
        raise RecipeError(
            f"This recipe is for d_model = {want['d_model']} ({want['name']}); this model has "
            f"{d_model}."
        )
    layers = _module(_base(model), recipe["layers_module"])
    if len(layers) not in (want["n_layers"], recipe["keep_layers"]):
        raise RecipeError(
            f"This recipe is for a {want['n_layers']}-layer model; this one has {len(layers)}."
        )


def truncate(model: nn.Module, recipe: dict[str, Any]) -> None:
    """Delete the layers above ℓ_head and update the config (idempotent)."""
    base = _base(model)
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
    layers = _module(_base(model), recipe["layers_module"])
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


def apply_recipe(
    model: nn.Module,
    recipe: dict[str, Any],
    *,
    lr: float | None = None,
    classifier_lr: float | None = None,
    weight_decay: float | None = None,
) -> list[dict[str, Any]]:
    """Truncate, add adapters, freeze, unfreeze and mask as the recipe says (module docstring);
    returns AdamW parameter groups (body / classifier × decay / no decay) for
    ``torch.optim.AdamW(groups)`` in your own loop, or `make_optimizer` for ``Trainer(optimizers=…)``."""
    check_model(model, recipe)
    train = recipe["train"]
    opt = recipe["optimizer"]
    lr = opt["lr"] if lr is None else lr
    classifier_lr = opt["classifier_lr"] if classifier_lr is None else classifier_lr
    weight_decay = opt["weight_decay"] if weight_decay is None else weight_decay
    truncate(model, recipe)
    base = _base(model)
    masked: dict[int, torch.Tensor] = {}
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
            masked[id(param)] = mask
            body.append(param)
        classifier = [p for m in _classifier_modules(model, recipe) for p in m.parameters()]
        for param in classifier:
            param.requires_grad_(True)
    n_body = sum(int(masked[id(p)].sum()) if id(p) in masked else p.numel() for p in body)
    if n_body != train["n_trainable_body"]:
        raise RecipeError(
            f"The recipe trains {train['n_trainable_body']:,} encoder entries; on this model it "
            f"found {n_body:,}: the model is not the recipe's model."
        )
    groups = []
    for params, rate in ((body, lr), (classifier, classifier_lr)):
        decay = [p for p in params if p.ndim >= 2 and id(p) not in masked]
        no_decay = [p for p in params if p.ndim < 2 or id(p) in masked]
        groups.append({"params": decay, "weight_decay": weight_decay, "lr": rate})
        groups.append({"params": no_decay, "weight_decay": 0.0, "lr": rate})
    return [g for g in groups if g["params"]]


def _parameter(root: nn.Module, name: str) -> nn.Parameter:
    try:
        return root.get_parameter(name)
    except AttributeError:
        raise RecipeError(
            f"The model has no parameter {name!r}: the recipe is for another model or family."
        ) from None


# -- optimizer and schedule ------------------------------------------------------------------------


def lr_factor(steps: int, warmup_steps: int):
    """tunescope's schedule: linear warm-up over ``warmup_steps`` updates to the full rate, then
    linear decay (the i-th update, 0-based, uses factor min((i + 1) / warmup, (steps − i) /
    (steps − warmup)))."""

    def factor(i: int) -> float:
        k = i + 1
        decay = (steps - k + 1) / max(steps - warmup_steps, 1)
        return min(k / warmup_steps, decay) if warmup_steps else decay

    return factor


def make_optimizer(model: nn.Module, recipe: dict[str, Any], steps: int | None = None, **rates):
    """`apply_recipe`, then AdamW over its groups (torch's fused kernel where it can) and the
    recipe's schedule: ``(optimizer, scheduler)``, what ``Trainer(optimizers=…)`` takes."""
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
    steps = steps or recipe["training"]["steps"]
    warmup_steps = round(opt["warmup"] * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(steps, warmup_steps))
    return optimizer, scheduler


def tunescope_batches(n_examples: int, batch_size: int, seed: int, steps: int) -> list[list[int]]:
    """The rows of tunescope's first ``steps`` batches (a fresh numpy permutation each epoch,
    the last short batch kept): to feed a loop the very batches a tunescope run saw."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    while len(out) < steps:
        perm = rng.permutation(n_examples)
        for start in range(0, n_examples, batch_size):
            out.append(perm[start : start + batch_size].tolist())
            if len(out) == steps:
                break
    return out


def replay_randomness_callback():
    """A ``TrainerCallback`` that restores torch's random state, as it is when this is called,
    right before the first training step: ``Trainer`` re-seeds and its DataLoader draws a number
    when it starts, so without it dropout draws differ from a tunescope run at the same seed.
    Create it after building the model and applying the recipe, before the ``Trainer``."""
    from transformers import TrainerCallback

    state = torch.get_rng_state()

    class ReplayRandomness(TrainerCallback):
        def on_step_begin(self, args, trainer_state, control, **kwargs):
            if trainer_state.global_step == 0:
                torch.set_rng_state(state)

    return ReplayRandomness()
