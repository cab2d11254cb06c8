"""Every duration of one training iteration of a plan, per rank, as a *linear form* of the plan's
quantities: what the step replay (simulate.py) schedules and what the planner's optimization model
(planner/layout_model.py) constrains. One home for the durations: the replay evaluates these forms at a
plan, the model writes the same forms over its variables.

Quantities (the basis): s_r (tokens of rank r), L_g (chunk length of group g), L_g² and the
products Q_gh = L_g·L_h (h != g) that the attention of exchange rounds needs. Every duration is
const + Σ coef·quantity; `Coefficients` holds the coefficients, `Durations` the values at a point.

Seconds; [R] arrays per layer pass unless noted; [R, k] per exchange round (column j = round j,
0 = the own chunks):

    lin_pre_f / lin_post_f     forward linear parts: s·(matmul + elementwise) per token (kernels.py)
    lin_pre_b / lin_post_b     backward: 2× the matmuls + the backward elementwise kernels, plus the
                               forward again under "selective" (its checkpointed parts rerun)
    a2a_in / a2a_out           the ragged all-to-alls: α + max(send, recv); send and recv are sums
                               over the group's peers (comm.py's byte counts); the same both ways
    att [R, k]                 forward attention of round j: η·((pairs + waste)·pair_s + rows·row_s),
                               pairs = L_g(2L_g + 1) in round 0, 2·L_g·L_h for the source h after
    xc_f [R, k]                KV transfer of round j ≥ 1: α_j + max(recv_j, send_j), recv ∝ L_source,
                               send ∝ L_own (the exchange schedule's bytes over each link)
    xc_b [R, k]                backward round: 2α_j + recv_j + send_j (K/V in, dK/dV back)
    link [R, k]                recv_j + send_j: link seconds for the overlap slowdown
    head                       LM head + loss, forward + backward, per sequence
    optimizer                  the optimizer step, per iteration
    window_f / window_b / _h   compute-kernel seconds of one forward / backward layer / the head's
                               backward (2/3): what a prefetched parameter collective hides behind

The linear parts, the attention rounds, the all-to-alls and the optimizer also carry a constant: their
operators × the device's per-operator time (operators.py; 0 on the catalog's GPUs). The windows leave it
out; the all-to-alls' is held in a2a_lat, beside their latency.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .arrays import PlanArrays, plan_arrays
from .comm import ParamComm, a2a_in_bytes, a2a_out_bytes, intra_group_pairs, kv_bytes, param_collectives
from .kernels import CostOptions, attention_rows, attention_waste
from .operators import OperatorCharges, operator_charges
from .policy import RecomputeRule, rule_of


@dataclass(frozen=True, eq=False)
class Coefficients:
    """The durations of a plan's structure (groups, ring order, heads) as linear forms (module doc).
    Rank-level arrays; `pair_src` is the source group of each (rank, round)."""

    a: PlanArrays
    rule: RecomputeRule
    # linear parts and the head: seconds per token of the rank's own shard
    pre_f: np.ndarray
    post_f: np.ndarray
    pre_b: np.ndarray
    post_b: np.ndarray
    matmul_f: np.ndarray  # the matmul share of pre_f + post_f
    matmul_b: np.ndarray  # ... of pre_b + post_b
    head: np.ndarray
    # all-to-all: lat [R]; self-terms [R] (seconds per own token); peer terms: sparse (row r, col q) pairs
    a2a_lat: np.ndarray
    in_send: np.ndarray  # × s_r
    out_recv: np.ndarray  # × s_r
    peer_r: np.ndarray  # [pairs] rank r whose duration ...
    peer_q: np.ndarray  # [pairs] ... depends on peer q's tokens
    in_recv: np.ndarray  # [pairs] seconds per token of s_q in r's in-recv
    out_send: np.ndarray  # [pairs] seconds per token of s_q in r's out-send
    # attention [R, k]: seconds per unit of the round's product (L_g² in round 0, L_g·L_h after) and per unit L_g
    att_prod: np.ndarray
    att_lin: np.ndarray
    # exchange [R, k]: latency, recv seconds per token of L_source, send seconds per token of L_own
    x_lat: np.ndarray
    x_recv: np.ndarray
    x_send: np.ndarray
    x_recv_bytes: np.ndarray  # bytes per token of L_source (memory.py's buffers)
    slowdown: np.ndarray  # [R]
    optimizer: np.ndarray  # [R] seconds
    params: ParamComm
    attn_bwd_factor: float
    layers: int
    batch: int
    comm: bool  # False with CostOptions(ignore_comm=True): no transfers, so nobody waits
    ops: OperatorCharges  # seconds per executed piece (operators.py): added by evaluate, not in the windows

    @functools.cached_property
    def fixed(self) -> dict[str, np.ndarray]:
        """[R] the constant seconds of each own-work part (path items' `part` names)."""
        o = self.ops
        zero = np.zeros(self.a.R)
        return {
            "pre_f": o.linear_forward,
            "post_f": o.linear_forward,
            "pre_b": o.linear_backward,
            "post_b": o.linear_backward,
            "head": zero,
        }

    @functools.cached_property
    def pair_src(self) -> np.ndarray:
        """[R, k] the source group of rank r's round j."""
        return self.a.src[self.a.grp]


@dataclass(frozen=True)
class Durations:
    """Values of the forms at one point (module doc)."""

    c: Coefficients
    lin_pre_f: np.ndarray
    lin_post_f: np.ndarray
    lin_pre_b: np.ndarray
    lin_post_b: np.ndarray
    matmul_f: np.ndarray
    matmul_b: np.ndarray
    a2a_in: np.ndarray  # [R, 2] pieces (send, recv): the duration is their max
    a2a_out: np.ndarray  # [R, 2]
    att_f: np.ndarray  # [R, k] without the overlap slowdown
    att_b: np.ndarray
    xc_f: np.ndarray  # [R, k, 2] pieces (recv, send)
    xc_b: np.ndarray  # [R, k]
    link: np.ndarray  # [R, k]
    head: np.ndarray
    optimizer: np.ndarray
    window_f: np.ndarray
    window_b: np.ndarray
    window_h: np.ndarray
    recv_bytes: np.ndarray  # [R, k]

    @property
    def a(self) -> PlanArrays:
        return self.c.a

    @property
    def rule(self) -> RecomputeRule:
        return self.c.rule

    @property
    def slowdown(self) -> np.ndarray:
        return self.c.slowdown

    @property
    def params(self) -> ParamComm:
        return self.c.params

    @property
    def layers(self) -> int:
        return self.c.layers

    @property
    def batch(self) -> int:
        return self.c.batch

    @property
    def comm(self) -> bool:
        return self.c.comm


def coefficients(
    a: PlanArrays, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> Coefficients:
    """The linear forms of every duration for the structure in `a` (groups, ring order, heads, devices)."""
    rule = rule_of(workload)
    w, R, k, d = a.work, a.R, a.k, model.head_dim
    rerun = rule.backward_factors().rerun_linear
    off = not options.ignore_comm
    # attention per round: pairs = 2·L_g² + L_g (round 0) or 2·L_g·L_h; waste and rows ∝ L_g (kernels.py)
    unit = np.ones(a.k)
    rows = np.stack(attention_rows(unit, k), axis=1)[a.grp]  # [R, k] per unit L_g
    waste = np.stack(attention_waste(unit, k, w.tile), axis=1)[a.grp]
    att_prod = 2.0 * a.eta[:, None] * w.pair[:, None] * np.ones((R, k))
    att_lin = a.eta[:, None] * ((waste + np.eye(k)[0][None, :]) * w.pair[:, None] + rows * w.row[:, None])
    # all-to-all
    src, dst = intra_group_pairs(a)
    zeros = np.zeros(R)
    if off and len(src):
        inv = 1.0 / a.bw[src, dst]
        lat_a2a = np.zeros(R)
        np.maximum.at(lat_a2a, src, a.lat[src, dst])
        in_send = np.bincount(src, a2a_in_bytes(1.0, a.eta[dst], a.kvc[dst], d) * inv, minlength=R)
        out_recv = np.bincount(dst, a2a_out_bytes(1.0, a.eta[src], d) * inv, minlength=R)
        # r = dst receives in-bytes from q = src: s_q·(η_r + 2κ_r)·d; r = src sends out-bytes to q = dst: s_q·η_r·d
        peer_r = np.concatenate([dst, src])
        peer_q = np.concatenate([src, dst])
        in_recv = np.concatenate([a2a_in_bytes(1.0, a.eta[dst], a.kvc[dst], d) * inv, np.zeros(len(src))])
        out_send = np.concatenate([np.zeros(len(src)), a2a_out_bytes(1.0, a.eta[src], d) * inv])
    else:
        lat_a2a, in_send, out_recv = zeros, zeros, zeros
        peer_r = peer_q = np.zeros(0, dtype=np.int64)
        in_recv = out_send = np.zeros(0)
    # exchange, from the schedule: each transfer carries kv·(1 + both)·L_source tokens of K and V
    x_lat, x_recv, x_send, x_rb = (np.zeros((R, k)) for _ in range(4))
    t = a.table
    mult = 1.0 + t.both_chunks  # tokens per token of L_source: 1 or 2 (zigzag need)
    if off and k > 1 and len(t.src):
        per = kv_bytes(t.num_kv_heads * mult, d)  # bytes per token of L_source
        secs = per / a.bw[t.src, t.dst]
        n = R * k
        into, outof = t.dst * k + t.round, t.src * k + t.round
        x_recv = np.bincount(into, secs, minlength=n).reshape(R, k)
        x_send = np.bincount(outof, secs, minlength=n).reshape(R, k)
        x_rb = np.bincount(into, per, minlength=n).reshape(R, k)
        lat = np.zeros(n)
        np.maximum.at(lat, into, a.lat[t.src, t.dst])
        np.maximum.at(lat, outof, a.lat[t.src, t.dst])
        x_lat = lat.reshape(R, k)
    elif k > 1 and len(t.src):
        x_rb = np.bincount(
            t.dst * k + t.round, kv_bytes(t.num_kv_heads * mult, model.head_dim), minlength=R * k
        ).reshape(R, k)
    local_params = model.param_count / (options.shards(R) if workload.param_sharding == "zero3" else 1)
    ops = operator_charges(w.operator, a.grp, a.eta, k, rule)
    return Coefficients(
        a=a,
        rule=rule,
        pre_f=w.pre_fwd,
        post_f=w.post_fwd,
        pre_b=w.pre_bwd + rerun * w.pre_fwd,
        post_b=w.post_bwd + rerun * w.post_fwd,
        matmul_f=w.pre_matmul + w.post_matmul,
        matmul_b=(2.0 + rerun) * (w.pre_matmul + w.post_matmul),
        head=w.head,
        a2a_lat=lat_a2a + ops.all_to_all,
        in_send=in_send,
        out_recv=out_recv,
        peer_r=peer_r,
        peer_q=peer_q,
        in_recv=in_recv,
        out_send=out_send,
        att_prod=att_prod,
        att_lin=att_lin,
        x_lat=x_lat,
        x_recv=x_recv,
        x_send=x_send,
        x_recv_bytes=x_rb,
        slowdown=w.overlap_slowdown,
        optimizer=local_params * w.optimizer + ops.step,
        params=param_collectives(a.bw, a.lat, model, workload) if off else ParamComm(workload.param_sharding),
        attn_bwd_factor=w.attn_bwd_factor,
        layers=model.layers,
        batch=workload.global_batch,
        comm=off,
        ops=ops,
    )


def evaluate(
    c: Coefficients, s: np.ndarray, L: np.ndarray, prod: np.ndarray | None = None, prod_window: np.ndarray | None = None
) -> Durations:
    """The durations at tokens s [R] and chunk lengths L [k]; `prod` [k, k] gives the products the
    attention uses (default: the exact L_g² on the diagonal and L_g·L_h elsewhere; the planner's model
    passes under-estimates of them, and over-estimates as `prod_window` for the windows a collective
    hides behind, which count against the time)."""
    a = c.a
    prod = np.outer(L, L) if prod is None else prod
    src = c.pair_src
    Lg = L[a.grp]
    att = c.att_prod * prod[a.grp[:, None], src] + c.att_lin * Lg[:, None]
    att_w = att if prod_window is None else c.att_prod * prod_window[a.grp[:, None], src] + c.att_lin * Lg[:, None]
    a2a_in = np.stack(
        [c.a2a_lat + c.in_send * s, c.a2a_lat + np.bincount(c.peer_r, c.in_recv * s[c.peer_q], minlength=a.R)], axis=1
    )
    a2a_out = np.stack(
        [c.a2a_lat + np.bincount(c.peer_r, c.out_send * s[c.peer_q], minlength=a.R), c.a2a_lat + c.out_recv * s], axis=1
    )
    recv, send = c.x_recv * L[src], c.x_send * Lg[:, None]
    xc_f = np.stack([c.x_lat + recv, c.x_lat + send], axis=2)
    xc_f[:, 0, :] = 0.0
    xc_b = 2.0 * c.x_lat + recv + send
    xc_b[:, 0] = 0.0
    pre_f, post_f, pre_b, post_b = c.pre_f * s, c.post_f * s, c.pre_b * s, c.post_b * s
    window_f = pre_f + post_f + att_w.sum(axis=1)
    window_b = (
        pre_b + post_b + c.attn_bwd_factor * att_w.sum(axis=1) + c.rule.backward_factors().replay_layer * window_f
    )
    head = c.head * s
    o = c.ops  # the per-operator constants, outside the windows (module doc)
    return Durations(
        c=c,
        lin_pre_f=pre_f + o.linear_forward,
        lin_post_f=post_f + o.linear_forward,
        lin_pre_b=pre_b + o.linear_backward,
        lin_post_b=post_b + o.linear_backward,
        matmul_f=c.matmul_f * s,
        matmul_b=c.matmul_b * s,
        a2a_in=a2a_in,
        a2a_out=a2a_out,
        att_f=att + o.round_forward[:, None],
        att_b=c.attn_bwd_factor * att + o.round_backward[:, None],
        xc_f=xc_f,
        xc_b=xc_b,
        link=recv + send,
        head=head,
        optimizer=c.optimizer,
        window_f=window_f,
        window_b=window_b,
        window_h=head * (2.0 / 3.0),
        recv_bytes=c.x_recv_bytes * L[src],
    )


def exact_products(L: np.ndarray) -> np.ndarray:
    """[k, k] the products round j's attention uses at chunk lengths L: L_g·L_h, and L_g² on the diagonal."""
    return np.outer(L, L)


def durations(
    plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> Durations:
    """Validate the plan and compute every duration of the iteration (module doc)."""
    rule_of(workload)  # refuses "auto" before any work
    a = plan_arrays(plan, cluster, model, workload, options)
    return evaluate(coefficients(a, model, workload, options), a.s, a.L)
