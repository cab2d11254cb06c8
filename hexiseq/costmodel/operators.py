"""Per-operator device time: what each executed operator costs beyond its FLOPs and bytes.

A device's `op_overhead_us` (data/gpus*.yaml: 0 on the catalog's GPUs, whose efficiencies are fitted
on whole published steps; fitted by `hexiseq calibrate` on the CPU emulation) times the executor's
operators per piece of a step (data/operators.yaml, specs/operators.py) gives one constant per
piece: durations.py adds them to the pieces (a linear part, an attention round, an all-to-all, the
optimizer step), so the replay and the planner's model charge them where the pieces run, and the
compute windows that hide parameter collectives do not count them (a conservative choice: less
hidden). A plan whose ranks run many small operators (many micro-steps, rounds and all-to-alls on
few tokens) pays for each of them.

`pieces_per_step` counts the pieces each rank runs in one step; the counts' fit
(calibrate/operator_counts.py) regresses the counted operators on them, and `operators_per_step` is
the total the charges imply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.operators import COUNT_FIELDS, OperatorCounts, operator_counts
from .policy import RecomputeRule


@dataclass(frozen=True)
class OperatorCharges:
    """Seconds per executed piece on each rank ([R] arrays): the operators × the device's overhead."""

    linear_forward: np.ndarray  # one forward linear part
    linear_backward: np.ndarray  # one backward linear part, the selective rerun's operators included
    round_forward: np.ndarray  # one attention round (ranks without heads run none: 0)
    round_backward: np.ndarray
    all_to_all: np.ndarray  # one ragged all-to-all (ranks of head-parallel groups of 2+; else 0)
    step: np.ndarray  # the optimizer step


def _masks(grp: np.ndarray, eta: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ranks with query heads, ranks in a head-parallel group of two or more)."""
    sizes = np.bincount(grp, minlength=k)
    return (eta > 0).astype(float), (sizes[grp] > 1).astype(float)


def operator_charges(
    op_s: np.ndarray,
    grp: np.ndarray,
    eta: np.ndarray,
    k: int,
    rule: RecomputeRule,
    counts: OperatorCounts | None = None,
) -> OperatorCharges:
    """The charges of the ranks (module doc): `op_s` [R] seconds per operator, `grp` [R] each rank's
    group, `eta` [R] its query heads, `k` the groups."""
    n = counts if counts is not None else operator_counts()
    heads, hp = _masks(grp, eta, k)
    rerun = rule.backward_factors().rerun_linear
    return OperatorCharges(
        linear_forward=op_s * n.linear_forward,
        linear_backward=op_s * (n.linear_backward + rerun * n.linear_forward),
        round_forward=op_s * heads * n.round_forward,
        round_backward=op_s * heads * n.round_backward,
        all_to_all=op_s * hp * n.all_to_all,
        step=op_s * n.step,
    )


def pieces_per_step(
    grp: np.ndarray, eta: np.ndarray, k: int, rule: RecomputeRule, layers: int, batch: int
) -> dict[str, np.ndarray]:
    """Executed pieces of each kind per rank in one step of `batch` sequences (the fields of
    OperatorCounts): every layer pass runs two linear parts, k attention rounds and two all-to-alls;
    "full" recompute runs each layer's forward again, "selective" each linear part's forward inside
    its backward."""
    again = rule.backward_factors()
    heads, hp = _masks(grp, eta, k)
    fwd = batch * layers * (1.0 + again.replay_layer)  # forward layer passes, the full replay included
    bwd = float(batch * layers)
    one = np.ones(len(grp))
    return {
        "linear_forward": one * 2.0 * (fwd + again.rerun_linear * bwd),
        "linear_backward": one * 2.0 * bwd,
        "round_forward": heads * k * fwd,
        "round_backward": heads * k * bwd,
        "all_to_all": hp * 2.0 * (fwd + bwd),
        "step": one,
    }


def operators_per_step(
    grp: np.ndarray,
    eta: np.ndarray,
    k: int,
    rule: RecomputeRule,
    layers: int,
    batch: int,
    counts: OperatorCounts | None = None,
) -> np.ndarray:
    """[R] the operators each rank runs in one step, as the counts model them."""
    n = counts if counts is not None else operator_counts()
    pieces = pieces_per_step(grp, eta, k, rule, layers, batch)
    return sum(pieces[f] * getattr(n, f) for f in COUNT_FIELDS)
