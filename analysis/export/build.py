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

Schema (``format`` = ``tunescope-recipe``, ``version`` 3; layers are 1-based throughout, PEFT's
0-based indices are in adapter_config.json only): ``model`` {name, source (builtin, local or hub),
hub_id (a hub model's id; a built-in's where the hub has it), path (a local model's folder as it
was given), installed (where an environment holds a built-in: {package, folder} or {prefix}),
weights_sha256 (a built-in's weights file), fingerprint {sha256, dtype} (of the embeddings and
kept layers: `tunescope_recipe.weights_fingerprint`, checked on apply), family, model_type,
n_layers, n_heads, d_model, special_token_ids}; ``method``, ``description``; ``keep_layers``
(the classifier's layer: the layers above are deleted) and ``layers_module`` (the blocks' ModuleList
inside the base model); ``classifier`` {kind, pooling, layer, d_model, n_outputs, dropout, init_std,
hf_dense, hf_out, hf_modules}; ``train`` {params: whole tensors, masks: [{param, rows: [[start,
stop], …]}] (output rows of Q/K/V and their bias entries), adapters: {kind, size, init_std,
layers, sites} or null, peft: {peft_type, layers, adapter_config, n_trainable} or null,
embeddings, n_trainable_body, n_trainable_classifier, n_trainable, n_params}; ``optimizer`` {lr,
classifier_lr, weight_decay, betas, eps, max_grad_norm, warmup}; ``training`` {steps, batch_size,
max_length, seed, n_train}; ``provenance`` {tunescope_version, source, run_id, l_star, layers,
family, selection, config}. Version 2 named every model by ``path`` (a built-in's too: this
machine's folder); version 1 had ``lora`` (PEFT's LoRA settings, 0-based) where ``peft`` is, and
0-based adapter layers.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from analysis.export import tunescope_recipe
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import method_spec
from analysis.finetune.spec import Exported
from analysis.hf_names import hf_classifier
from analysis.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from analysis.models import LoadedModel, encoder_layers, resolve_source

FORMAT = tunescope_recipe.FORMAT
FORMAT_VERSION = tunescope_recipe.FORMAT_VERSION
MODULE_FILE = "tunescope_recipe.py"
PEFT_FILE = "adapter_config.json"
# The built-ins' names on the model hub (the hub's copies have the same weights file, SHA-256).
BUILTIN_HUB_IDS = {
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "mpnet": "sentence-transformers/all-mpnet-base-v2",
}


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


def model_identity(loaded: LoadedModel, layers_module: str, keep_layers: int) -> dict[str, Any]:
    """How recipe.json names the model so that another machine finds it (module docstring):
    a hub model by its id, a local folder as it was given, a built-in by its name, its hub id,
    where an environment holds it and its weights file's SHA-256; and every model by the
    fingerprint of the weights the recipe uses (`tunescope_recipe.weights_fingerprint`)."""
    source, kind = resolve_source(loaded.spec.name)
    fingerprint = tunescope_recipe.weights_fingerprint(
        loaded.model, layers_module=layers_module, keep_layers=keep_layers
    )
    builtin = kind == "builtin"
    weights = Path(source) / "model.safetensors"
    return {
        "name": loaded.name,
        "source": kind,
        "hub_id": BUILTIN_HUB_IDS.get(loaded.name)
        if builtin
        else source
        if kind == "hub"
        else None,
        "path": loaded.spec.name if kind == "local" else None,
        "installed": _installed_place(Path(source)) if builtin else None,
        "weights_sha256": _file_sha256(weights) if builtin and weights.is_file() else None,
        "fingerprint": fingerprint,
    }


