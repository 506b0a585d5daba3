"""The layer strategies of paper 000 as pure generators of (ℓ_bottom, ℓ_top, ℓ_cls) triples.

docs/explanation/strategies.md: layers ℓ_bottom..ℓ_top train, the classifier reads layer ℓ_cls,
and the layers above ℓ_cls are removed. With L layers and a chosen layer ℓ* (lowest ν):

- ℓ*-down:  (ℓ_b, ℓ*, ℓ_c) for ℓ_b ∈ {1, ℓ*−2, ℓ*−1, ℓ*}, ℓ_c ∈ {ℓ*, L}
- ℓ*-up:    (ℓ*+1, L, L)  (and, on request, (ℓ*+1, t, t) for t = ℓ*+1..L−1)
- baselines: (1, L, L) full fine-tuning and (ℓ_b, L, L) for ℓ_b ∈ {L−2, L−1, L}
- middle:   the ℓ*-down and ℓ*-up sets of ℓ_mid = L/2 + 1 (integer division), a ν-free reference

Invalid triples (ℓ_b < 1, ℓ_b > ℓ_t, ℓ_c < ℓ_t, anything > L) are dropped and duplicates removed,
keeping the first family that produced a triple (order: ℓ*-down, ℓ*-up, baseline, middle).

A **strategy** is one thing a sweep trains (`Strategy`): a layer triple (method ``layers``, or
``full`` for (1, L, L)) or a whole-model method (LoRA, BitFit…), with the family it belongs to.
A sweep is asked for strategies by name (`strategy_names`: a layer family's name, which stands
for all its triples, or a method's). The runs database keeps the family of the strategy that
queued a run in its column ``family``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from analysis.finetune.registry import find_spec, sweep_methods

Triple = tuple[int, int, int]
LAYER_FAMILIES = ("ℓ*-down", "ℓ*-up", "baseline", "middle")
LAYER_STRATEGIES = ("down", "up", "baselines", "middle")


def strategy_names() -> tuple[str, ...]:
    """The layer strategies, then the methods a sweep adds as whole-model baselines (each
    method's ``MethodSpec.sweep``: lora, bitfit, frozen, adapter, heads)."""
    return (*LAYER_STRATEGIES, *sweep_methods())


@dataclass(frozen=True)
class Strategy:
    """One thing a sweep trains: a method, its layer triple (layer methods) and its family."""

    family: str  # ℓ*-down, ℓ*-up, baseline, middle
    method: str
    layers: Triple | None = None

    @property
    def label(self) -> str:
        if self.layers is not None:
            return "(" + ", ".join(str(x) for x in self.layers) + ")"
        return self.method


def is_valid(triple: Triple, n_layers: int) -> bool:
    """1 ≤ ℓ_b ≤ ℓ_t ≤ ℓ_c ≤ L."""
    bottom, top, classifier = triple
    return 1 <= bottom <= top <= classifier <= n_layers


def clean(triples: Iterable[Triple], n_layers: int) -> list[Triple]:
    """Valid triples in first-seen order, without duplicates."""
    seen: dict[Triple, None] = {}
    for triple in triples:
        triple = tuple(int(x) for x in triple)  # type: ignore[assignment]
        if is_valid(triple, n_layers):
            seen.setdefault(triple)
    return list(seen)


def middle_layer(n_layers: int) -> int:
    """ℓ_mid = L/2 + 1 (integer division): 4 for L = 6, 7 for L = 12."""
    return n_layers // 2 + 1


def l_star_down(l_star: int, n_layers: int) -> list[Triple]:
    """(ℓ_b, ℓ*, ℓ_c), ℓ_b ∈ {1, ℓ*−2, ℓ*−1, ℓ*}, ℓ_c ∈ {ℓ*, L}: the classifier at ℓ* first, then
    at L."""
    _check(l_star, n_layers)
    bottoms = (1, l_star - 2, l_star - 1, l_star)
    return clean(
        [(b, l_star, c) for c in (l_star, n_layers) for b in bottoms],
        n_layers,
    )


def l_star_up(l_star: int, n_layers: int, all_tops: bool = False) -> list[Triple]:
    """(ℓ*+1, L, L); with ``all_tops`` also (ℓ*+1, t, t) for t = ℓ*+1..L−1."""
    _check(l_star, n_layers)
    tops = range(l_star + 1, n_layers + 1) if all_tops else (n_layers,)
    return clean([(l_star + 1, t, t) for t in tops], n_layers)


def baselines(n_layers: int) -> list[Triple]:
    """(1, L, L) full fine-tuning and the top-k baselines (ℓ_b, L, L), ℓ_b ∈ {L−2, L−1, L}."""
    big_l = n_layers
    return clean(
        [(1, big_l, big_l)] + [(b, big_l, big_l) for b in (big_l - 2, big_l - 1, big_l)], big_l
    )


def middle(n_layers: int) -> list[Triple]:
    """The ℓ*-down and ℓ*-up sets of ℓ_mid = L/2 + 1."""
    mid = middle_layer(n_layers)
    return clean(l_star_down(mid, n_layers) + l_star_up(mid, n_layers), n_layers)


def sweep_strategies(
    names: Sequence[str], n_layers: int, l_star: int | None = None, all_tops: bool = False
) -> list[Strategy]:
    """Expand strategy names (``down``, ``up``, ``baselines``, ``middle``, ``lora``…) into runs.

    Layer triples appear once, under the first family that produced them; (1, L, L) is full
    fine-tuning (method ``full``, the only strategy that trains the embeddings) and always a
    baseline. With ℓ* = L the ℓ*-down set is the baselines' very triples: they are listed as
    baselines (queued as "ℓ*-down", they had left the comparison without its baselines).
    """
    known = strategy_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"Unknown strategy {', '.join(map(repr, unknown))}: choose from {', '.join(known)}."
        )
    if ("down" in names or "up" in names) and l_star is None:
        raise ValueError("The ℓ*-down and ℓ*-up strategies need ℓ* (give --l-star or compute it).")
    families: list[tuple[str, list[Triple]]] = []
    if "down" in names:
        families.append(("ℓ*-down", l_star_down(l_star, n_layers)))  # type: ignore[arg-type]
    if "up" in names:
        families.append(("ℓ*-up", l_star_up(l_star, n_layers, all_tops)))  # type: ignore[arg-type]
    if "baselines" in names:
        families.append(("baseline", baselines(n_layers)))
    if "middle" in names:
        families.append(("middle", middle(n_layers)))
    out: list[Strategy] = []
    seen: set[Triple] = set()
    for family, triples in families:
        for triple in triples:
            if triple in seen:
                continue
            seen.add(triple)
            full = triple == (1, n_layers, n_layers)
            if full or (family == "ℓ*-down" and l_star == n_layers):
                family = "baseline"
            out.append(Strategy(family, "full" if full else "layers", None if full else triple))
    out.extend(Strategy("baseline", name) for name in sweep_methods() if name in names)
    return out


