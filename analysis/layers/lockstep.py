"""Several L-BFGS-B minimisations run side by side, their values and gradients computed together.

`minimize_together(starts, evaluate, …)` minimises P unrelated smooth functions. Each one follows
exactly the iterates of ``scipy.optimize.minimize(f_p, x_p, jac=True, method="L-BFGS-B",
options=…)`` — it is driven by the same routine (scipy's reverse-communication ``setulb``, which
``minimize`` itself calls in a loop), with the same options, stopping rules and iteration count —
but whenever several of them ask for a value and gradient, ``evaluate`` gets all those points in
one call.

Why: the probe's fits (`analysis.layers.probe`) are many small logistic regressions on row subsets
of one layer's states. One evaluation of one fit is two passes over its rows × d matrix, bound by
memory bandwidth (a float32 matrix-vector product at 3,000 × 1,024 reads 12 MB for 6 MFLOP). With
15 fits on the same rows the two passes become two matrix products with 15 columns, which read the
rows once: at 3,750 × 1,024 on one core, 2.7–3.5 ms for 15 fits against 10 ms one at a time. L-BFGS-B
itself is cheap beside that (a few microseconds a step at d = 1,024).

Why this needs scipy's private ``_lbfgsb`` module: ``minimize`` owns its loop and calls the
function one point at a time; ``setulb`` (the loop's body) is the only entry that lets a caller
hold several minimisations at their "evaluate f and g here" step. It is pinned with scipy in the
lock; ``tests/layers/test_lockstep.py`` checks that one minimisation here takes the very iterates
``minimize`` takes, so a scipy upgrade that changed the routine would fail there first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import _lbfgsb

MAXCOR = 10  # scipy's default history length (``maxcor``), which scikit-learn keeps
MAXFUN = 15_000  # scipy's default cap on evaluations (``maxfun``)
# setulb's task codes: "evaluate f and g at x", "an iteration is done", "converged"
_FG, _NEW_X, _CONVERGED = 3, 1, 4
_STOP, _MAXITER_REACHED, _MAXFUN_REACHED = 5, 504, 502

# evaluate(ids, points) -> one (f, g) per id: the values and gradients of minimisations ``ids``
# at ``points`` (each a float64 vector, read-only to the callee).
Evaluate = Callable[[list[int], list[np.ndarray]], list[tuple[float, np.ndarray]]]


@dataclass
class Minimum:
    """Where one minimisation stopped: x, f and g there, iterations (``nit``, as scipy counts),
    evaluations asked for (``nfev``; scipy's count leaves out a request at the point it has just
    evaluated, so it can be one less) and whether it converged (scipy's ``success``)."""

    x: np.ndarray
    f: float
    g: np.ndarray
    nit: int
    nfev: int
    success: bool


@dataclass
class _Run:
    """One minimisation's state between calls of ``setulb`` (the arrays scipy's loop keeps)."""

    x: np.ndarray
    maxcor: int
    f: float = 0.0
    nit: int = 0
    nfev: int = 0
    g: np.ndarray = field(init=False)
    wa: np.ndarray = field(init=False)
    iwa: np.ndarray = field(init=False)
    task: np.ndarray = field(default_factory=lambda: np.zeros(2, dtype=np.int32))
    ln_task: np.ndarray = field(default_factory=lambda: np.zeros(2, dtype=np.int32))
    lsave: np.ndarray = field(default_factory=lambda: np.zeros(4, dtype=np.int32))
    isave: np.ndarray = field(default_factory=lambda: np.zeros(44, dtype=np.int32))
    dsave: np.ndarray = field(default_factory=lambda: np.zeros(29, dtype=np.float64))

    def __post_init__(self) -> None:
        n, m = len(self.x), self.maxcor
        self.g = np.zeros(n)
        self.wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m)
        self.iwa = np.zeros(3 * n, dtype=np.int32)


def minimize_together(
    starts: Sequence[np.ndarray],
    evaluate: Evaluate,
    *,
    maxiter: int,
    gtol: float,
    ftol: float,
    maxls: int = 50,
    maxcor: int = MAXCOR,
    then: Callable[[int, Minimum], np.ndarray | None] | None = None,
) -> list[Minimum]:
    """Minimise P functions from ``starts`` (P float64 vectors) by unbounded L-BFGS-B, each as
    ``scipy.optimize.minimize(method="L-BFGS-B", jac=True, options={"maxiter": maxiter, "gtol":
    gtol, "ftol": ftol, "maxls": maxls, "maxcor": maxcor})`` would (module docstring).
    ``evaluate(ids, points)`` returns the (value, gradient) of minimisation ``ids[i]`` at
    ``points[i]`` for every i; it is called once per round with every minimisation that waits for
    one. Returns one `Minimum` per start, in order.

    then(i, minimum): called when minimisation i stops; a vector it returns starts a new
    minimisation in slot i (a fresh L-BFGS-B run from that point, ``evaluate`` now answering for
    the slot's next function), so that a chain of minimisations — the probe's walk up its C grid,
    each fit started from the last — keeps its slot busy in the shared rounds instead of waiting
    for the slowest chain at every step. None ends the slot; the returned list holds each slot's
    last minimum."""
    factr = ftol / np.finfo(float).eps
    runs = [_Run(np.array(x0, dtype=np.float64).ravel(), maxcor) for x0 in starts]
    if not runs:
        return []
    n_max = max(len(run.x) for run in runs)
    no_bound = np.zeros(n_max)
    unbounded = np.zeros(n_max, dtype=np.int32)

    def advance(run: _Run) -> bool:
        """Step ``run`` until it waits for f and g (True) or has stopped (False)."""
        n = len(run.x)
        while True:
            _lbfgsb.setulb(
                maxcor, run.x, no_bound[:n], no_bound[:n], unbounded[:n], run.f, run.g, factr,
                gtol, run.wa, run.iwa, run.task, run.lsave, run.isave, run.dsave, maxls,
                run.ln_task,
            )  # fmt: skip
            if run.task[0] == _FG:
                return True
            if run.task[0] != _NEW_X:
                return False
            # scipy's loop: count the iteration, then stop at maxiter or maxfun
            run.nit += 1
            if run.nit >= maxiter:
                run.task[:] = (_STOP, _MAXITER_REACHED)
            elif run.nfev > MAXFUN:
                run.task[:] = (_STOP, _MAXFUN_REACHED)

    def result(run: _Run) -> Minimum:
        return Minimum(run.x, run.f, run.g, run.nit, run.nfev, bool(run.task[0] == _CONVERGED))

    def going(i: int) -> bool:
        """Advance slot i; while its run stops and ``then`` gives a next start, begin that."""
        while not advance(runs[i]):
            nxt = None if then is None else then(i, result(runs[i]))
            if nxt is None:
                return False
            runs[i] = _Run(np.array(nxt, dtype=np.float64).ravel(), maxcor)
        return True

    waiting = [i for i in range(len(runs)) if going(i)]
    while waiting:
        values = evaluate(waiting, [runs[i].x for i in waiting])
        for i, (f, g) in zip(waiting, values, strict=True):
            runs[i].f = float(f)
            runs[i].g = np.ascontiguousarray(g, dtype=np.float64)
            runs[i].nfev += 1
        waiting = [i for i in waiting if going(i)]
    return [result(run) for run in runs]