def _installed_place(folder: Path) -> dict[str, str]:
    """Where an environment holds a built-in found at ``folder`` here, in terms that hold in
    another environment: inside an installed package ({package, folder}), else under the
    environment's prefix ({prefix}); {} when it is neither."""
    for parent in folder.parents:
        if (parent / "__init__.py").is_file() and not (parent.parent / "__init__.py").is_file():
            return {"package": parent.name, "folder": folder.relative_to(parent).as_posix()}
    try:
        return {"prefix": folder.relative_to(sys.prefix).as_posix()}
    except ValueError:
        return {}


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


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
    kept = model.n_layers_kept
    layers_module = _layers_module(model.encoder)
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": {
            **model_identity(loaded, layers_module, kept),
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
        "layers_module": layers_module,
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
    """The folder's README: what the recipe trains and the lines to paste (with ``num_labels``,
    the ``sys.path`` line and, for a PEFT recipe, PEFT's wrapping)."""
    model = recipe["model"]
    peft = recipe["train"].get("peft")
    keep, n_layers = recipe["keep_layers"], model["n_layers"]
    n_labels = recipe["classifier"]["n_outputs"]
    cut = f" (layers {keep + 1}–{n_layers} are removed)" if keep < n_layers else ""
    where = {"hub": f"hub id `{model.get('hub_id')}`", "local": f"folder `{model.get('path')}`",
             "builtin": f"tunescope's built-in, hub id `{model.get('hub_id')}`"}  # fmt: skip
    lines = [
        f"# tunescope recipe: {recipe['description']}",
        "",
        f"Model {model['name']} ({where.get(model.get('source'), 'as exported')}; "
        f"{model['family']}, {n_layers} layers); method `{recipe['method']}`; "
        f"{recipe['train']['n_trainable']:,} of {recipe['train']['n_params']:,} parameters "
        f"train; the classifier reads layer {keep}{cut}; {n_labels} "
        f"{'output (regression)' if n_labels == 1 else 'labels'}.",
        "",
        "Paste into your training script (torch and transformers only; tunescope need not be "
        "installed):",
        "",
        "```python",
        "import sys",
        "",
        f'sys.path.insert(0, "{folder}")  # the folder holding tunescope_recipe.py',
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer",
        "from tunescope_recipe import TunescopeCallback, load_recipe, make_optimizer, model_source",
        "",
        f'recipe = load_recipe("{folder}")',
        "tokenizer = AutoTokenizer.from_pretrained(model_source(recipe))",
        "model = AutoModelForSequenceClassification.from_pretrained(model_source(recipe), "
        f"num_labels={n_labels})",
    ]
    if peft:
        lines += [
            "from peft import PeftConfig, get_peft_model",
            "",
            f'model = get_peft_model(model, PeftConfig.from_pretrained("{folder}"))  '
            f"# {peft['peft_type']}",
        ]
    lines += [
        "trainer = Trainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,",
        "                  optimizers=make_optimizer(model, recipe),",
        "                  callbacks=[TunescopeCallback(recipe=recipe, test_dataset=test)])",
        "trainer.train()",
        "```",
        "",
        f"`num_labels={n_labels}`: the recipe was exported for that many classes; a model with "
        "another number, another family, depth or width, or other weights is refused with one "
        "`RecipeError` naming both. `make_optimizer` schedules the learning rate over the steps "
        "the Trainer runs (the callback fits it). `TunescopeCallback` writes a run folder "
        "(`OUTPUT_DIR/tunescope-runs/<id>/`: what ran, losses, evaluations, test predictions, "
        "timings); `tunescope runs import OUTPUT_DIR`, or the Runs page, brings it into "
        "tunescope's runs database.",
        "",
    ]
    if not peft:
        lines += [
            "`TunescopeClassifier.from_pretrained(recipe)` instead of the "
            "`AutoModelForSequenceClassification` is tunescope's own model (its pooled "
            "classifier, the same start at the same seed); the transformers model trains the same "
            "parameters with its own classifier (first-token pooling).",
            "",
        ]
    lines += [
        "`apply_recipe(model, recipe)` returns AdamW parameter groups for your own loop.",
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
    its `Run` record); an unknown id, or a config that no longer loads, is a ValueError naming
    the run."""
    from analysis.runs.db import RunsDB
    from analysis.runs.record import Run

    db = db if db is not None else RunsDB()
    run = Run.from_row(db.get_run(run_id))
    stored = {k: v for k, v in run.stored.items() if k != "origin"}  # an imported run's
    try:
        cfg = FinetuneConfig.from_dict(stored)
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
