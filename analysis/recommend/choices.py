"""The choices a recommendation weighs: the candidates the analyses suggest, the alternatives a
practitioner would otherwise use at the same budget, and full fine-tuning as the reference
(docs/explanation/recommendation.md, "Candidates" and "The alternatives").

Candidates:
- **ℓ\\* layers**: the k layers up to ℓ\\* (ν's lowest layer), the classifier on ℓ\\*, the layers
  above removed — (max(1, ℓ\\* − k + 1), ℓ\\*, ℓ\\*); k = 3 (ℓ\\*-down's ℓ\\* − 2), or the most a
  params budget allows.
- **probe layers**: the same up to ℓ_p, the lowest layer whose probe score is within one s.e. of
  the best (`Evidence.plateau`), when that is another set.
- **PageRank heads**: the top-k PageRank heads of every layer (k = 3, or a params budget's most).
- **LoRA by probe gain**: `analysis.recommend.allocation` (total rank r · L of uniform LoRA).

Alternatives, each matched to a candidate: the last k layers, k random layers (redrawn per
seed), the k layers of highest weight SNR — k = the first layer candidate's; uniform LoRA of
rank r on every layer and PEFT's EVA of rank r (both total r · L, as the allocation); BitFit
(matched to the candidate nearest in trainable count). An alternative that is a candidate
itself (the last 3 layers when ℓ\\* = L) is not trained twice: a note says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from analysis.finetune.config import FinetuneConfig, canonical
from analysis.finetune.methods.eva import EvaOptions
from analysis.finetune.methods.heads import HeadsOptions
from analysis.finetune.methods.layer_set import LayerSetOptions, chosen_layers
from analysis.finetune.methods.lora import LoraOptions
from analysis.recommend.allocation import LoraAllocation, allocate_lora
from analysis.recommend.config import RecommendConfig
from analysis.recommend.evidence import Evidence

ROLES = ("reference", "candidate", "alternative")
DEFAULT_K = 3  # ℓ*-down's ℓ* − 2 .. ℓ*, and HiFi's heads per layer


@dataclass(frozen=True)
class Choice:
    """One way to fine-tune: what trains (method, layers, the method's options), in words, its
    role, the evidence it rests on and — for an alternative — the candidate it is matched to."""

    name: str
    role: str
    method: str
    trains: str
    evidence: str = ""
    layers: tuple[int, int, int] | None = None
    options: Any = None
    matched_to: str | None = None
    lora: LoraAllocation | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Unknown role {self.role!r}: choose one of {', '.join(ROLES)}.")

    def config(self, base: FinetuneConfig, seed: int | None = None) -> FinetuneConfig:
        """``base`` (the run settings) trained this way, with its method's own learning rate."""
        return dataclasses.replace(
            base, method=self.method, layers=self.layers, options=self.options, lr=None,
            seed=base.seed if seed is None else seed,
        )  # fmt: skip


REFERENCE = Choice("full fine-tuning", "reference", "full",
                   "everything: embeddings, every layer and the classifier",
                   "the reference every arm is compared with")  # fmt: skip


@dataclass
class Proposal:
    """The choices (reference first, then candidates, then alternatives) and what was noted on
    the way (an alternative that is a candidate itself, a budget no choice fits)."""

    choices: list[Choice]
    notes: list[str] = field(default_factory=list)

    def by_name(self, name: str) -> Choice:
        for choice in self.choices:
            if choice.name == name:
                return choice
        raise KeyError(name)

    @property
    def candidates(self) -> list[Choice]:
        return [c for c in self.choices if c.role == "candidate"]


def _layers(k: int, count: bool = True) -> str:
    """``3 layers`` / ``layer`` (``count`` False: the noun alone, ``layers`` / ``layer``)."""
    noun = "layer" if k == 1 else "layers"
    return f"{k} {noun}" if count else noun


def span_words(bottom: int, top: int) -> str:
    return f"layer {top}" if bottom == top else f"layers {bottom}–{top}"


def layers_trains(bottom: int, top: int, n_layers: int) -> str:
    """What a (ℓ_bottom, ℓ_top, ℓ_top) run trains, in words."""
    text = f"{span_words(bottom, top)} and the classifier"
    if top < n_layers:
        text += f", which reads layer {top}; {span_words(top + 1, n_layers)} removed"
    return text


# -- sizes a params budget allows ----------------------------------------------------------------


def _fits(evidence: Evidence, body: int, share: float) -> bool:
    return (body + evidence.classifier_params) / evidence.n_params <= share + 1e-12


def _largest(evidence: Evidence, cost_of, most: int, share: float | None, default: int) -> int:
    """The largest size 1..most whose body cost fits the share (1 when none does); ``default``
    without a share."""
    if share is None:
        return min(default, most)
    fitting = [size for size in range(1, most + 1) if _fits(evidence, cost_of(size), share)]
    return max(fitting, default=1)


def sizes(cfg: RecommendConfig, evidence: Evidence) -> dict[str, int]:
    """k layers, k heads per layer and the LoRA rank r: the defaults, or under a params budget
    the largest each allows (counted as the runs count: one layer block, 3 · (d_head · d +
    d_head) per head, 4 · d per unit of rank in a layer's query and value)."""
    share = cfg.budget.value if cfg.budget.kind == "params" else None
    big_l, d, h = evidence.n_layers, evidence.d_model, evidence.n_heads
    d_head = d // h
    top = evidence.l_star or big_l
    k_layers = _largest(evidence, lambda k: k * evidence.block_params, top, share, DEFAULT_K)
    k_heads = cfg.k or _largest(
        evidence, lambda k: k * big_l * 3 * (d_head * d + d_head), h, share, DEFAULT_K
    )
    r = _largest(evidence, lambda r: 4 * d * r * big_l, 4 * d, share, cfg.lora_r)
    return {"layers": k_layers, "heads": k_heads, "lora_r": r}


# -- the proposal --------------------------------------------------------------------------------


def propose(cfg: RecommendConfig, evidence: Evidence, model_name: str = "") -> Proposal:
    """Reference, candidates and alternatives (module docstring) for these analyses."""
    from analysis.heads.select import HeadSelectionConfig, analyse_heads

    big_l = evidence.n_layers
    size = sizes(cfg, evidence)
    k, r, alpha = size["layers"], size["lora_r"], cfg.lora_alpha
    notes: list[str] = []
    choices = [REFERENCE]
    layer_sets: list[tuple[int, int]] = []
    if evidence.l_star is not None:
        top = evidence.l_star
        bottom = max(1, top - k + 1)
        layer_sets.append((bottom, top))
        add(choices, notes, Choice(
            f"{span_words(bottom, top)} (ℓ*)", "candidate", "layers",
            layers_trains(bottom, top, big_l),
            f"ν is lowest at layer {top}: {evidence.l_star_words()}", layers=(bottom, top, top),
        ), big_l)  # fmt: skip
    plateau = evidence.plateau()
    if plateau is not None:
        top, score, best = plateau
        bottom = max(1, top - k + 1)
        if (bottom, top) not in layer_sets:
            layer_sets.append((bottom, top))
            add(choices, notes, Choice(
                f"{span_words(bottom, top)} (probe)", "candidate", "layers",
                layers_trains(bottom, top, big_l),
                f"the linear probe reaches {score:.3f} at layer {top}, within one s.e. of its "
                f"best ({best:.3f})", layers=(bottom, top, top),
            ), big_l)  # fmt: skip
    if evidence.heads is not None:
        k_heads = size["heads"]
        selection_cfg = HeadSelectionConfig(k=k_heads)
        analysis = analyse_heads(evidence.heads, selection_cfg)
        selection = analysis.to_selection(model_name, cfg.heads_provenance())
        choices.append(Choice(
            f"PageRank heads ×{k_heads}", "candidate", "heads",
            f"the query, key and value rows of the top {k_heads} PageRank heads of every layer, "
            "and the classifier",
            f"PageRank over each layer's heads (richness ξ = {cfg.xi}, correlation; damping "
            f"0.85), n = {evidence.heads.n} examples", options=HeadsOptions(selection),
        ))  # fmt: skip
    allocation = allocate_lora(evidence.probe, r=r, alpha=alpha)
    gains = ", ".join(f"{layer} {gain:+.3f}" for layer, gain in allocation.gains if gain > 0)
    lora_name = "LoRA by probe gain"
    if allocation.is_uniform:
        why = "No layer improves" if not gains else "Every layer improves equally"
        notes.append(
            f"{why} the probe on the layer below it, so the probe-gain allocation is "
            f"uniform LoRA (rank {r} in every layer) itself: trained once, as uniform LoRA."
        )
        lora_name = None
    else:
        choices.append(Choice(
            lora_name, "candidate", "lora",
            f"{allocation.words()} on query and value, and the classifier",
            f"ranks ∝ the probe's gain over the layer below ({gains}); total rank "
            f"{allocation.total_rank} = {r} × {big_l} layers, as uniform LoRA",
            options=allocation.options(), lora=allocation,
        ))  # fmt: skip
    _alternatives(choices, notes, evidence, r, alpha, lora_name)
    return Proposal(choices, notes)


def _alternatives(
    choices: list[Choice], notes: list[str], evidence: Evidence, r: int, alpha: float,
    lora_name: str | None,
) -> None:  # fmt: skip
    big_l = evidence.n_layers
    # the first candidate that names (ℓ_bottom, ℓ_top, ℓ_cls): a layer set
    first = next((c for c in choices if c.role == "candidate" and c.layers is not None), None)
    if first is None:
        notes.append("No layer candidate (ν undefined, or it is full fine-tuning itself): the "
                     "layer alternatives are left out.")  # fmt: skip
        wanted_layers = False
        k, first_layers = 1, None
    else:
        wanted_layers = True
        k, first_layers = first.layers[1] - first.layers[0] + 1, first.name
    snr_layers = chosen_layers(LayerSetOptions(pick="snr", k=k), big_l, 0, evidence.snr)
    snr_text = ", ".join(f"{layer} {evidence.snr[layer]:.2f}" for layer in sorted(evidence.snr))
    wanted = [
        Choice(f"last {_layers(k)}", "alternative", "layers", layers_trains(big_l - k + 1, big_l, big_l),
               "the usual cheap choice: the top of the network", layers=(big_l - k + 1, big_l, big_l),
               matched_to=first_layers),
        Choice(f"{k} random {_layers(k, False)}", "alternative", "layer-set",
               f"{_layers(k)} drawn anew for every seed (whole), and the classifier",
               "chance: what any k layers buy", options=LayerSetOptions(pick="random", k=k),
               matched_to=first_layers),
        Choice(f"{k} SNR {_layers(k, False)}", "alternative", "layer-set",
               f"{'layer' if k == 1 else 'layers'} {', '.join(map(str, snr_layers))} (highest "
               "weight signal-to-noise ratio) and the classifier",
               f"weights only, as axolotl's Spectrum: mean SNR per layer {snr_text}",
               options=LayerSetOptions(pick="snr", k=k), matched_to=first_layers),
    ] if wanted_layers else []  # fmt: skip
    wanted += [
        Choice(f"uniform LoRA r={r}", "alternative", "lora",
               f"LoRA rank {r} on query and value of every layer, and the classifier",
               "PEFT's default placement", options=LoraOptions(r=r, alpha=alpha),
               matched_to=lora_name),
        Choice(f"EVA LoRA r={r}", "alternative", "lora-eva",
               f"LoRA on query and value of every layer, total rank {r * big_l * 2} over the "
               "modules, started and allocated by EVA", "PEFT's EVA: explained variance of a "
               "few training batches' activations", options=EvaOptions(r=r, alpha=alpha),
               matched_to=lora_name),
        Choice("BitFit", "alternative", "bitfit", "every bias of the encoder, and the classifier",
               "a fixed, very small budget"),
    ]  # fmt: skip
    for alt in wanted:
        add(choices, notes, alt, big_l)


def add(choices: list[Choice], notes: list[str], choice: Choice, n_layers: int) -> None:
    """Append ``choice`` unless it trains what a choice already listed trains (then a note says
    so): layers (1, L, L) is full fine-tuning."""
    key = _trains(choice, n_layers)
    for other in choices:
        if _trains(other, n_layers) == key:
            notes.append(f"{choice.name} is {other.name} itself: trained once, as {other.name}.")
            return
    choices.append(choice)


def _trains(choice: Choice, n_layers: int) -> tuple:
    """What a choice trains, under its one name (`canonical`: layers (1, L, L) is full)."""
    cfg = canonical(choice.config(FinetuneConfig()), n_layers)
    return (cfg.method, cfg.layers, cfg.options)
