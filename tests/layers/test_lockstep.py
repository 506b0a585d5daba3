"""L-BFGS-B minimisations side by side: each takes the very iterates ``scipy.optimize.minimize``
takes alone, whatever shares its rounds."""

import numpy as np
import pytest
import scipy.optimize

from analysis.layers.lockstep import minimize_together

FTOL = 64 * np.finfo(float).eps


def robust_regressions(count: int, n: int = 60, d: int = 12, seed: int = 0):
    """Smooth, non-quadratic objectives of different conditioning: Σ log(1 + r²) + λ‖w‖²."""
    rng = np.random.default_rng(seed)
    problems = []
    for k in range(count):
        a = rng.standard_normal((n, d)) * np.logspace(0, k / 2, d)  # worse conditioned with k
        b = rng.standard_normal(n)
        problems.append((a, b, 10.0 ** -(k % 3)))

    def f(w: np.ndarray, k: int) -> tuple[float, np.ndarray]:
        a, b, lam = problems[k]
        r = a @ w - b
        return float(np.sum(np.log1p(r**2)) + lam * w @ w), 2 * a.T @ (r / (1 + r**2)) + 2 * lam * w

    return f


@pytest.mark.parametrize(("maxiter", "gtol"), [(500, 1e-8), (7, 1e-8), (500, 1e-2)])
def test_each_minimisation_takes_scipys_own_iterates(maxiter, gtol):
    """Converged, stopped at maxiter, stopped early by a loose gtol: x, f, nit, nfev and success
    all equal to scipy's, bit for bit."""
    f = robust_regressions(5)
    options = {"maxiter": maxiter, "gtol": gtol, "ftol": FTOL, "maxls": 50}
    starts = [np.full(12, 0.1 * k) for k in range(5)]
    alone = [
        scipy.optimize.minimize(f, x0, args=(k,), jac=True, method="L-BFGS-B", options=options)
        for k, x0 in enumerate(starts)
    ]
    rounds = []

    def evaluate(ids, points):
        rounds.append(list(ids))
        return [f(x, k) for k, x in zip(ids, points, strict=True)]

    together = minimize_together(starts, evaluate, maxiter=maxiter, gtol=gtol, ftol=FTOL)
    for ref, got in zip(alone, together, strict=True):
        np.testing.assert_array_equal(got.x, ref.x)
        assert (got.f, got.nit, got.success) == (ref.fun, ref.nit, ref.success)
        # scipy does not count a request at the point it evaluated last (its cache)
        assert ref.nfev <= got.nfev <= ref.nfev + 1
    # Every round asks for each minimisation still running, once: as many rounds as the most
    # evaluations any one needed.
    assert len(rounds) == max(got.nfev for got in together)
    assert sum(map(len, rounds)) == sum(got.nfev for got in together)
    assert all(len(set(r)) == len(r) for r in rounds)
    if maxiter == 7:
        assert all(got.nit == 7 and not got.success for got in together)


def test_points_of_several_sizes_and_no_points():
    f = robust_regressions(2, d=12)

    def g(w, k):  # the second problem in 4 dimensions
        return f(np.resize(w, 12), k) if k == 0 else (float(w @ w + w.sum()), 2 * w + 1)

    found = minimize_together(
        [np.zeros(12), np.zeros(4)],
        lambda ids, pts: [g(x, k) for k, x in zip(ids, pts, strict=True)],
        maxiter=100,
        gtol=1e-10,
        ftol=FTOL,
    )
    assert found[0].x.shape == (12,) and found[1].success
    np.testing.assert_allclose(found[1].x, -0.5, atol=1e-8)  # argmin of w·w + Σw
    assert minimize_together([], lambda ids, pts: [], maxiter=5, gtol=1e-5, ftol=FTOL) == []


def test_a_chain_of_minimisations_keeps_its_slot_busy():
    """``then`` starts each slot's next minimisation from its last minimum, in the same rounds:
    every link takes scipy's own iterates from that start, and the rounds number the longest
    chain's evaluations, not the sum of each step's slowest."""
    f = robust_regressions(3)
    options = {"maxiter": 200, "gtol": 1e-7, "ftol": FTOL, "maxls": 50}
    links = {0: [0, 1, 2], 1: [1, 2, 0], 2: [2]}  # slot -> the functions it minimises in turn
    step = dict.fromkeys(links, 0)
    seen = {slot: [] for slot in links}

    def then(slot, found):
        seen[slot].append(found)
        step[slot] += 1
        return found.x if step[slot] < len(links[slot]) else None

    rounds = []

    def evaluate(ids, points):
        rounds.append(len(ids))
        return [f(x, links[i][step[i]]) for i, x in zip(ids, points, strict=True)]

    last = minimize_together([np.zeros(12)] * 3, evaluate, then=then, maxiter=200, gtol=1e-7,
                             ftol=FTOL)  # fmt: skip
    for slot, chain in links.items():
        start = np.zeros(12)
        for k, found in zip(chain, seen[slot], strict=True):
            ref = scipy.optimize.minimize(
                f, start, args=(k,), jac=True, method="L-BFGS-B", options=options
            )
            np.testing.assert_array_equal(found.x, ref.x)
            start = ref.x
        np.testing.assert_array_equal(last[slot].x, seen[slot][-1].x)
    assert len(rounds) == max(sum(m.nfev for m in chain) for chain in seen.values())
