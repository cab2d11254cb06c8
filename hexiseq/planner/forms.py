"""The linear form of a critical path of the step replay over a layout's variables.

The replay (costmodel/simulate.py, `trace=True`) gives each pass kind's critical path as a list of
typed items (costmodel/paths.py), each one duration of durations.py. Here every item becomes its
linear form of the chunk blocks n (per group) and the token shards s (per class of identical
ranks), in seconds: the same coefficients the replay evaluates, so at a plan the form is the path's
length exactly. The attention of several rounds is summed as tightly as linear forms allow, with
the products of chunk lengths estimated by planner/products.py over the model's box.

A form is kept as numpy arrays while a cut is assembled (fast) and becomes one Pyomo expression in
planner/layout_model.py, with its numbers kept beside it (`LinearRow`) for the solver (planner/lp.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from ..costmodel.durations import Coefficients
from ..costmodel.paths import (
    AllToAllPiece,
    AttentionRound,
    BackwardTransfer,
    Constant,
    ExposedCollective,
    ForwardTransfer,
    OverlapSlowdown,
    OwnWork,
    PathItem,
)
from ..errors import HexiSeqError
from .products import add_product_estimate


class LinearRow(NamedTuple):
    """A row of a layout's model as numbers: lower ≤ Σ coefs·variables ≤ upper (±inf: no bound),
    each variable once."""

    variables: list
    coefs: list[float]
    lower: float
    upper: float


class LinearForm:
    """const + coef_n·n + coef_s·s (seconds; n in blocks per group, s in tokens per class)."""

    __slots__ = ("const", "n", "s")

    def __init__(self, k: int, C: int):
        self.const = 0.0
        self.n = np.zeros(k)
        self.s = np.zeros(C)


class PathForms:
    """Linear forms of the replay's path items for one layout's coefficients (module doc): `cls` is
    the class of every rank, the shard variable its form's s-coefficient goes to."""

    def __init__(self, coef: Coefficients, cls: np.ndarray, block_size: int, seq_len: int):
        self.coef, self.cls = coef, cls
        self.k = coef.a.k
        self.C = int(cls.max()) + 1
        self.block_size, self.seq_len = block_size, seq_len
        pr = coef.peer_r
        self._peers = [np.nonzero(pr == r)[0] for r in range(coef.a.R)]

    def path(self, items: Iterable[PathItem], n0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> LinearForm:
        """The form of a whole path: an under-estimate of its length, linear in (n, s), tight at the
        point n0 where it can be and exact at a plan (the box [lo, hi] collapsed onto it)."""
        f = LinearForm(self.k, self.C)
        att: dict[tuple[bool, int], set] = {}
        for it in items:
            if isinstance(it, AttentionRound):
                att.setdefault((it.backward, int(it.rank)), set()).add(int(it.round))
            else:
                self.item(f, it)
        ops = self.coef.ops
        for (backward, r), rounds in att.items():
            self.attention_sum(f, self.coef.attn_bwd_factor if backward else 1.0, r, rounds, n0, lo, hi)
            f.const += len(rounds) * float((ops.round_backward if backward else ops.round_forward)[r])
        return f

    def item(self, f: LinearForm, it: PathItem) -> None:
        """f += the linear form (seconds) of one path item of simulate.py (attention: `attention_sum`)."""
        c, B = self.coef, float(self.block_size)
        match it:
            case Constant(seconds):
                f.const += seconds
            case ExposedCollective(chain, r, comm):
                f.const += comm
                self.window(f, -1.0, chain, int(r))
            case OwnWork(part, r):
                f.s[self.cls[r]] += getattr(c, part)[r]
                f.const += c.fixed[part][r]
            case AllToAllPiece(direction, r, piece):
                f.const += c.a2a_lat[r]
                if (direction == "in") == (piece == 0):  # in: piece 0 is the own send; out: piece 1 is the own recv
                    f.s[self.cls[r]] += c.in_send[r] if direction == "in" else c.out_recv[r]
                else:
                    sel = self._peers[r]
                    coef = (c.in_recv if direction == "in" else c.out_send)[sel]
                    np.add.at(f.s, self.cls[c.peer_q[sel]], coef)
            case OverlapSlowdown(r, j, backward):
                g, h = int(c.a.grp[r]), int(c.pair_src[r, j])
                rc, sc = c.x_recv[r, j] * B, c.x_send[r, j] * B  # per block of L_h, of L_g
                both = 2.0 if backward else 1.0  # backward: K/V in and dK/dV back
                f.n[h] += both * c.slowdown[r] * rc
                f.n[g] += both * c.slowdown[r] * sc
            case ForwardTransfer(r, j, piece):
                f.const += c.x_lat[r, j]
                if piece == 0:
                    f.n[int(c.pair_src[r, j])] += c.x_recv[r, j] * B
                else:
                    f.n[int(c.a.grp[r])] += c.x_send[r, j] * B
            case BackwardTransfer(r, j):
                f.const += 2 * c.x_lat[r, j]
                f.n[int(c.pair_src[r, j])] += c.x_recv[r, j] * B
                f.n[int(c.a.grp[r])] += c.x_send[r, j] * B
            case _:  # pragma: no cover - a new item kind needs its linear form here
                raise HexiSeqError(f"the model has no linear form for path item {it!r}")

    def attention_sum(
        self,
        f: LinearForm,
        scale: float,
        r: int,
        rounds: set,
        n0: np.ndarray,
        lo: np.ndarray | None = None,
        hi: np.ndarray | None = None,
    ) -> None:
        """f += scale × Σ_{j in rounds} of rank r's forward attention, as tight as linear forms allow:
        the products of all rounds sum to L_g·S/2 exactly (the chunks cover the sequence), so a complete
        set is exact, and a set missing few rounds is the total minus over-estimates of the rest (over
        the box [lo, hi]; a complete set needs none)."""
        c, g, k, B = self.coef, int(self.coef.a.grp[r]), self.k, float(self.block_size)
        f.n[g] += scale * B * sum(c.att_lin[r, j] for j in rounds)
        ap = scale * c.att_prod[r, 0]
        missing = [j for j in range(k) if j not in rounds]
        if len(missing) < len(rounds):
            f.n[g] += ap * B * (self.seq_len / 2.0)  # Σ_h L_g·L_h = L_g·S/2
            for j in missing:
                add_product_estimate(f, -ap, g, int(c.pair_src[r, j]), True, n0, lo, hi, self.block_size)
        else:
            for j in rounds:
                add_product_estimate(f, ap, g, int(c.pair_src[r, j]), False, n0, lo, hi, self.block_size)

    def window(self, f: LinearForm, scale: float, chain: str, r: int) -> None:
        """f += scale × a rank's compute window of chain "f", "b" or "h" (exact: it sums every round's
        attention)."""
        c, cl = self.coef, self.cls[r]
        if chain == "h":
            f.s[cl] += scale * (2.0 / 3.0) * c.head[r]
            return
        again = c.rule.backward_factors()
        fwd, att = (c.pre_f[r] + c.post_f[r]), 1.0
        if chain == "b":
            f.s[cl] += scale * ((c.pre_b[r] + c.post_b[r]) + again.replay_layer * fwd)
            att = again.attention(c.attn_bwd_factor)
        else:
            f.s[cl] += scale * fwd
        self.attention_sum(f, scale * att, r, set(range(self.k)), np.zeros(self.k))
