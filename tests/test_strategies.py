"""Strategy generators of paper 000 (docs/explanation/strategies.md, "ℓ*-down and ℓ*-up")."""

from __future__ import annotations

import pytest

from analysis import strategies as st


def test_l_star_down_on_twelve_layers():
    assert st.l_star_down(7, 12) == [
        (1, 7, 7), (5, 7, 7), (6, 7, 7), (7, 7, 7),
        (1, 7, 12), (5, 7, 12), (6, 7, 12), (7, 7, 12),
    ]  # fmt: skip


def test_l_star_down_drops_invalid_and_duplicates():
    # ℓ* = 2: ℓ*−2 = 0 is dropped, ℓ*−1 = 1 duplicates the "1" bottom.
    assert st.l_star_down(2, 6) == [(1, 2, 2), (2, 2, 2), (1, 2, 6), (2, 2, 6)]
    # ℓ* = 1 and ℓ* = L: ℓ_c ∈ {ℓ*, L} coincide.
    assert st.l_star_down(1, 4) == [(1, 1, 1), (1, 1, 4)]
    assert st.l_star_down(4, 4) == [(1, 4, 4), (2, 4, 4), (3, 4, 4), (4, 4, 4)]


def test_l_star_up():
    assert st.l_star_up(3, 6) == [(4, 6, 6)]
    assert st.l_star_up(3, 6, all_tops=True) == [(4, 4, 4), (4, 5, 5), (4, 6, 6)]
    assert st.l_star_up(6, 6) == []  # nothing above the top layer


def test_baselines_and_middle():
    assert st.baselines(12) == [(1, 12, 12), (10, 12, 12), (11, 12, 12), (12, 12, 12)]
    assert st.baselines(2) == [(1, 2, 2), (2, 2, 2)]  # L−2 = 0 dropped, 1 duplicated
    assert st.middle_layer(6) == 4 and st.middle_layer(12) == 7 and st.middle_layer(2) == 2
    assert st.middle(6) == st.l_star_down(4, 6) + st.l_star_up(4, 6)


@pytest.mark.parametrize("triple", [(0, 2, 2), (3, 2, 3), (1, 3, 2), (1, 7, 7), (2, 2, 7)])
def test_invalid_triples(triple):
    assert not st.is_valid(triple, 6)


def test_sweep_expansion_lists_full_fine_tuning_and_the_reference_as_baselines():
    # With ℓ* = L, ℓ*-down is (1, L, L): full fine-tuning must still be listed once, as a
    # baseline, with the baselines the sweep asked for.
    plan = st.sweep_strategies(["down", "up", "baselines", "lora", "bitfit"], 6, l_star=6)
    triples = [s.layers for s in plan if s.layers is not None]
    assert len(triples) == len(set(triples))
    full = [s for s in plan if s.method == "full"]
    assert full == [st.Strategy("baseline", "full", None)]  # listed once, as a baseline
    # With ℓ* = L, (4, 6, 6) is both ℓ*-down (ℓ*−2) and a baseline (L−2): a baseline.
    assert next(s for s in plan if s.layers == (4, 6, 6)).family == "baseline"
    assert not any(s.family == "ℓ*-down" for s in plan)  # ℓ*-down adds nothing here
    assert [s.method for s in plan[-2:]] == ["lora", "bitfit"]
    assert not any(s.family == "ℓ*-up" for s in plan)  # ℓ* = L: nothing above
    below = st.sweep_strategies(["down", "up", "baselines"], 6, l_star=3)
    family = {s.layers or s.method: s.family for s in below}
    assert family["full"] == "baseline" and family[(1, 3, 3)] == "ℓ*-down"
    assert family[(4, 6, 6)] == "ℓ*-up"  # ℓ* < L: the first family that produced it


def test_sweep_needs_l_star_and_known_names():
    with pytest.raises(ValueError, match="ℓ\\*"):
        st.sweep_strategies(["down"], 6)
    with pytest.raises(ValueError, match="Unknown strategy"):
        st.sweep_strategies(["sideways"], 6, l_star=2)
    with pytest.raises(ValueError, match="between 1 and L"):
        st.l_star_down(0, 6)


def test_family_and_tuned_layers():
    assert st.family_of((1, 3, 3), "layers", 3, 6) == "ℓ*-down"
    assert st.family_of((4, 6, 6), "layers", 3, 6) == "ℓ*-up"
    assert st.family_of((5, 6, 6), "layers", 3, 6) == "baseline"
    assert st.family_of(None, "lora", 3, 6) == "baseline"
    assert st.n_tuned_layers((2, 4, 6), "layers", 6) == 3
    assert st.n_tuned_layers(None, "full", 6) == 6
    assert st.n_tuned_layers(None, "lora", 6) is None
