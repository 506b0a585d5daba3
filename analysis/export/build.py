"""A recommendation or a run as a recipe for the user's own training (``recipe.json`` and friends).

`build_recipe(cfg, loaded, n_outputs, provenance)` prepares the very model a tunescope run of
``cfg`` trains (`analysis.finetune.engine.build_model`, on the CPU) and reads off it what trains:
every encoder tensor with ``requires_grad`` (by its transformers name, relative to the base
model), the rows the gradient masks keep (partly trained tensors), and what the method's export
hook (`analysis.finetune.spec.Exported`) adds: a PEFT config or the modules to insert; then the
classifier (`analysis.hf_names`), the learning rates and the budget. So the recipe says what
tunescope does, not what a second copy of its rules says.

`write_recipe(recipe, folder)` writes the folder a user takes home: ``recipe.json`` (schema
below), ``tunescope_recipe.py`` (torch + transformers only: ``apply_recipe``), a ``README.md``
with the lines to paste, and the recipe's ``files``: a PEFT config as PEFT's own
``adapter_config.json`` (``save_pretrained``).

Schema (``format`` = ``tunescope-recipe``, ``version`` 2; layers are 1-based throughout, PEFT's
0-based indices are in adapter_config.json only): ``model`` {name, path, family, model_type,
n_layers, n_heads, d_model, special_token_ids}; ``method``, ``description``; ``keep_layers``
(ℓ_head: the layers above are deleted) and ``layers_module`` (the blocks' ModuleList inside the
base model); ``classifier`` {kind, pooling, layer, d_model, n_outputs, dropout, init_std,
hf_dense, hf_out, hf_modules}; ``train`` {params: whole tensors, masks: [{param, rows: [[start,
stop], …]}] (output rows of Q/K/V and their bias entries), adapters: {kind, size, init_std,
layers, sites} or null, peft: {peft_type, layers, adapter_config, n_trainable} or null,
embeddings, n_trainable_body, n_trainable_classifier, n_trainable, n_params}; ``optimizer`` {lr,
classifier_lr, weight_decay, betas, eps, max_grad_norm, warmup}; ``training`` {steps, batch_size,
max_length, seed, n_train}; ``provenance`` {tunescope_version, source, run_id, l_star, layers,
family, selection, config}. Version 1 (before) had ``lora`` (PEFT's LoRA settings, 0-based) where
``peft`` is, and 0-based adapter layers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_spec
from analysis.finetune.spec import Exported
from analysis.hf_names import hf_classifier
from analysis.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from analysis.models import LoadedModel, encoder_layers, resolve_source

FORMAT = "tunescope-recipe"
FORMAT_VERSION = 2
MODULE_FILE = "tunescope_recipe.py"
PEFT_FILE = "adapter_config.json"


def tunescope_version() -> str:
    """The installed tunescope's version (its package metadata), "unknown" without one."""
    try:
        return importlib.metadata.version("tunescope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _row_ranges(mask: torch.Tensor) -> list[list[int]]:
    """[[start, stop), …] of the output rows a (rows, cols) or (rows,) mask keeps; a ValueError
    when it is not whole rows (nothing else is an attention head)."""
    rows = mask.any(dim=1) if mask.ndim == 2 else mask
    if mask.ndim == 2 and not torch.equal(mask, rows[:, None].expand_as(mask)):
        raise ValueError("A gradient mask that is not whole rows cannot be exported.")
    ranges: list[list[int]] = []
    for index in torch.nonzero(rows).flatten().tolist():
        if ranges and ranges[-1][1] == index:
            ranges[-1][1] = index + 1
        else:
            ranges.append([index, index + 1])
    return ranges


def _layers_module(encoder: torch.nn.Module) -> str:
    blocks = encoder_layers(encoder)
    for name, module in encoder.named_modules():
        if module is blocks:
            return name
    raise ValueError("Cannot find the encoder's layer list.")


def _special_ids(tokenizer) -> list[int]:
    names = ("cls_token_id", "sep_token_id", "pad_token_id", "bos_token_id", "eos_token_id")
    return sorted({i for n in names if (i := getattr(tokenizer, n, None)) is not None})


def method_export(cfg: FinetuneConfig, loaded: LoadedModel) -> Exported:
    """What the method adds to the recipe (its spec's export hook: `MethodSpec`), or a
    ValueError saying why the method cannot be exported. Needs no built model, so a refusal
    comes before any is built."""
    spec = method_spec(cfg.method)
    if spec.export is None:
        raise ValueError(
            f"Method {cfg.method!r} cannot be exported: it declares no export (its spec's "
            "export hook is None)."
        )
    try:
        exported = spec.export(cfg, loaded)
    except ValueError as exc:
        reason = str(exc).rstrip(".")
        raise ValueError(f"Method {cfg.method!r} cannot be exported: {reason}.") from None
    if not isinstance(exported, Exported):
        raise TypeError(
            f"Method {cfg.method!r}'s export hook returned {type(exported).__name__}, not an "
            "Exported (analysis.finetune.spec)."
        )
    return exported


def _peft_made(encoder: torch.nn.Module) -> set[int]:
    """The ids of the parameters PEFT added to ``encoder`` (its tuner layers' adapter weights:
    LoRA's A and B, IA³'s vectors…); PEFT creates and names them on the user's side too."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    made: set[int] = set()
    for module in encoder.modules():
        if isinstance(module, BaseTunerLayer):
            for name in module.adapter_layer_names:
                made |= {id(p) for p in getattr(module, name).parameters()}
    return made


def _peft_part(exported: Exported) -> dict[str, Any] | None:
    """recipe.json's ``train.peft``: the PEFT method, its 1-based layers and its file."""
    if exported.peft is None:
        return None
    kind = exported.peft.peft_type
    return {
        "peft_type": str(getattr(kind, "value", kind)),
        "layers": list(exported.layers),
        "adapter_config": PEFT_FILE,
        "n_trainable": exported.n_trainable,
    }


def build_recipe(
    cfg: FinetuneConfig,
    loaded: LoadedModel,
    n_outputs: int,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The recipe of ``cfg`` on ``loaded`` (module docstring); a ValueError for what cannot be
    expressed (subspace methods, a zero-weights run, a family without a mapping). The recipe's
    ``files`` (not part of recipe.json) hold the PEFT config `write_recipe` saves."""
    from analysis.finetune.engine import build_model

    classifier_names = hf_classifier(loaded.model_family)
    if cfg.zero_weights:
        raise ValueError(
            "A run on zeroed weights (the disable experiment) cannot be exported: its starting "
            "model is not the checkpoint a user loads."
        )
    cfg.check_model(loaded.n_layers, loaded.n_heads)
    exported = method_export(cfg, loaded)  # a refusal comes before any model is built
    built = build_model(cfg, loaded, n_outputs, device="cpu")
    model = built.model
    masks = {id(p): m for p, m in built.prepared.grad_masks.items()}
    peft_made = _peft_made(model.encoder) if exported.peft is not None else set()
    params: list[str] = []
    masked: list[dict[str, Any]] = []
    n_body = 0
    for name, param in model.encoder.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in masks:
            n_body += int(masks[id(param)].sum())
            masked.append({"param": name, "rows": _row_ranges(masks[id(param)])})
            continue
        n_body += param.numel()
        if id(param) not in peft_made:
            params.append(name)
    n_classifier = sum(p.numel() for p in model.classifier.parameters() if p.requires_grad)
    if n_body + n_classifier != built.n_trainable:
        raise RuntimeError("The recipe's trainable count differs from the prepared model's.")
    if exported.n_trainable is not None and exported.n_trainable != n_body:
        raise RuntimeError(
            f"Method {cfg.method!r}'s export counts {exported.n_trainable:,} trainable entries; "
            f"the prepared model trains {n_body:,}."
        )
    source, kind = resolve_source(loaded.spec.name)
    kept = model.n_layers_kept
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": {
            "name": loaded.name,
            "path": source if kind != "hub" else None,
            "family": loaded.model_family,
            "model_type": loaded.model.config.model_type,
            "n_layers": loaded.n_layers,
            "n_heads": loaded.n_heads,
            "d_model": loaded.d_model,
            "special_token_ids": _special_ids(loaded.tokenizer),
        },
        "method": cfg.method,
        "description": built.prepared.description,
        "keep_layers": kept,
        "layers_module": _layers_module(model.encoder),
        "classifier": {
            "kind": "dropout-dense-tanh-dropout-linear",
            "pooling": cfg.pooling,
            "layer": kept,
            "d_model": model.d_model,
            "n_outputs": n_outputs,
            "dropout": model.classifier.dropout.p,
            "init_std": 0.02,
            "hf_dense": classifier_names["dense"],
            "hf_out": classifier_names["out"],
            "hf_modules": classifier_names["modules"],
        },
        "train": {
            "params": params,
            "masks": masked,
            "adapters": exported.adapters.to_json() if exported.adapters is not None else None,
            "peft": _peft_part(exported),
            "embeddings": any(n.startswith("embeddings.") for n in params),
            "n_trainable_body": n_body,
            "n_trainable_classifier": n_classifier,
            "n_trainable": built.n_trainable,
            "n_params": built.n_params,
        },
        "optimizer": {
            "name": "adamw",
            "lr": cfg.lr,
            "classifier_lr": cfg.classifier_lr,
            "weight_decay": cfg.weight_decay,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "max_grad_norm": 1.0,
            "warmup": cfg.warmup,
            "schedule": "linear warm-up to the full rate, then linear decay",
        },
        "training": {
            "steps": cfg.steps,
            "batch_size": cfg.batch_size,
            "max_length": cfg.max_length,
            "seed": cfg.seed,
            "n_train": cfg.n_train,
        },
        "provenance": {
            "tunescope_version": tunescope_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(provenance or {}),
            "config": cfg.to_dict(),
        },
        "files": {PEFT_FILE: exported.peft} if exported.peft is not None else {},
    }


def readme_text(recipe: dict[str, Any], folder: str = "THIS_FOLDER") -> str:
    model = recipe["model"]
    source = model.get("path") or model["name"]
    peft = recipe["train"].get("peft")
    lines = [
        f"# tunescope recipe: {recipe['description']}",
        "",
        f"Model {model['name']} ({model['family']}, {model['n_layers']} layers); method "
        f"`{recipe['method']}`; {recipe['train']['n_trainable']:,} of "
        f"{recipe['train']['n_params']:,} parameters train; the classifier reads layer "
        f"{recipe['keep_layers']} (the layers above it are removed).",
        "",
        "Paste into your training script (this folder beside it, or on `sys.path`):",
        "",
        "```python",
        "from tunescope_recipe import load_recipe, TunescopeClassifier, make_optimizer",
        f'recipe = load_recipe("{folder}")',
    ]
    if peft:
        lines += [
            "from peft import PeftConfig, get_peft_model",
            f'model = get_peft_model(AutoModelForSequenceClassification.from_pretrained("{source}",'
            f" num_labels={recipe['classifier']['n_outputs']}), "
            f'PeftConfig.from_pretrained("{folder}"))  # {peft["peft_type"]}',
        ]
    else:
        lines.append("model = TunescopeClassifier.from_pretrained(recipe)  # or your own HF model")
    lines += [
        "trainer = Trainer(model=model, args=args, train_dataset=..., "
        "optimizers=make_optimizer(model, recipe))",
        "```",
        "",
        "`TunescopeClassifier` is tunescope's model (its pooled classifier, same start at the "
        "same seed); an `AutoModelForSequenceClassification` trains the same parameters with "
        "its own classifier (first-token pooling). `apply_recipe(model, recipe)` returns AdamW "
        "parameter groups for your own loop. Add `TunescopeCallback` (tunescope's "
        "`analysis.runs.callback`) to record the run in tunescope's runs database.",
        "",
    ]
    return "\n".join(lines)


def write_recipe(
    recipe: dict[str, Any], folder: Path | str, shown_as: str | None = None
) -> list[Path]:
    """Write the recipe folder (each file atomically); returns the files written. ``shown_as``:
    the folder's name in its README (default: its path)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is a file; give a folder.")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, config in recipe.get("files", {}).items():
        with tempfile.TemporaryDirectory() as tmp:
            config.save_pretrained(tmp)
            data = (Path(tmp) / name).read_bytes()
        written.append(atomic_write_bytes(folder / name, data))
    module = importlib.resources.files("analysis.export") / MODULE_FILE
    written.append(atomic_write_text(folder / MODULE_FILE, module.read_text(encoding="utf-8")))
    written.append(
        atomic_write_text(folder / "README.md", readme_text(recipe, shown_as or str(folder)))
    )
    written.append(atomic_write_json(folder / "recipe.json", recipe_document(recipe), indent=1))
    return written


def recipe_document(recipe: dict[str, Any]) -> dict[str, Any]:
    """recipe.json's content: the recipe without its ``files`` (written beside it)."""
    return {key: value for key, value in recipe.items() if key != "files"}


def recipe_json(recipe: dict[str, Any]) -> str:
    return json.dumps(recipe_document(recipe), indent=1, sort_keys=False)


def n_outputs_of(cfg: FinetuneConfig) -> int:
    """C of the config's task (1 for regression), from its data."""
    from analysis.data import load_data

    data = load_data(cfg.data)
    return 1 if data.task_type == "regression" else data.n_classes


def make_recipe(
    cfg: FinetuneConfig,
    provenance: dict[str, Any] | None = None,
    loaded: LoadedModel | None = None,
    n_outputs: int | None = None,
) -> dict[str, Any]:
    """`build_recipe` with the model and the task's class count loaded when not given."""
    from analysis.models import load_model

    loaded = loaded if loaded is not None else load_model(cfg.model, device="cpu")
    n_outputs = n_outputs if n_outputs is not None else n_outputs_of(cfg)
    return build_recipe(cfg, loaded, n_outputs, provenance)


def run_source(run_id: str, db=None) -> tuple[FinetuneConfig, dict[str, Any]]:
    """(config, provenance) of a stored run (the one place the export reads the runs database:
    its `Run` record, the config migrated as every stored config is); an unknown id, or a config
    that no longer loads, is a ValueError naming the run."""
    from analysis.runs.db import RunsDB
    from analysis.runs.record import Run, migrate_config

    db = db if db is not None else RunsDB()
    run = Run.from_row(db.get_run(run_id))
    stored = {k: v for k, v in run.stored.items() if k != "origin"}  # an imported run's
    try:
        cfg = FinetuneConfig.from_dict(migrate_config(stored))
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"Run {run.id}'s config no longer loads, so it cannot be exported: {exc}"
        ) from None
    result = run.result or {}
    provenance = {
        "source": "run",
        "run_id": run.id,
        "run_status": run.status,
        "family": run.family,
        "score": result.get("score"),
        "metric": result.get("metric"),
        "n_trainable_run": result.get("n_trainable"),
        "selection": selection_settings(cfg),
    }
    return cfg, provenance


def selection_settings(cfg: FinetuneConfig) -> dict[str, Any] | None:
    """Where the config's head selection came from (its settings: selector, k…), if it has one."""
    selection = cfg.option("heads")
    return dict(selection.settings) or None if selection is not None else None


def recipe_zip(recipe: dict[str, Any]) -> bytes:
    """The recipe folder as a zip archive (the pages' download button)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        files = write_recipe(recipe, Path(tmp) / "recipe", shown_as="recipe")
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in files:
                archive.write(file, f"recipe/{file.name}")
    return buffer.getvalue()
