"""Deterministic fits: the grid search that both fits of the cost model's knobs use, to published
training throughputs (hexiseq/validation/fidelity.py) and to measured steps (hexiseq/calibrate),
and the damped least squares that refines a grid's best node (`least_squares`).

No randomness, no timing: the same inputs give the same fit on every machine. It depends on
nothing in hexiseq.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np


def _grid(lo: float, hi: float, step: float) -> list[float]:
    n = int(math.floor((hi - lo) / step + 1e-9))
    return [round(lo + step * i, 6) for i in range(n + 1)]


def grid_search(
    loss: Callable[..., float],
    bounds: Sequence[tuple[float, float]],
    steps: Sequence[float] = (0.05, 0.01, 0.002),
    reach: float = 1.0,
) -> tuple[tuple[float, ...], float]:
    """Minimise loss(*x) over a box: a full grid at steps[0], then grids at each next step over
    ± `reach` × the previous step around the best node (reach 0.5 with halving steps: 3 nodes per
    axis, for boxes of several dimensions). Deterministic; ties go to the first node."""
    best: tuple[float, ...] | None = None
    span = 0.0
    for i, step in enumerate(steps):
        axes = [
            _grid(lo, hi, step) if i == 0 else _grid(max(lo, b - span), min(hi, b + span), step)
            for (lo, hi), b in zip(bounds, best or [0.0] * len(bounds))
        ]
        if i > 0:  # keep the previous best node on the refined grid
            axes = [sorted(set(ax) | {b}) for ax, b in zip(axes, best)]
        best = min(itertools.product(*axes), key=lambda x: (loss(*x), x))
        span = step * reach
    return best, loss(*best)


def least_squares(
    residuals: Callable[[Sequence[float]], Sequence[float]],
    start: Sequence[float],
    bounds: Sequence[tuple[float, float]],
    iterations: int = 100,
    step: float = 1e-6,
) -> tuple[tuple[float, ...], float]:
    """Minimise Σ residuals(x)² inside a box from `start` (a grid search's best node, say): damped
    Gauss-Newton (Levenberg-Marquardt) with forward-difference derivatives, each step clipped to the
    box. A grid converges only as fast as its finest step and can stop on a ridge between nodes when
    the parameters trade off; this follows the ridge. Deterministic: no randomness, a fixed order of
    evaluations. Returns (x, Σ residuals²); never worse than `start`."""
    lo = np.array([b[0] for b in bounds], dtype=float)
    hi = np.array([b[1] for b in bounds], dtype=float)
    x = np.clip(np.array(start, dtype=float), lo, hi)
    r = np.asarray(residuals(tuple(x)), dtype=float)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = step * max(1.0, abs(x[j]))
            xp = x.copy()
            xp[j] = x[j] + h if x[j] + h <= hi[j] else x[j] - h
            jac[:, j] = (np.asarray(residuals(tuple(xp)), dtype=float) - r) / (xp[j] - x[j])
        a, g = jac.T @ jac, jac.T @ r
        while damping < 1e12:
            dx = np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -g)
            xn = np.clip(x + dx, lo, hi)
            rn = np.asarray(residuals(tuple(xn)), dtype=float)
            if float(rn @ rn) < cost:
                break
            damping *= 10.0
        else:
            break  # no damped step lowers the cost: a minimum (of the box)
        gain = cost - float(rn @ rn)
        x, r, cost = xn, rn, float(rn @ rn)
        damping = max(damping / 10.0, 1e-12)
        if gain <= 1e-15 * max(cost, 1e-300) or np.abs(dx).max() < 1e-10:
            break
    return tuple(float(v) for v in x), cost
