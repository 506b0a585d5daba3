"""Method ``layer-set``: whole layers train, any set of them — the layers given, k layers drawn
anew for every seed, or the k layers whose weights have the highest signal-to-noise ratio.

The recommendation's alternatives at the same budget (docs/explanation/recommendation.md, "The
alternatives"): ``random`` is "k random layers" (the draw is part of the seed, so the runs of one
setting are seeds of one another and their spread includes the draw); ``snr`` is the weights-only
choice axolotl's Spectrum makes (no data: `weight_snr`). Unlike method ``layers`` the set need
not be contiguous, and nothing is cut: the classifier reads ℓ_cls (default L).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analysis.config import setting
from analysis.finetune.spec import (
    MethodSpec,
    at_classifier_layer,
    export_as_prepared,
    is_int,
    layer_list,
    span,
)

if TYPE_CHECKING:
    import torch

PICKS = ("given", "random", "snr")
SNR_PARTS = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out")  # a layer's matrices


@dataclass(frozen=True)
class LayerSetOptions:
    """Method ``layer-set``: whole layers train (the layers given, k random, or the k of highest
    weight signal-to-noise ratio)."""

    layers: tuple[int, ...] | None = setting(
        None, help="the layers that train, e.g. 2,5,6 (pick 'given')", flat="set_layers",
        kind="layers",
    )  # fmt: skip
    pick: str = setting(
        "given", help="given: the layers listed; random: k layers drawn anew for every seed; "
        "snr: the k layers whose weight matrices have the highest signal-to-noise ratio against "
        "a Marchenko–Pastur bulk (no data)", flat="set_pick", kind="text",
    )  # fmt: skip
    k: int | None = setting(
        None, help="how many layers 'random' and 'snr' pick", flat="set_k", kind="int"
    )

    def __post_init__(self) -> None:
        if self.pick not in PICKS:
            raise ValueError(f"set_pick must be one of {', '.join(PICKS)} (got {self.pick!r}).")
        if self.pick == "given":
            if self.layers is None:
                raise ValueError("set_pick 'given' needs set_layers, e.g. 2,5,6.")
            if self.k is not None:
                raise ValueError("set_k goes with set_pick random or snr, not with given layers.")
            object.__setattr__(self, "layers", layer_list(self.layers, "set_layers"))
            return
        if self.layers is not None:
            raise ValueError(f"set_pick {self.pick!r} chooses the layers itself: drop set_layers.")
        if not is_int(self.k) or self.k < 1:
            raise ValueError(
                f"set_pick {self.pick!r} needs set_k, a whole number of layers ≥ 1 (got {self.k!r})."
            )


def chosen_layers(options: LayerSetOptions, n_layers: int, seed: int, snr=None) -> tuple[int, ...]:
    """The 1-based layers ``options`` train on a model of ``n_layers`` (kept) layers.

    random: k of 1..L without replacement, drawn from the method stream of training seed ``seed``
    (`analysis.seeding`; its sub-stream k), so each seed draws anew and the same seed draws the
    same layers. snr: the k highest of ``snr`` (layer → score, `layer_snr`), ties to the lower
    layer."""
    from analysis.seeding import Stream

    if options.pick == "given":
        return options.layers
    k = options.k
    if k > n_layers:
        raise ValueError(f"set_k = {k} layers asked for, but the model keeps {n_layers}.")
    if options.pick == "random":
        drawn = Stream(seed, "method").child(k).numpy().choice(n_layers, size=k, replace=False)
        return tuple(sorted(int(i) + 1 for i in drawn))
    order = sorted(snr, key=lambda layer: (-snr[layer], layer))
    return tuple(sorted(order[:k]))


# -- the weights' signal-to-noise ratio (Spectrum's choice) --------------------------------------


@functools.lru_cache(maxsize=64)
def mp_median(beta: float) -> float:
    """The median of the Marchenko–Pastur law of ratio β = m / n ∈ (0, 1] (unit variance): the
    μ with ∫_a^μ √((b − x)(x − a)) / (2π β x) dx = ½, a, b = (1 ∓ √β)²."""
    from scipy.integrate import quad
    from scipy.optimize import brentq

    lo, hi = (1 - math.sqrt(beta)) ** 2, (1 + math.sqrt(beta)) ** 2

    def density(x: float) -> float:
        return math.sqrt(max((hi - x) * (x - lo), 0.0)) / (2 * math.pi * beta * x)

    def mass_below(mu: float) -> float:
        return quad(density, lo, mu, limit=200)[0] - 0.5

    return brentq(mass_below, lo + 1e-12, hi - 1e-12, xtol=1e-10)


def weight_snr(weight: torch.Tensor) -> tuple[float, float, int]:
    """(snr, noise level σ̂, n above the bulk) of one weight matrix (n × m).

    The singular values s of a pure-noise n × m matrix with entry s.d. σ fill the
    Marchenko–Pastur bulk, whose upper edge is σ (√n + √m). σ̂ is estimated from the median
    singular value, which a few large (signal) values barely move (Gavish & Donoho 2014):
    σ̂ = median(s) / √(max(n, m) · μ_β), μ_β the median of the MP law (`mp_median`). The SNR
    is Spectrum's: Σ s_i above the edge / Σ s_i at or below it (0 for pure noise).
    torch.linalg.svdvals in float64.
    """
    import torch

    matrix = weight.detach().to("cpu", torch.float64)
    rows, cols = matrix.shape
    values = torch.linalg.svdvals(matrix)  # (min(n, m),) descending
    big, small = max(rows, cols), min(rows, cols)
    sigma = float(values.median()) / math.sqrt(big * mp_median(small / big))
    edge = sigma * (math.sqrt(rows) + math.sqrt(cols))
    above = values > edge
    noise = float(values[~above].sum())
    signal = float(values[above].sum())
    return (signal / noise if noise > 0 else math.inf), sigma, int(above.sum())


def layer_snr(blocks, family: str) -> dict[int, float]:
    """Layer (1-based) → the mean SNR (`weight_snr`) of its six weight matrices (query, key,
    value, attention output, feed-forward in and out). blocks: the encoder's layer modules."""
    from analysis.models import layer_modules

    out = {}
    for index, block in enumerate(blocks):
        parts = layer_modules(block, family)
        scores = [weight_snr(parts[name].weight)[0] for name in SNR_PARTS]
        out[index + 1] = float(sum(scores) / len(scores))
    return out


