"""The box of a layout's model: the chunk lengths every plan of interest lies in.

The products' estimates (planner/products.py) are as tight as the box is small, and the box may
shrink to what can still beat the best step time known: no plan outside it is faster. Two ways:

- `box_from_bound`: from every rank's own work alone (no LP), each chunk length's largest value
  that a step time ≤ the bound allows, and the least that the others then leave;
- `tighten_box`: optimality-based bound tightening, the least and the largest value of every chunk
  variable over the model's constraints with T ≤ the bound (two LPs per variable).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..costmodel.durations import Coefficients
from ..costmodel.paths import Barrier, Pass, Step


class BoxedModel(Protocol):
    """What bound tightening needs of a layout's model (planner/layout_model.py's LayoutModel)."""

    m: Any  # the Pyomo model: chunk variables m.n
    NV: int  # chunk variables
    k: int  # groups
    orbit_groups: list[np.ndarray]  # the groups of every chunk variable
    box_lo: np.ndarray
    box_hi: np.ndarray

    def limit_time(self, best_s: float | None) -> None: ...

    def weigh_chunk(self, o: int, weight: float) -> None: ...

    def solve_lp(self) -> tuple[str, float | None]: ...

    def set_box(self, lo: Sequence[float], hi: Sequence[float]) -> None: ...


def box_from_bound(
    coef: Coefficients, schedule: Sequence[Step], seq_len: int, block_size: int, nb: int, best_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Chunk lengths (blocks; `nb` in all) no plan of the layout with a step time ≤ `best_s` can
    leave: each rank's own work is at least α_r·L_g + β_r·s_r plus the exposed collectives and the
    optimizer (durations.py's forms summed over the passes of `schedule`; waits, transfers and
    all-to-alls only add), and the group's shards cover 2·L_g, so L_g ≤ U·Σ_r 1/β_r / (2 + Σ_r α_r/β_r)
    and ≤ U/α_r."""
    cf, a, B, k = coef, coef.a, block_size, coef.a.k
    passes = [st for st in schedule if isinstance(st, Pass)]
    n_f = sum(st.count for st in passes if st.chain == "f")
    n_b = sum(st.count for st in passes if st.chain == "b")
    n_h = sum(st.count for st in passes if st.chain == "h")
    const = sum(st.count * st.seconds for st in schedule if isinstance(st, Barrier)) + float(cf.optimizer.max())
    U = best_s - const
    # forward attention of a rank per unit L_g: Σ_j att_prod·L_h (Σ_h L_h = S/2) + Σ_j att_lin
    att = cf.att_prod[:, 0] * (seq_len / 2.0) + cf.att_lin.sum(axis=1)
    again = cf.rule.backward_factors()
    alpha = att * (n_f + n_b * again.attention(cf.attn_bwd_factor))
    beta = (cf.pre_f + cf.post_f) * (n_f + n_b * again.replay_layer) + (cf.pre_b + cf.post_b) * n_b + cf.head * n_h
    hi = np.zeros(k)
    for g in range(k):
        rr = np.nonzero(a.grp == g)[0]
        cap = U * np.sum(1.0 / beta[rr]) / (2.0 + np.sum(alpha[rr] / beta[rr]))
        pos = alpha[rr] > 0
        if pos.any():
            cap = min(cap, float(np.min(U / alpha[rr][pos])))
        hi[g] = max(cap, 0.0) / B
    hi = np.minimum(np.floor(hi + 1e-9), nb - (k - 1))
    lo = np.maximum(1.0, nb - (hi.sum() - hi))
    return lo, hi


def tighten_box(lm: BoxedModel, best_s: float) -> bool:
    """Optimality-based bound tightening of `lm`'s box: the least and the largest chunk length of
    every variable over the model's constraints with T ≤ best_s, rounded inwards to whole blocks.
    Every plan at least as fast as `best_s` satisfies all of them (its cuts hold in the current box),
    so the new box keeps every such plan, and its McCormick planes are tighter; an empty box proves
    that no plan of the layout reaches `best_s` (the rounding makes this an argument about integer
    plans, stronger than the LP's). True when the box shrank."""
    if any(lm.m.n[o].fixed for o in range(lm.NV)):
        return False
    lm.limit_time(best_s)
    lo, hi = lm.box_lo.copy(), lm.box_hi.copy()
    try:
        for o, gs in enumerate(lm.orbit_groups):
            for sign, target in ((1.0, lo), (-1.0, hi)):
                lm.weigh_chunk(o, sign)
                st, val = lm.solve_lp()
                lm.weigh_chunk(o, 0.0)
                if val is None:  # no plan at least this fast in the box
                    lm.box_lo, lm.box_hi = np.ones(lm.k), np.zeros(lm.k)
                    return True
                v = sign * float(val)
                target[gs] = np.ceil(v - 1e-6) if sign > 0 else np.floor(v + 1e-6)  # chunk lengths are whole blocks
    finally:
        lm.limit_time(None)
    shrank = bool(np.any(lo > lm.box_lo + 0.5) or np.any(hi < lm.box_hi - 0.5))
    if np.any(lo > hi):
        lm.box_lo, lm.box_hi = lo, hi
        return True
    lm.set_box(lo, hi)
    return shrank
