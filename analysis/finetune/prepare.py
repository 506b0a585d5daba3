"""Running a method's preparer, and the freezing helpers the preparers share.

A preparer (``MethodSpec.prepare``: ``prepare(model, cfg, inputs) -> Prepared``) may add modules
to the model (adapters, LoRA), sets ``requires_grad`` on exactly the parameters that train, and
returns a `Prepared` (`analysis.finetune.prepared`): the optimizer's parameter groups and, for
partly trained tensors, gradient masks. ``inputs`` carries what a method needs besides the model
and the config (the subspace methods' trajectory).

Whatever a preparer draws comes from the method stream of the run's seed (`analysis.seeding`):
its own choices from generators of ``Stream(cfg.seed, "method")``, the initialisers that use the
global generators (PEFT's LoRA, ``nn.init``) from those generators, seeded from that stream
first. So a method's draws never shift the classifier's weights, the batches or dropout.

The classifier always trains. Embeddings and LayerNorms stay frozen unless the method says so.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from analysis.finetune.config import FinetuneConfig
from analysis.finetune.model import EncoderClassifier
from analysis.finetune.prepared import MethodInputs, Prepared
from analysis.finetune.registry import method_spec
from analysis.models import embeddings
from analysis.seeding import Stream


def train_only(model: EncoderClassifier, params: Iterable[nn.Parameter]) -> None:
    """Freeze everything, then unfreeze ``params`` and the classifier."""
    model.requires_grad_(False)
    for param in params:
        param.requires_grad_(True)
    model.classifier.requires_grad_(True)


def blocks(model: EncoderClassifier, layers: Iterable[int]) -> list[nn.Module]:
    """The kept layers' modules, by 1-based layer number."""
    return [model.layers[layer - 1] for layer in layers]


def prepare_method(
    model: EncoderClassifier, cfg: FinetuneConfig, inputs: MethodInputs | None = None
) -> Prepared:
    """Run the preparer of ``cfg.method`` on ``model`` (in place) and return what it trains,
    its draws from the method stream of ``cfg.seed`` (module docstring)."""
    Stream(cfg.seed, "method").seed_globals()
    prepared = method_spec(cfg.method).prepare(model, cfg, inputs or MethodInputs())
    if not isinstance(prepared, Prepared):
        raise TypeError(f"The preparer of {cfg.method!r} returned {type(prepared).__name__}.")
    return prepared


def trainable_layers(model: EncoderClassifier) -> tuple[int, ...]:
    """1-based kept layers with at least one trainable parameter."""
    return tuple(
        i + 1
        for i, block in enumerate(model.layers)
        if any(p.requires_grad for p in block.parameters())
    )


def embeddings_train(model: EncoderClassifier) -> bool:
    return any(p.requires_grad for p in embeddings(model.encoder).parameters())