# -- the method ----------------------------------------------------------------------------------


def prepare(model, cfg, inputs):
    from analysis.finetune.prepare import blocks, train_only
    from analysis.finetune.prepared import Prepared

    options = cfg.options_for(LayerSetOptions)
    kept = model.n_layers_kept
    snr = layer_snr(model.layers, model.model_family) if options.pick == "snr" else None
    layers = chosen_layers(options, kept, cfg.seed, snr)
    if max(layers) > kept:
        raise ValueError(f"set_layers uses layer {max(layers)}, but the model keeps {kept}.")
    trained = blocks(model, layers)
    train_only(model, (p for block in trained for p in block.parameters()))
    how = {"given": "", "random": f" (drawn with seed {cfg.seed})",
           "snr": " (highest weight signal-to-noise ratio)"}[options.pick]  # fmt: skip
    return Prepared.from_model(model, f"layers {span(layers)}{how} and the classifier")


def run_label(config: Mapping[str, Any]) -> str:
    """``layers 2,5,6``, ``random ×3``, ``snr ×3`` (from the stored config's options)."""
    options = config.get("options") or {}
    pick = options.get("pick") or "given"
    if pick == "given":
        label = "layers " + ",".join(str(x) for x in options.get("layers") or ())
    else:
        label = f"{pick} ×{options.get('k')}"
    return label + at_classifier_layer(config)


SPEC = MethodSpec(
    name="layer-set",
    label="train a set of whole layers: the layers given, k random ones (redrawn per seed) or "
    "the k of highest weight signal-to-noise ratio",
    colour="#7f7f7f",
    default_lr=5e-5,  # whole layers, as method layers
    prepare=prepare,
    options=LayerSetOptions,
    order=15,
    missing="the layers (set_layers), or set_pick random / snr with set_k",
    run_label=run_label,
    export=export_as_prepared,  # the layers drawn for the config's seed are read off the model
)
