"""Communication times: α–β model of every transfer a plan makes.

Units: bytes, bytes/s (the cluster's GB/s × 1e9, per direction), seconds. Activations travel in
bf16 (2 bytes per element). A message between ranks a and b of `nbytes` takes
α(a, b) + nbytes / β(a, b), with α, β from `ClusterSpec` (same node: the GPU link; across
nodes: the slower NIC; overrides win).

Assumptions (simple and stated):
- A rank's link is full duplex and shared by all its concurrent messages: the sending time of a
  rank is Σ nbytes/β over the messages it sends, the receiving time Σ nbytes/β over those it
  receives; a phase takes α + max(send, recv) for that rank (α = the largest latency among its
  partners: concurrent messages pay it once).

Ragged all-to-all inside group g (d = head_dim, κ_r = KV heads rank r touches, with duplication
for head ranges that split a KV head):
- "in" (before attention): rank r sends to r' the q, k, v of its s_r tokens for r''s heads:
  s_r · (η_r' + 2·κ_r') · d · 2 bytes.
- "out" (after attention): rank r sends to r' the output of its η_r heads for r''s tokens:
  s_r' · η_r · d · 2 bytes.
- The backward of each is the same exchange with directions swapped (gradients, same sizes).

KV exchange across groups, round j (1..k-1), group g receives from h = (g - j) mod k:
- g needs `need[g, h]` tokens of h's K/V (flops.needed_kv_tokens: L_h or 2·L_h, exactly).
- Receiver r (η_r > 0) needs KV heads [kv0_r, kv1_r). KV head κ of group h is served by the rank of
  h that holds query head κ·(H/H_kv) (its first query head); with whole-KV-head splits this is
  exactly "the head-range intersection" rule, with finer splits a KV head needed by two
  receivers is sent twice (duplication charged).
- Each (sender, receiver) transfer: (#KV heads) · need · d · 2 (K and V) · 2 bytes.
- Backward round: K/V travel again and dK/dV (bf16) travel back to their owners, so a rank's
  backward round moves recv + send bytes in each direction: time 2α + recv/β + send/β.

Collectives among all R ranks of the plan run as rings over the slowest link they cross
(min β, max α over all pairs of plan devices):
- all-reduce: 2(R-1)/R · bytes/β + 2(R-1)·α; all-gather, reduce-scatter: (R-1)/R · bytes/β + (R-1)·α.
- Parameter traffic, per collective call (P_layer = parameters of one layer; the "root" unit =
  everything else: embedding, final norm, LM head, P_root = P - Λ·P_layer; bf16 = 2 bytes each):
  "zero3" (FSDP, one unit per layer + the root unit): all-gather of a layer's weights
  AG = ring_allgather(2·P_layer), reduce-scatter of its gradients RS = the same formula, and
  AG_root, RS_root for the root unit; each call pays its own (R-1)·α.
  "replicated" (DDP): all-reduce of a layer's gradients AR = ring_allreduce(2·P_layer) (one
  bucket per layer), AR_root for the root unit.
  How much of it is hidden behind compute is the estimate's business (estimate.py, `param_exposed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import ModelSpec, Workload
from .arrays import PlanArrays

BF16 = 2.0


def ring_allreduce_s(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-reduce of `nbytes` over n ranks: 2(n-1)/n·bytes/bw + 2(n-1)·lat seconds."""
    return 0.0 if n <= 1 else 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * lat


