"""The sequential rule (docs/explanation/statistics.md, "Sequential rounds"): statuses, rounds and
sentences on hand-made scores, and simulated comparisons with known true differences that show
the boundary keeps "held up" at a true −δ to ≤ α over every look — and that the one-look rule
applied at every round does not. ``pytest -s`` prints the simulated rates."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from scipy.stats import t as student

from analysis.runs.sequential import (
    HELD_UP,
    NOT_NEEDED,
    SHOWN_WORSE,
    UNDECIDED,
    SequentialDesign,
    answer,
    classify,
    plan,
)

DELTA = 0.01
N_SIMS = 4000


# -- the rule on hand-made scores -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"delta": 0.0}, {"delta": -0.01}, {"delta": math.nan}, {"delta": 0.01, "r0": 1},
     {"delta": 0.01, "r0": 5, "r_max": 4}, {"delta": 0.01, "alpha": 0.0},
     {"delta": 0.01, "alpha": 0.5}, {"delta": 0.01, "test": "z"}],
)  # fmt: skip
def test_design_validates_itself(kwargs):
    with pytest.raises(ValueError):
        SequentialDesign(**kwargs)


def test_critical_value_is_bonferroni_over_looks():
    design = SequentialDesign(delta=DELTA)  # r0 3, R_max 10: K = 8 looks, α/K = 0.003125
    assert design.looks == 8
    assert design.critical(2) == pytest.approx(12.58974, rel=1e-5)  # t_{0.996875, 2}
    assert design.critical(9) == pytest.approx(student.ppf(1 - 0.025 / 8, 9))
    assert np.allclose(design.critical([2.0, 9.0]), [design.critical(2), design.critical(9)])
    assert math.isnan(design.critical(0))
    one_look = SequentialDesign(delta=DELTA, r0=10, r_max=10)
    assert one_look.critical(9) == pytest.approx(student.ppf(0.975, 9))


def test_classify():
    assert classify(-0.009, 0.02, DELTA) == HELD_UP
    assert classify(-0.01, 0.02, DELTA) == HELD_UP  # lower end exactly −δ
    assert classify(-0.05, -0.011, DELTA) == SHOWN_WORSE
    assert classify(-0.02, 0.0, DELTA) == UNDECIDED
    assert classify(math.nan, math.nan, DELTA) == UNDECIDED
    assert classify([0.0, -0.3], [0.1, -0.2], DELTA).tolist() == [HELD_UP, SHOWN_WORSE]


FULL = {0: 0.830, 1: 0.840, 2: 0.820}


def test_first_round_starts_every_arm_with_r0_seeds():
    result = plan({}, {"a": {}, "b": {}}, ["a", "b"], SequentialDesign(delta=DELTA))
    assert [a.status for a in result.arms] == [UNDECIDED, UNDECIDED]
    assert result.next_seeds == {"a": 3, "b": 3} and result.full_seeds == 3
    assert not result.final and answer(result).branch == "in progress"
    assert "no interval yet" in answer(result).sentence(100, "points")


def test_a_cheaper_arm_that_held_up_stops_the_costlier_ones():
    arms = {
        "cheap": {s: v - 0.05 + 0.002 * s for s, v in FULL.items()},  # far below: shown worse
        "mid": {s: v - 0.001 + 0.0001 * s for s, v in FULL.items()},  # d = −0.001 ± tiny
        "dear": {0: 0.80, 1: 0.85, 2: 0.83},
    }
    result = plan(FULL, arms, ["cheap", "mid", "dear"], SequentialDesign(delta=DELTA))
    cheap, mid, dear = result.arms
    assert (cheap.status, mid.status, dear.status) == (SHOWN_WORSE, HELD_UP, NOT_NEEDED)
    d = np.array([-0.001, -0.0009, -0.0008])  # mid − full per seed
    assert mid.n == 3 and mid.diff == pytest.approx(d.mean())
    assert mid.se == pytest.approx(d.std(ddof=1) / math.sqrt(3))
    assert mid.lo == pytest.approx(d.mean() - 12.58974 * mid.se, rel=1e-5)
    assert result.final and result.next_seeds == {} and result.not_needed == ("dear",)
    said = answer(result)
    assert said.branch == "recommend" and said.arm.name == "mid"
    assert said.sentence(100, "points") == (
        "mid -0.1 ± 0.1 points [-0.2, -0.0] (n seeds = 3) against full fine-tuning (paired t, c "
        "adjusted for 8 looks: c = 12.59) — the cheapest choice that held up within δ = 1 point."
    )


def test_cheaper_undecided_arms_keep_getting_seeds_until_final():
    design = SequentialDesign(delta=DELTA)
    full = {s: 0.83 + 0.01 * (-1) ** s for s in range(4)}
    arms = {
        "cheap": {s: 0.82 + 0.02 * (-1) ** (s // 2) for s in range(4)},  # spread: undecided
        "dear": {s: full[s] - 0.001 for s in range(3)},  # held up at its first look
    }
    result = plan(full, arms, ["cheap", "dear"], design)
    assert [a.status for a in result.arms] == [UNDECIDED, HELD_UP]
    assert result.next_seeds == {"cheap": 5} and result.full_seeds == 5 and not result.final
    said = answer(result)
    assert said.branch == "recommend" and not said.final
    assert "still being trained" in said.sentence()
    at_max = {s: 0.82 + 0.02 * (-1) ** (s // 2) for s in range(10)}
    full10 = {s: 0.83 + 0.01 * (-1) ** s for s in range(10)}
    result = plan(full10, {"cheap": at_max, "dear": arms["dear"]}, ["cheap", "dear"], design)
    assert result.arms[0].status == UNDECIDED and result.arms[0].n == 10
    assert result.final and answer(result).final


def test_undecided_after_r_max_and_none_held_up():
    design = SequentialDesign(delta=DELTA, r_max=5)
    full = {s: 0.83 + 0.01 * (-1) ** s for s in range(5)}
    wide = {s: 0.82 + 0.03 * (-1) ** (s // 2) for s in range(5)}
    worse = {s: v - 0.1 for s, v in full.items()}
    result = plan(full, {"wide": wide, "worse": worse}, ["wide", "worse"], design)
    assert [a.status for a in result.arms] == [UNDECIDED, SHOWN_WORSE] and result.final
    said = answer(result)
    assert said.branch == "undecided" and [a.name for a in said.undecided] == ["wide"]
    text = said.sentence(100, "points")
    assert text.startswith("Undecided after 5 seeds: wide ") and "[" in text
    assert "stay within reach of −δ (δ = 1 point; paired t, c adjusted for 3 looks)" in text
    result = plan(full, {"worse": worse}, ["worse"], design)
    assert answer(result).branch == "none held up"
    assert answer(result).sentence(100, "points") == (
        "No cheaper choice held up within δ = 1 point: fine-tune the whole model."
    )


def test_no_look_before_r0_and_no_seed_beyond_r_max():
    design = SequentialDesign(delta=DELTA, r0=4, r_max=6)
    full = {s: 0.83 + 0.001 * s for s in range(8)}
    close = {s: full[s] - 0.0001 for s in range(3)}  # would hold up, but only 3 pairs
    result = plan(full, {"close": close}, ["close"], design)
    assert result.arms[0].status == UNDECIDED and math.isnan(result.arms[0].lo)
    assert result.next_seeds == {"close": 4}
    many = {s: full[s] - 0.05 + 0.01 * (-1) ** s for s in range(8)}
    result = plan(full, {"many": many}, ["many"], design)
    assert result.arms[0].n == 6  # seeds 6 and 7 lie outside the design's looks


def test_paired_pairs_only_common_seeds_and_welch_the_first_n_of_each():
    full = {0: 0.83, 1: 0.84, 2: 0.82, 3: 0.90, 4: 0.70}
    arm = {0: 0.82, 1: 0.83, 2: 0.815, 7: 0.5}
    paired = plan(full, {"a": arm}, ["a"], SequentialDesign(delta=DELTA)).arms[0]
    assert paired.n == 3 and paired.diff == pytest.approx(np.mean([-0.01, -0.01, -0.005]))
    welch = plan(full, {"a": arm}, ["a"], SequentialDesign(delta=DELTA, test="welch")).arms[0]
    # Welch: the arm's 4 seeds against full's first 4; full's fifth seed does not move the look
    a, f = np.array([0.82, 0.83, 0.815, 0.5]), np.array([0.83, 0.84, 0.82, 0.90])
    assert welch.n == 4 and welch.diff == pytest.approx(a.mean() - f.mean())
    assert welch.se == pytest.approx(math.hypot(a.std(ddof=1), f.std(ddof=1)) / 2)
    with pytest.raises(ValueError):
        plan(full, {"a": arm}, ["a", "b"], SequentialDesign(delta=DELTA))


# -- simulated comparisons with known true differences --------------------------------------------


def draw(true, spread, rho, n_sims, r_max, rng):
    """Scores over seeds (n_sims, R_max) for an arm per true difference and for full, Gaussian,
    sd ``spread`` each, correlation ``rho`` between an arm and full at one seed."""
    z_full = rng.standard_normal((n_sims, r_max))
    full = spread * z_full
    arms = [
        mu + spread * (rho * z_full + math.sqrt(1 - rho**2) * rng.standard_normal(full.shape))
        for mu in np.atleast_1d(true)
    ]
    return arms, full


def interval_stats(arm, full, test):
    """diff, se, df over the first n seeds of every simulation, (n_sims,) each."""
    n = arm.shape[1]
    if test == "paired":
        d = arm - full
        return d.mean(1), d.std(1, ddof=1) / math.sqrt(n), np.full(len(d), n - 1.0)
    var_a, var_f = arm.var(1, ddof=1) / n, full.var(1, ddof=1) / n
    df = (var_a + var_f) ** 2 / ((var_a**2 + var_f**2) / (n - 1))
    return arm.mean(1) - full.mean(1), np.sqrt(var_a + var_f), df


def sequential(arm, full, design, critical=None):
    """One arm through the rounds, every simulation at once: looked at with n = r0 … R_max seeds
    until decided. Returns (status (n_sims,), seeds at the decision or R_max (n_sims,))."""
    critical = critical or design.critical
    status = np.full(len(arm), UNDECIDED, dtype=object)
    stop = np.full(len(arm), design.r_max)
    active = np.ones(len(arm), dtype=bool)
    for n in range(design.r0, design.r_max + 1):
        diff, se, df = interval_stats(arm[:, :n], full[:, :n], design.test)
        c = critical(df)
        now = classify(diff - c * se, diff + c * se, design.delta)
        new = active & (now != UNDECIDED)
        status[new], stop[new] = now[new], n
        active &= ~new
    return status, stop


def one_look_t(df):
    """Today's rule: t at 97.5 %, as if each look were the only one."""
    return student.ppf(0.975, df)


