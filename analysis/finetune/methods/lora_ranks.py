"""Method ``lora-ranks``: LoRA on query and value with a rank of its own in each chosen layer (PEFT's
``rank_pattern`` / ``alpha_pattern``), as the recommendation allocates it from the layer metrics
(docs/explanation/recommendation.md, "The LoRA allocation").

Layer ℓ gets rank r_ℓ and scale numerator alpha_ℓ = alpha · r_ℓ / r, so every layer's update
ΔW = (alpha_ℓ / r_ℓ) · B A has the scale alpha / r of a uniform LoRA of rank r: a layer with more
rank gets more directions, not a larger step. `lora_settings` is the one mapping from ranks to
PEFT's settings: the preparer, the recommendation's exported ``LoraConfig`` and the tests use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis.config import setting
from analysis.finetune.spec import MethodSpec, at_head, is_int, is_number, refuse_export


def parse_ranks(text: str) -> tuple[tuple[int, int], ...]:
    """``"3:4, 4:8"`` → ((3, 4), (4, 8)): (1-based layer, rank) pairs, sorted by layer; a
    ValueError naming what is wrong."""
    pairs = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        layer, sep, rank = part.partition(":")
        try:
            pair = (int(layer), int(rank))
        except ValueError:
            pair = None
        if not sep or pair is None:
            raise ValueError(f"ranks_pattern takes layer:rank pairs, e.g. 3:4,4:8 (got {part!r}).")
        if pair[0] < 1 or pair[1] < 1:
            raise ValueError(
                f"ranks_pattern: layers are numbered from 1 and ranks are ≥ 1 (got {part!r})."
            )
        pairs.append(pair)
    if not pairs:
        raise ValueError("ranks_pattern is empty: give layer:rank pairs, e.g. 3:4,4:8.")
    layers = [layer for layer, _ in pairs]
    if len(set(layers)) != len(layers):
        raise ValueError(f"ranks_pattern names a layer twice ({text!r}).")
    return tuple(sorted(pairs))


def ranks_text(ranks: Mapping[int, int] | tuple[tuple[int, int], ...]) -> str:
    """(layer, rank) pairs as ``ranks_pattern`` stores them: ``"3:4,4:8"``."""
    items = ranks.items() if isinstance(ranks, Mapping) else ranks
    return ",".join(f"{layer}:{rank}" for layer, rank in sorted(items))


@dataclass(frozen=True)
class LoraRanksOptions:
    """Method ``lora-ranks``: LoRA on query and value, a rank per layer (PEFT rank_pattern)."""

    ranks: str = setting(
        help="layer:rank pairs, e.g. 3:4,4:8,5:4: LoRA on query and value of these layers, "
        "each with its own rank", flat="ranks_pattern", kind="text",
    )  # fmt: skip
    r: int = setting(
        8, help="the reference rank r: layer ℓ's alpha is alpha · r_ℓ / r, so every layer "
        "updates at the scale alpha / r", flat="ranks_r", kind="int",
    )  # fmt: skip
    alpha: float = setting(
        16, help="LoRA scale numerator of the reference rank: ΔW = (alpha / r) · B A",
        flat="ranks_alpha", kind="float",
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", ranks_text(parse_ranks(self.ranks)))
        if not is_int(self.r) or self.r < 1:
            raise ValueError(f"ranks_r must be a positive whole number (got {self.r!r}).")
        if not is_number(self.alpha) or not self.alpha > 0:
            raise ValueError(f"ranks_alpha must be positive (got {self.alpha!r}).")

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        return parse_ranks(self.ranks)

    def layers_used(self) -> tuple[int, ...]:
        return tuple(layer for layer, _ in self.pairs)


def lora_settings(
    pairs: tuple[tuple[int, int], ...], r: int, alpha: float, family: str
) -> dict[str, Any]:
    """PEFT ``LoraConfig`` keyword arguments for LoRA of rank r_ℓ on query and value of each
    (layer ℓ, r_ℓ) in ``pairs``: ``layers_to_transform`` (0-based), ``rank_pattern`` and
    ``alpha_pattern`` keyed by each module's name below the encoder (``layer.3.attention.self.query``,
    which PEFT matches as a suffix of the full name, in the bare encoder and in an
    ``AutoModelForSequenceClassification`` alike) with alpha_ℓ = alpha · r_ℓ / r."""
    from analysis.models import LAYER_PARTS

    parts = LAYER_PARTS[family]
    targets = [parts["query"].rsplit(".", 1)[-1], parts["value"].rsplit(".", 1)[-1]]
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    for layer, rank in pairs:
        for part in ("query", "value"):
            key = f"layer.{layer - 1}.{parts[part]}"
            rank_pattern[key] = rank
            alpha_pattern[key] = alpha * rank / r
    return {
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets,
        "layers_to_transform": [layer - 1 for layer, _ in pairs],
        "layers_pattern": "layer",
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
    }


def prepare(model, cfg, inputs):
    """PEFT's LoRA with a rank per layer, injected in place as method ``lora`` does."""
    from peft import LoraConfig, inject_adapter_in_model

    from analysis.finetune.prepare import train_only
    from analysis.finetune.prepared import Prepared

    options = cfg.options_for(LoraRanksOptions)
    pairs = options.pairs
    if max(layer for layer, _ in pairs) > model.n_layers_kept:
        raise ValueError(
            f"ranks_pattern uses layer {max(layer for layer, _ in pairs)}, but the model keeps "
            f"{model.n_layers_kept}."
        )
    settings = lora_settings(pairs, options.r, options.alpha, model.model_family)
    inject_adapter_in_model(LoraConfig(**settings), model.encoder)
    lora = [p for name, p in model.encoder.named_parameters() if ".lora_" in name]
    if len(lora) != 4 * len(pairs):
        raise RuntimeError(
            f"LoRA landed on {len(lora) // 2} modules, expected {2 * len(pairs)} (query and value "
            f"of layers {', '.join(str(layer) for layer, _ in pairs)})."
        )
    train_only(model, lora)
    return Prepared.from_model(
        model,
        f"LoRA ranks {options.ranks} (layer:rank; alpha {options.alpha:g} · r_ℓ / {options.r}) "
        "on query and value, and the classifier",
    )


def run_label(config: Mapping[str, Any]) -> str:
    return f"lora ranks {config.get('ranks_pattern')}" + at_head(config)


SPEC = MethodSpec(
    name="lora-ranks",
    label="LoRA on query and value with a rank per layer (PEFT rank_pattern), e.g. as the "
    "recommendation allocates it",
    colour="#c5b0d5",
    default_lr=5e-4,  # as method lora
    prepare=prepare,
    options=LoraRanksOptions,
    order=52,
    missing="the ranks per layer (ranks_pattern, e.g. 3:4,4:8)",
    run_label=run_label,
    # The recipe's adapter_config.json is written from method lora's uniform settings today; the
    # recommendation writes this method's LoraConfig itself (`analysis.recommend.allocation`).
    export=refuse_export(
        "the recipe format has no per-layer LoRA ranks yet; the Recommend page and "
        "`recommend --recipe` write its PEFT adapter_config.json (rank_pattern, alpha_pattern)"
    ),
)