def ring_allgather_s(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-gather (or reduce-scatter) of a `nbytes` result over n ranks: (n-1)/n·bytes/bw + (n-1)·lat."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw + (n - 1) * lat


def collective_link(a: PlanArrays) -> tuple[float, float]:
    """(bytes/s, seconds): the slowest bandwidth and largest latency between any two plan ranks."""
    if a.R <= 1:
        return float("inf"), 0.0
    return float(a.bw.min()), float(a.lat.max())  # the diagonal is inf / 0


@dataclass(frozen=True)
class ParamComm:
    """Seconds of one parameter collective call; the same on every rank (one global ring).
    Zero for the collectives the sharding does not use."""

    sharding: str  # "zero3" or "replicated"
    ag_layer: float = 0.0  # zero3: all-gather of one layer's bf16 weights
    rs_layer: float = 0.0  # zero3: reduce-scatter of one layer's bf16 gradients
    ag_root: float = 0.0  # zero3: the root unit (embedding, final norm, LM head)
    rs_root: float = 0.0
    ar_layer: float = 0.0  # replicated: all-reduce of one layer's bf16 gradients (one DDP bucket)
    ar_root: float = 0.0  # replicated: the root unit's gradients


def param_collectives(a: PlanArrays, model: ModelSpec, workload: Workload) -> ParamComm:
    """Per-call times of the parameter/gradient collectives of a plan (module doc)."""
    bw, lat = collective_link(a)
    layer = BF16 * model.params_per_layer
    root = BF16 * (model.param_count - model.layers * model.params_per_layer)
    if workload.param_sharding == "zero3":
        ag, ag_root = ring_allgather_s(layer, a.R, bw, lat), ring_allgather_s(root, a.R, bw, lat)
        return ParamComm("zero3", ag_layer=ag, rs_layer=ag, ag_root=ag_root, rs_root=ag_root)
    return ParamComm("replicated", ar_layer=ring_allreduce_s(layer, a.R, bw, lat), ar_root=ring_allreduce_s(root, a.R, bw, lat))


def _intra_group_pairs(a: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """All ordered (src, dst) rank pairs inside one group, src != dst, sorted by src."""
    size_r = a.gsize[a.grp]
    src = np.repeat(np.arange(a.R), size_r)
    offs = np.cumsum(size_r) - size_r
    within = np.arange(len(src)) - np.repeat(offs, size_r)
    dst = a.gstart[a.grp[src]] + within
    keep = src != dst
    return src[keep], dst[keep]


def alltoall_times(a: PlanArrays, model: ModelSpec) -> dict[str, np.ndarray]:
    """Per rank, one layer, forward: bandwidth seconds of the ragged all-to-alls and their latency.

    Keys: in_send, in_recv, out_send, out_recv (Σ bytes/β, seconds), lat (α, seconds),
    in_bytes_recv (bytes received by the "in" all-to-all; for memory).
    """
    R, d = a.R, model.head_dim
    src, dst = _intra_group_pairs(a)
    out = {key: np.zeros(R) for key in ("in_send", "in_recv", "out_send", "out_recv", "lat", "in_bytes_recv")}
    if len(src) == 0:
        return out
    inv = 1.0 / a.bw[src, dst]
    b_in = a.s[src] * (a.eta[dst] + 2.0 * a.kvc[dst]) * d * BF16
    b_out = a.s[dst] * a.eta[src] * d * BF16
    out["in_send"] = np.bincount(src, b_in * inv, minlength=R)
    out["in_recv"] = np.bincount(dst, b_in * inv, minlength=R)
    out["out_send"] = np.bincount(src, b_out * inv, minlength=R)
    out["out_recv"] = np.bincount(dst, b_out * inv, minlength=R)
    out["in_bytes_recv"] = np.bincount(dst, b_in, minlength=R)
    # src is sorted: the max latency of each rank's partners by reduceat over its block of pairs
    counts = np.bincount(src, minlength=R)
    has = counts > 0
    starts = (np.cumsum(counts) - counts)[has]
    out["lat"][has] = np.maximum.reduceat(a.lat[src, dst], starts)
    return out


def kv_servers(a: PlanArrays, model: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ranks that serve K/V heads to other groups, sorted by (group, KV head).

    Returns rank, group, first and one-past-last KV head served: a rank serves the KV heads whose
    first query head it holds, [ceil(h0/gq), ceil(h1/gq)).
    """
    gq = model.heads // model.kv_heads
    h1 = a.h0 + a.eta.astype(np.int64)
    sa = -(-a.h0 // gq)
    sb = -(-h1 // gq)
    serving = np.nonzero(sb > sa)[0]  # rank order = (group, head) order
    return serving, a.grp[serving], sa[serving], sb[serving]


def exchange_times(a: PlanArrays, model: ModelSpec) -> dict[str, np.ndarray]:
    """Per rank and round of the forward KV exchange, arrays [R, k] (column 0, own group, is 0):

    recv, send: Σ bytes/β (seconds); lat: α of the round (largest among the rank's partners);
    recv_bytes: bytes received (for the receive buffers).
    """
    R, k = a.R, a.k
    out = {key: np.zeros((R, k)) for key in ("recv", "send", "lat", "recv_bytes")}
    if k <= 1:
        return out
    srv, sg, sa, sb = kv_servers(a, model)
    # servers of all groups on one axis: key = group·M + KV head, ascending in both ends
    M = model.kv_heads + 1
    key_a, key_b = sg * M + sa, sg * M + sb
    rr = np.nonzero(a.eta > 0)[0]  # receivers
    g = a.grp[rr]
    J = np.arange(1, k)
    per_byte = model.head_dim * 2.0 * BF16  # K and V of one KV head for one token
    if len(srv) == k:  # one server per group (e.g. ring): dense [Rr, k-1], receiver-major, no search
        h = (g[:, None] - J[None, :]) % k  # source group of round j; server index = h
        snd = srv[h]
        ov = np.minimum(a.kv1[rr][:, None], sb[h]) - np.maximum(a.kv0[rr][:, None], sa[h])
        # zigzag: g needs L_h tokens of a group before it in the ring, 2·L_h of one after it
        nbytes = ov * (a.L[h] * (1.0 + (h > g[:, None]))) * per_byte
        tt = nbytes / a.bw[snd, rr[:, None]]
        out["recv"][rr, 1:] = tt
        out["recv_bytes"][rr, 1:] = nbytes
        out["lat"][rr, 1:] = a.lat[snd, rr[:, None]]
        if a.gsize.max() == 1:  # one receiver per (sender, round): plain assignment
            out["send"][snd, J[None, :]] = tt
        else:
            out["send"] = np.bincount((snd * k + J[None, :]).ravel(), tt.ravel(), minlength=R * k).reshape(R, k)
        return out
    h = (g[None, :] - J[:, None]) % k  # [k-1, Rr] source group of round j
    lo = np.searchsorted(key_b, h * M + a.kv0[rr][None, :], side="right")  # first server ending after kv0
    hi = np.searchsorted(key_a, h * M + a.kv1[rr][None, :], side="left")  # servers starting before kv1
    n = (hi - lo).ravel()
    # one entry per (round, receiver, server) transfer
    cell = np.repeat(np.arange(n.size), n)
    first = np.cumsum(n) - n
    sidx = lo.ravel()[cell] + (np.arange(cell.size) - first[cell])
    jj, ii = np.divmod(cell, len(rr))
    rcv = rr[ii]
    snd = srv[sidx]
    ov = np.minimum(a.kv1[rcv], sb[sidx]) - np.maximum(a.kv0[rcv], sa[sidx])
    gr, hs = a.grp[rcv], sg[sidx]
    nbytes = ov * a.need[gr, hs] * per_byte
    t = nbytes / a.bw[snd, rcv]
    lat = a.lat[snd, rcv]
    rounds = jj + 1
    flat_r = rcv * k + rounds
    out["recv"] = np.bincount(flat_r, t, minlength=R * k).reshape(R, k)
    out["recv_bytes"] = np.bincount(flat_r, nbytes, minlength=R * k).reshape(R, k)
    lat_m = np.zeros(R * k)
    if n.max(initial=0) <= 1:  # one transfer per (receiver, round): plain assignment is the max
        lat_m[flat_r] = lat
    else:
        np.maximum.at(lat_m, flat_r, lat)
    out["lat"] = lat_m.reshape(R, k)
    out["send"] = np.bincount(snd * k + rounds, t, minlength=R * k).reshape(R, k)
    # every serving rank has heads, hence receives (and pays α) in every round: no send-only rank
    return out
