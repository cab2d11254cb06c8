"""Linear estimates of the products of chunk lengths the exchange rounds' attention needs.

Round j's attention of a rank of group g costs a multiple of L_g·L_h (h the round's source group;
L_g² in round 0): bilinear for h != g, convex for h = g. A path constraint of the layout's model
(planner/forms.py) needs an under-estimate of each product it adds and an over-estimate of each it
subtracts, linear in the chunk blocks n: McCormick's planes over the box lo ≤ n ≤ hi (the one
tight at the current point n0), the tangent of L_g² at n0 (under), its secant over the box (over).
Collapsing the box onto a plan makes every estimate exact.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class FormOverBlocks(Protocol):
    """What an estimate is added to: a linear form's constant and its coefficients per chunk block
    (planner/forms.py's LinearForm)."""

    const: float
    n: np.ndarray


def add_product_estimate(
    f: FormOverBlocks,
    scale: float,
    g: int,
    h: int,
    over: bool,
    n0: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    block_size: int,
) -> None:
    """f += scale × an under- (or over-) estimate of L_g·L_h (tokens²) linear in n, tight at n0
    where it can be: McCormick's plane of the box [lo, hi], the tangent (under) or secant (over) of L_g²."""
    B2 = float(block_size) ** 2
    if g == h:
        if over:
            f.n[g] += scale * B2 * (lo[g] + hi[g])
            f.const -= scale * B2 * lo[g] * hi[g]
        else:
            x = float(n0[g])
            f.n[g] += scale * B2 * 2 * x
            f.const -= scale * B2 * x * x
        return
    planes = [(hi[g], lo[h]), (lo[g], hi[h])] if over else [(lo[g], lo[h]), (hi[g], hi[h])]
    vals = [a_ * n0[h] + b_ * n0[g] - a_ * b_ for a_, b_ in planes]
    a_, b_ = planes[int(np.argmin(vals) if over else np.argmax(vals))]
    f.n[h] += scale * B2 * a_
    f.n[g] += scale * B2 * b_
    f.const -= scale * B2 * a_ * b_