@functools.cache
def cell(true, spread, test, rho, naive=False):
    """(share held up, share shown worse, share decided, mean seeds when decided) of N_SIMS
    simulated comparisons; true and spread in units of δ."""
    design = SequentialDesign(delta=DELTA, test=test)
    rng = np.random.default_rng([int(100 * true) + 1000, int(100 * spread), int(100 * rho) + 500])
    (arm,), full = draw(true * DELTA, spread * DELTA, rho, N_SIMS, design.r_max, rng)
    status, stop = sequential(arm, full, design, one_look_t if naive else None)
    decided = status != UNDECIDED
    return (np.mean(status == HELD_UP), np.mean(status == SHOWN_WORSE), decided.mean(),
            stop[decided].mean() if decided.any() else math.nan)  # fmt: skip


ALPHA = SequentialDesign(delta=DELTA).alpha
BOUND = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / N_SIMS)  # α within Monte-Carlo error
SPREADS = (0.5, 1.0, 2.0)


@pytest.mark.parametrize("spread", SPREADS)
@pytest.mark.parametrize(
    ("test", "rho", "naive", "valid"),
    [
        ("paired", 0.5, False, True),  # common random numbers, paired t, Bonferroni over looks
        ("welch", 0.0, False, True),  # independent seeds, Welch, Bonferroni over looks
        ("paired", 0.5, True, False),  # the one-look t at every round: too many looks
        ("welch", 0.0, True, False),  # today's Welch rule at every round
        ("welch", -0.85, False, False),  # Welch on common seeds that anti-correlate
    ],
)
def test_held_up_at_a_true_minus_delta_is_at_most_alpha(spread, test, rho, naive, valid):
    held_up = cell(-1.0, spread, test, rho, naive)[0]
    print(f"{test} ρ={rho} {'one-look t' if naive else 'Bonferroni'} spread {spread}δ: "
          f"held up at −δ {held_up:.4f} (bound {BOUND:.4f})")  # fmt: skip
    assert (held_up <= BOUND) == valid


