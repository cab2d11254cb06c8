"""Communication times: the α–β model of every transfer a plan makes.

Units: bytes, bytes/s (the cluster's GB/s × 1e9 × the achieved fraction, per direction), seconds.
Activations travel in bf16. A message of `nbytes` between ranks a and b takes
α(a, b) + nbytes / β(a, b), α and β from the cluster (same node: the GPU link; across nodes: the
slower NIC; overrides win) and the catalog's achieved-bandwidth fractions (arrays.link_matrices).

Assumptions (simple and stated):
- A rank's link is full duplex and shared by all its concurrent messages: its sending time is
  Σ nbytes/β over the messages it sends, its receiving time Σ nbytes/β over those it receives; a
  phase takes α + max(send, recv) for that rank (α = the largest latency among its partners:
  concurrent messages pay it once).

Byte counts (the functions below are the one place they are written; they work on numbers, numpy
arrays and optimization-model expressions alike):
- ragged all-to-all "in" (before attention): rank r sends to r' the q, k, v of its s_r tokens for
  r''s heads, s_r·(η_r' + 2·κ_r')·d bf16 elements (κ = KV heads touched); "out" (after attention):
  r sends to r' the output of its η_r heads for r''s tokens, s_r'·η_r·d. The backward of each is the
  same exchange with directions swapped (gradients, same sizes).
- KV exchange (hexiseq.schedule, the one exchange schedule): each transfer carries K and V of its KV
  heads for its tokens, kv·tokens·2·d bf16 elements. Backward: the K/V again, and dK/dV (bf16) back
  to their owners, so a rank's backward round moves recv + send bytes in each direction:
  2α + recv/β + send/β.
- Collectives among all R ranks of the plan run as rings over the slowest link they cross (min β,
  max α over the plan's devices; hexiseq.links): all-reduce 2(R-1)/R·bytes/β + 2(R-1)·α; all-gather and
  reduce-scatter (R-1)/R·bytes/β + (R-1)·α. Parameter traffic per call (P_layer = one layer's
  parameters; the root unit = embedding, final norm, LM head; bf16): "zero3" (FSDP, one unit per
  layer + the root) all-gathers a layer's weights (AG) and reduce-scatters its gradients (RS);
  "replicated" (DDP) all-reduces a layer's gradients (AR, one bucket per layer) and the root's.
- Joint plans (data-parallel replicas, `Plan.sharding`; costmodel/step.py): each strategy's
  per-micro-step collectives among one shard group (`sharding_collectives`: zero2 reduce-scatters
  in every backward, no gathers; zero1 all-reduces whole gradients once, in the last backward, as
  DDP's buckets, over every rank of the plan: the executor's ZeRO-1 sums the gradients as the
  replicated strategy does and shards only the optimizer step, runtime/sharding.py) and the
  once-per-step terms (`step_collectives`): zero2/zero3's hybrid scopes' all-reduce of each layer's
  gradient shard among the c copies (2·P_layer/n bytes, n the smallest shard group, over the slowest
  link between copies; in the last micro-step's backward, simulate.pass_schedule) and zero1/zero2's
  all-gather of the updated bf16 weights (2·P) inside each shard group (exposed; zero1's owners
  broadcast them, runtime/zero1.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..links import ring_allgather_s, ring_allreduce_s
from ..plan import ShardingStage
from ..specs import ModelSpec, Workload
from .arrays import PlanArrays
from .kernels import BF16


def a2a_in_bytes(s_src, eta_dst, kv_dst, head_dim: int):
    """Bytes a rank with s_src tokens sends to a peer with eta_dst query / kv_dst KV heads before attention."""
    return s_src * (eta_dst + 2 * kv_dst) * (head_dim * BF16)


def a2a_out_bytes(s_dst, eta_src, head_dim: int):
    """Bytes a rank with eta_src heads sends to a peer holding s_dst tokens after attention."""
    return s_dst * eta_src * (head_dim * BF16)


def kv_bytes(kv_head_tokens, head_dim: int):
    """Bytes of K and V for `kv_head_tokens` = KV heads × tokens."""
    return kv_head_tokens * (2 * head_dim * BF16)


def collective_link(bw: np.ndarray, lat: np.ndarray) -> tuple[float, float]:
    """(bytes/s, seconds): the slowest bandwidth and largest latency between any two of the ranks."""
    if len(bw) <= 1:
        return float("inf"), 0.0
    return float(bw.min()), float(lat.max())  # the diagonal is inf / 0


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
    xr_layer: float = 0.0  # hybrid (joint plans): all-reduce of one layer's gradient shard across the copies
    xr_root: float = 0.0  # ... of the root unit's shard


def param_collectives(bw: np.ndarray, lat: np.ndarray, model: ModelSpec, workload: Workload) -> ParamComm:
    """Per-call times of the parameter/gradient collectives among the ranks whose links are [R, R] `bw`, `lat`."""
    R = len(bw)
    link_bw, link_lat = collective_link(bw, lat)
    layer = BF16 * model.params_per_layer
    root = BF16 * (model.param_count - model.layers * model.params_per_layer)
    if workload.param_sharding == "zero3":
        ag, ag_root = ring_allgather_s(layer, R, link_bw, link_lat), ring_allgather_s(root, R, link_bw, link_lat)
        return ParamComm("zero3", ag_layer=ag, rs_layer=ag, ag_root=ag_root, rs_root=ag_root)
    return ParamComm(
        "replicated",
        ar_layer=ring_allreduce_s(layer, R, link_bw, link_lat),
        ar_root=ring_allreduce_s(root, R, link_bw, link_lat),
    )


def sharding_collectives(stage: ShardingStage, bw: np.ndarray, lat: np.ndarray, model: ModelSpec) -> ParamComm:
    """Per-call times of a strategy's per-micro-step collectives among one shard group ([n, n] `bw`,
    `lat`), in the pass shape the replay runs them (`ParamComm.sharding`: "zero3" = per-layer calls in
    every micro-step, "replicated" = buckets in the last backward). zero3 and replicated are exactly
    `param_collectives`; zero2 is the zero3 shape without the gathers; zero1 is the DDP shape itself
    (its gradients are all-reduced whole: the caller passes every rank of the plan, module doc)."""
    n = len(bw)
    link_bw, link_lat = collective_link(bw, lat)
    layer = BF16 * model.params_per_layer
    root = BF16 * (model.param_count - model.layers * model.params_per_layer)
    rs, rs_root = ring_allgather_s(layer, n, link_bw, link_lat), ring_allgather_s(root, n, link_bw, link_lat)
    if stage == ShardingStage.ZERO3:
        return ParamComm("zero3", ag_layer=rs, rs_layer=rs, ag_root=rs_root, rs_root=rs_root)
    if stage == ShardingStage.ZERO2:
        return ParamComm("zero3", rs_layer=rs, rs_root=rs_root)
    return ParamComm(
        "replicated",
        ar_layer=ring_allreduce_s(layer, n, link_bw, link_lat),
        ar_root=ring_allreduce_s(root, n, link_bw, link_lat),
    )


@dataclass(frozen=True)
class StepCollectives:
    """Seconds of the once-per-step collectives of a joint plan."""

    copies_layer_s: float = 0.0  # hybrid: one layer's gradient shard all-reduced across the copies (ParamComm.xr_layer)
    copies_root_s: float = 0.0  # ... the root unit's (ParamComm.xr_root)
    regather_s: float = 0.0  # zero1 / zero2: the updated bf16 weights all-gathered after the optimizer (exposed)

    @property
    def total_s(self) -> float:
        """The exposed part added after the replicas (the copies' all-reduce runs inside their passes)."""
        return self.regather_s


def step_collectives(
    stage: ShardingStage,
    shard_groups: list[np.ndarray],
    bw: np.ndarray,
    lat: np.ndarray,
    model: ModelSpec,
) -> StepCollectives:
    """The once-per-step terms (module doc) for shard groups given as index arrays into [N, N] `bw`, `lat`
    (the plan's ranks); one group = no copies."""
    if stage == ShardingStage.REPLICATED or not shard_groups:
        return StepCollectives()
    copies = len(shard_groups)
    xr_layer = xr_root = 0.0
    if copies > 1 and stage != ShardingStage.ZERO1:  # zero1's all-reduce spans the copies already
        n = min(len(g) for g in shard_groups)
        label = np.empty(len(bw), dtype=np.int64)
        for i, g in enumerate(shard_groups):
            label[g] = i
        across = label[:, None] != label[None, :]
        link = float(bw[across].min()), float(lat[across].max())
        layer = BF16 * model.params_per_layer
        root = BF16 * (model.param_count - model.layers * model.params_per_layer)
        xr_layer = ring_allreduce_s(layer / n, copies, *link)
        xr_root = ring_allreduce_s(root / n, copies, *link)
    regather = 0.0
    if stage in (ShardingStage.ZERO1, ShardingStage.ZERO2):
        regather = max(
            ring_allgather_s(BF16 * model.param_count, len(g), *collective_link(bw[np.ix_(g, g)], lat[np.ix_(g, g)]))
            for g in shard_groups
        )
    return StepCollectives(xr_layer, xr_root, regather)


def intra_group_pairs(a: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
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
    src, dst = intra_group_pairs(a)
    out = {key: np.zeros(R) for key in ("in_send", "in_recv", "out_send", "out_recv", "lat", "in_bytes_recv")}
    if len(src) == 0:
        return out
    inv = 1.0 / a.bw[src, dst]
    b_in = a2a_in_bytes(a.s[src], a.eta[dst], a.kvc[dst], d)
    b_out = a2a_out_bytes(a.s[dst], a.eta[src], d)
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


def exchange_times(a: PlanArrays, model: ModelSpec) -> dict[str, np.ndarray]:
    """Per rank and round of the forward KV exchange, arrays [R, k] (column 0, the own group, is 0),
    from the exchange schedule (hexiseq.schedule): recv, send (Σ bytes/β, seconds); lat (α of the
    round: the largest among the rank's partners in either direction); recv_bytes, send_bytes."""
    R, k, t = a.R, a.k, a.table
    out = {key: np.zeros((R, k)) for key in ("recv", "send", "lat", "recv_bytes", "send_bytes")}
    if k <= 1 or len(t.src) == 0:
        return out
    nbytes = kv_bytes(t.kv_token_heads.astype(np.float64), model.head_dim)
    secs = nbytes / a.bw[t.src, t.dst]
    lat = a.lat[t.src, t.dst]
    n = R * k
    into, outof = t.dst * k + t.round, t.src * k + t.round
    out["recv"] = np.bincount(into, secs, minlength=n).reshape(R, k)
    out["send"] = np.bincount(outof, secs, minlength=n).reshape(R, k)
    out["recv_bytes"] = np.bincount(into, nbytes, minlength=n).reshape(R, k)
    out["send_bytes"] = np.bincount(outof, nbytes, minlength=n).reshape(R, k)
    lat_m = np.zeros(n)
    np.maximum.at(lat_m, into, lat)
    np.maximum.at(lat_m, outof, lat)
    out["lat"] = lat_m.reshape(R, k)
    return out