def family_of(layers: Sequence[int] | None, method: str, l_star: int | None, n_layers: int) -> str:
    """Which family a finished run belongs to, given the ℓ* it is compared against: full
    fine-tuning (`MethodSpec.reference`) and a sweep's whole-model methods are baselines; a run
    of a layer triple (a method that ``needs_layers``) is placed by its triple."""
    spec = find_spec(method)
    if spec is not None and spec.reference:
        return "baseline"
    if layers is None or spec is None or not spec.needs_layers:
        return "baseline" if method in sweep_methods() else "other"
    triple = tuple(int(x) for x in layers)
    if l_star == n_layers and triple in baselines(n_layers):  # ℓ*-down = the baselines
        return "baseline"
    if l_star is not None:
        if triple in l_star_down(l_star, n_layers):
            return "ℓ*-down"
        if triple in l_star_up(l_star, n_layers, all_tops=True):
            return "ℓ*-up"
    if triple in baselines(n_layers):
        return "baseline"
    if triple in middle(n_layers):
        return "middle"
    return "other"


def n_tuned_layers(layers: Sequence[int] | None, method: str, n_layers: int) -> int | None:
    """ℓ_top − ℓ_bottom + 1 for a layer strategy, L for full fine-tuning, 0 for a method whose
    body does not train (frozen), else None."""
    spec = find_spec(method)
    if spec is not None and spec.reference:
        return n_layers
    if layers is None:
        return 0 if spec is not None and not spec.has_body else None
    return int(layers[1]) - int(layers[0]) + 1


def _check(l_star: int, n_layers: int) -> None:
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"The model must have at least one layer (got L = {n_layers!r}).")
    if not isinstance(l_star, int) or not 1 <= l_star <= n_layers:
        raise ValueError(f"ℓ* must be a layer between 1 and L = {n_layers} (got {l_star!r}).")