def test_the_grid_reports_how_often_and_how_soon_arms_are_decided():
    """SPEC-style grid under the chosen seed design — Welch's t on independent seeds (ρ = 0,
    `analysis.runs.planner.SEED_DESIGN`): the printed table, and bounds on
    what a user sees — a true-zero arm holds up almost always at a small spread, rarely at a
    large one; a true −2δ arm is shown worse where the spread allows; never a wrong call."""
    rows = {}
    for spread in SPREADS:
        for true in (-2.0, -1.0, 0.0, 1.0):
            rows[true, spread] = held, worse, decided, seeds = cell(true, spread, "welch", 0.0)
            print(f"true {true:+.0f}δ spread {spread}δ: held up {held:.3f} shown worse "
                  f"{worse:.3f} decided {decided:.3f} after {seeds:.2f} seeds")  # fmt: skip
    for spread in SPREADS:
        assert rows[0.0, spread][1] <= BOUND  # a true zero is not shown worse
        assert rows[-2.0, spread][0] <= BOUND  # a true −2δ does not hold up
        assert rows[1.0, spread][0] >= rows[0.0, spread][0]  # better arms hold up more often
    zero = [rows[0.0, s] for s in SPREADS]
    assert zero[0][2] >= 0.85 and zero[0][3] <= 7.0  # spread δ/2: decided, in ~6 seeds
    assert 0.2 <= zero[1][2] <= 0.5  # spread δ: about a third decided by R_max
    assert 0.03 <= zero[2][2] <= 0.2  # spread 2δ: mostly still undecided at R_max
    assert zero[0][2] > zero[1][2] > zero[2][2]
    assert rows[-2.0, 0.5][1] >= 0.85 and rows[1.0, 0.5][3] <= 4.5


