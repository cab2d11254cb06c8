"""The numbers of a (Plan, ClusterSpec, ModelSpec) as numpy arrays over ranks and groups.

Every cost-model module reads these instead of walking the Plan, so that a 1024-rank plan is a
handful of vectorized operations. Units: tokens, heads, FLOP/s, bytes/s, seconds, bytes.
Rates are effective: peak × efficiency from the GPU catalog (a profile applied to the cluster
with `ClusterSpec.with_profile` overrides the efficiencies).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import PlanError, SpecError
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .flops import group_pair_matrix, needed_kv_tokens, rounds_source


@dataclass(frozen=True)
class CostOptions:
    """Knobs of the cost and memory model (defaults documented in estimate.py / memory.py)."""

    attn_bwd_factor: float = 2.5  # flash-attention backward executes 2.5x the forward FLOPs (recomputes QK^T)
    reserved_fraction: float = 0.10  # of capacity, for the framework (CUDA context, allocator slack)
    large_vocab: int = 65536  # vocabularies at least this large use a chunked loss
    loss_chunk_tokens: int = 2048  # tokens per loss chunk when chunked (logits of 2048 x 128K vocab: 1.5 GiB)
    loss_bytes_per_logit: float = 12.0  # HBM traffic of softmax + cross entropy fwd+bwd per logit
    optimizer_bytes_per_param: float = 28.0  # AdamW: read grad, master, m, v; write master, m, v, bf16 weight
    ignore_comm: bool = False  # every transfer free: the pure compute schedule (tests, what-ifs)


def recompute_of(workload: Workload) -> str:
    """The workload's concrete recompute policy ("none", "selective" or "full"). "auto" is a request
    to the planner to choose one; a time or memory needs a concrete policy, so it is refused here."""
    policy = workload.recompute
    if policy == "auto":
        raise SpecError('the cost model needs a concrete recompute policy ("none", "selective" or "full"), got "auto": '
                        "only the planner chooses one (plan_cluster); pass the plan's policy (plan.meta['recompute'])")
    return policy


@dataclass(frozen=True)
class PlanArrays:
    R: int  # ranks
    k: int  # groups
    dev: np.ndarray  # [R] cluster device index
    grp: np.ndarray  # [R] group of each rank
    s: np.ndarray  # [R] tokens of the shard (float)
    eta: np.ndarray  # [R] query heads
    h0: np.ndarray  # [R] first query head
    kv0: np.ndarray  # [R] first KV head touched
    kv1: np.ndarray  # [R] one past the last KV head touched
    kvc: np.ndarray  # [R] KV heads touched (with duplication for fine splits)
    gstart: np.ndarray  # [k] first rank of each group
    gsize: np.ndarray  # [k]
    L: np.ndarray  # [k] chunk length (float)
    pairs: np.ndarray  # [k, k] pairs per head per layer, queries of g vs keys of h
    need: np.ndarray  # [k, k] K/V tokens of h that g needs (0 on the diagonal)
    src: np.ndarray  # [k, k] source group of group g in round j
    mm_rate: np.ndarray  # [R] effective matmul FLOP/s
    att_rate: np.ndarray  # [R] effective attention FLOP/s
    hbm: np.ndarray  # [R] HBM bytes/s
    capacity: np.ndarray  # [R] bytes
    bw: np.ndarray  # [R, R] bytes/s between ranks (inf on the diagonal)
    lat: np.ndarray  # [R, R] seconds


def plan_arrays(plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload | None = None) -> PlanArrays:
    """Validate the plan against the cluster/model/workload and lay it out as arrays."""
    plan.check(cluster, model, workload)
    lay = plan.layout()
    R, k = plan.world_size, plan.num_groups
    dev = np.array([x.device for x in lay], dtype=np.int64)
    gpus = [cluster.devices[d].gpu for d in dev]
    sizes = np.array(plan.group_sizes, dtype=np.int64)
    if R == 0:
        raise PlanError("plan has no ranks")
    bw_all, lat_all = _link_matrices(cluster)
    if len(dev) == cluster.size and np.array_equal(dev, np.arange(cluster.size)):
        bw, lat = bw_all, lat_all  # every device in cluster order: no copy
    else:
        bw, lat = bw_all[np.ix_(dev, dev)], lat_all[np.ix_(dev, dev)]
    return PlanArrays(
        R=R,
        k=k,
        dev=dev,
        grp=np.array(plan.group_of_rank, dtype=np.int64),
        s=np.array(plan.shards, dtype=np.float64),
        eta=np.array(plan.heads, dtype=np.float64),
        h0=np.array([x.head_range[0] for x in lay], dtype=np.int64),
        kv0=np.array([x.kv_head_range[0] for x in lay], dtype=np.int64),
        kv1=np.array([x.kv_head_range[1] for x in lay], dtype=np.int64),
        kvc=np.array([x.num_kv_heads for x in lay], dtype=np.float64),
        gstart=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        gsize=sizes,
        L=np.array([g.chunk_len for g in plan.groups], dtype=np.float64),
        pairs=group_pair_matrix(plan).astype(np.float64),
        need=needed_kv_tokens(plan).astype(np.float64),
        src=rounds_source(k),
        mm_rate=np.array([g.matmul_flops for g in gpus]),
        att_rate=np.array([g.attention_flops for g in gpus]),
        hbm=np.array([g.hbm_bandwidth_gbps * 1e9 for g in gpus]),
        capacity=np.array([g.memory_bytes for g in gpus]),
        bw=bw,
        lat=lat,
    )


@functools.lru_cache(maxsize=8)
def _link_matrices(cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """(bytes/s, seconds) [N, N] of a cluster, cached per cluster object (read-only)."""
    bw = cluster.bandwidth_matrix_gbps * 1e9
    bw.setflags(write=False)
    return bw, cluster.latency_matrix_s


def grouping_arrays(
    cluster: ClusterSpec,
    model: ModelSpec,
    groups: "list[list[int]]",
    heads: "list[list[int]] | None" = None,
) -> PlanArrays:
    """PlanArrays of a grouping "per unit": every s_r = 1 and every L_g = 1, so that each transfer
    time and byte count comes out as its coefficient on s or L (linear.py). `need` is the zigzag
    multiplicity (1 for a group earlier in the ring, 2 for a later one); `pairs` is not used.
    Heads default to an even split inside each group."""
    from ..plan import even_split

    if not groups or any(len(g) == 0 for g in groups):
        raise PlanError("every group needs at least one device")
    flat = [d for g in groups for d in g]
    if len(set(flat)) != len(flat):
        raise PlanError("a device appears in two groups")
    for d in flat:
        if not 0 <= d < cluster.size:
            raise PlanError(f"device {d} is not in cluster {cluster.name!r} (devices 0..{cluster.size - 1})")
    if heads is None:
        heads = [list(even_split(model.heads, len(g))) for g in groups]
    if len(heads) != len(groups) or any(len(h) != len(g) or sum(h) != model.heads or min(h) < 0 for h, g in zip(heads, groups)):
        raise PlanError(f"heads must give one non-negative count per device of each group, summing to {model.heads} per group")
    k = len(groups)
    gq = model.heads // model.kv_heads
    eta = np.array([x for h in heads for x in h], dtype=np.int64)
    h0 = np.concatenate([np.concatenate([[0], np.cumsum(h)[:-1]]) for h in heads]).astype(np.int64)
    h1 = h0 + eta
    kv0 = np.where(eta > 0, h0 // gq, 0)
    kv1 = np.where(eta > 0, -(-h1 // gq), 0)
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    dev = np.array(flat, dtype=np.int64)
    gpus = [cluster.devices[d].gpu for d in dev]
    pos = np.arange(k)
    need = np.where(pos[None, :] < pos[:, None], 1.0, 2.0)
    np.fill_diagonal(need, 0.0)
    R = len(flat)
    return PlanArrays(
        R=R,
        k=k,
        dev=dev,
        grp=np.repeat(np.arange(k), sizes),
        s=np.ones(R),
        eta=eta.astype(np.float64),
        h0=h0,
        kv0=kv0,
        kv1=kv1,
        kvc=(kv1 - kv0).astype(np.float64),
        gstart=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        gsize=sizes,
        L=np.ones(k),
        pairs=np.zeros((k, k)),
        need=need,
        src=rounds_source(k),
        mm_rate=np.array([g.matmul_flops for g in gpus]),
        att_rate=np.array([g.attention_flops for g in gpus]),
        hbm=np.array([g.hbm_bandwidth_gbps * 1e9 for g in gpus]),
        capacity=np.array([g.memory_bytes for g in gpus]),
        bw=_link_matrices(cluster)[0][np.ix_(dev, dev)],
        lat=_link_matrices(cluster)[1][np.ix_(dev, dev)],
    )
