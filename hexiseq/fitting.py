"""Deterministic fits: the grid search that both fits of the cost model's knobs use, to published
training throughputs (hexiseq/validation/fidelity.py) and to measured steps (hexiseq/calibrate).

Pure Python, no randomness, no timing: the same inputs give the same fit on every machine. It
depends on nothing in hexiseq.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence


def _grid(lo: float, hi: float, step: float) -> list[float]:
    n = int(math.floor((hi - lo) / step + 1e-9))
    return [round(lo + step * i, 6) for i in range(n + 1)]


def grid_search(
    loss: Callable[..., float],
    bounds: Sequence[tuple[float, float]],
    steps: Sequence[float] = (0.05, 0.01, 0.002),
) -> tuple[tuple[float, ...], float]:
    """Minimise loss(*x) over a box: a full grid at steps[0], then grids at each next step over
    ± the previous step around the best node. Deterministic; ties go to the first node."""
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
        span = step
    return best, loss(*best)