def test_the_planner_loop_takes_the_simulated_looks():
    """`plan` driven round by round over three arms (cheapest first) ends where the vectorised
    rule says each arm would, except that arms still undecided when a cheaper one held up are
    "not needed"."""
    design = SequentialDesign(delta=DELTA)
    rng = np.random.default_rng(7)
    arms, full = draw([-2 * DELTA, 0.0, DELTA], DELTA, 0.5, 120, design.r_max, rng)
    alone = [sequential(arm, full, design) for arm in arms]
    names = ["cheap", "mid", "dear"]
    seen = set()
    for i in range(len(full)):
        counts, n_full = dict.fromkeys(names, 0), 0
        for _ in range(design.looks + 2):
            scores = {name: dict(enumerate(arm[i, : counts[name]]))
                      for name, arm in zip(names, arms, strict=True)}  # fmt: skip
            result = plan(dict(enumerate(full[i, :n_full])), scores, names, design)
            if result.final:
                break
            counts.update(result.next_seeds)
            n_full = result.full_seeds
            assert n_full >= max(counts.values())
        assert result.final
        held_at = math.inf
        for k, (name, got) in enumerate(zip(names, result.arms, strict=True)):
            status, stop = alone[k][0][i], alone[k][1][i]
            decided_first = status != UNDECIDED and stop <= held_at
            expected = status if decided_first or held_at == math.inf else NOT_NEEDED
            assert got.status == expected, (i, name)
            seen.add((name, got.status))
            if decided_first:
                assert got.n == stop
            if got.status == HELD_UP:
                held_at = min(held_at, stop)
    # every path is taken: the cheap arm shown worse, the others held up, undecided, not needed
    assert {("cheap", SHOWN_WORSE), ("mid", HELD_UP), ("mid", UNDECIDED), ("dear", HELD_UP),
            ("dear", NOT_NEEDED)} <= seen  # fmt: skip
