"""The numbers of a (Plan, ClusterSpec, ModelSpec) as numpy arrays over ranks and groups.

Every cost-model module reads these instead of walking the Plan, so that a 1024-rank plan is a
handful of vectorized operations. Units: tokens, heads, seconds, bytes/s, bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import PlanError
from ..plan import Plan
from ..schedule import ExchangeTable, exchange_table
from ..specs import ClusterSpec, ModelSpec, Workload
from .flops import group_pair_matrix, rounds_source
from .kernels import CostOptions, WorkTimes, work_times


@dataclass(frozen=True, eq=False)
class PlanArrays:
    R: int  # ranks
    k: int  # groups
    dev: np.ndarray  # [R] cluster device index
    grp: np.ndarray  # [R] group of each rank
    s: np.ndarray  # [R] tokens of the shard (float)
    eta: np.ndarray  # [R] query heads
    kvc: np.ndarray  # [R] KV heads touched (with duplication for fine splits)
    gstart: np.ndarray  # [k] first rank of each group
    gsize: np.ndarray  # [k]
    L: np.ndarray  # [k] chunk length (float)
    pairs: np.ndarray  # [k, k] pairs per head per layer, queries of g vs keys of h (exact)
    src: np.ndarray  # [k, k] source group of group g in round j
    work: WorkTimes  # seconds per unit of work, per rank (kernels.py)
    capacity: np.ndarray  # [R] bytes
    bw: np.ndarray  # [R, R] bytes/s between ranks (inf on the diagonal)
    lat: np.ndarray  # [R, R] seconds
    plan: Plan  # what the arrays describe (the exchange table is derived from it when first needed)

    @functools.cached_property
    def table(self) -> ExchangeTable:
        """The exchange schedule (hexiseq.schedule), derived on first use (a ring of 1024 ranks has ~1M transfers)."""
        return exchange_table(self.plan)

    @property
    def active(self) -> np.ndarray:
        """[R] ranks with query heads: they take part in the KV exchange."""
        return self.eta > 0


def plan_arrays(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload | None = None,
    options: CostOptions = CostOptions(),
) -> PlanArrays:
    """Validate the plan against the cluster/model/workload and lay it out as arrays."""
    plan.check(cluster, model, workload)
    R, k = plan.world_size, plan.num_groups
    if R == 0:
        raise PlanError("plan has no ranks")
    dev = np.array(plan.rank_devices, dtype=np.int64)
    gpus = [cluster.devices[d].gpu for d in dev]
    sizes = np.array(plan.group_sizes, dtype=np.int64)
    bw_all, lat_all = link_matrices(cluster)
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
        kvc=kv_heads_touched(plan).astype(np.float64),
        gstart=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        gsize=sizes,
        L=np.array([g.chunk_len for g in plan.groups], dtype=np.float64),
        pairs=group_pair_matrix(plan).astype(np.float64),
        src=rounds_source(k),
        work=work_times(gpus, model, options),
        capacity=np.array([g.memory_bytes for g in gpus]),
        bw=bw,
        lat=lat,
        plan=plan,
    )


def kv_heads_touched(plan: Plan) -> np.ndarray:
    """[R] KV heads each rank's query heads touch (Plan.layout's kv_head_range, vectorized)."""
    gq = plan.num_heads // plan.num_kv_heads
    eta = np.array(plan.heads, dtype=np.int64)
    h0 = np.concatenate([np.concatenate([[0], np.cumsum(g.heads)[:-1]]) for g in plan.groups]).astype(np.int64)
    h1 = h0 + eta
    return np.where(eta > 0, -(-h1 // gq) - h0 // gq, 0)


@functools.lru_cache(maxsize=8)
def link_matrices(cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """(bytes/s, seconds) [N, N] of a cluster, cached per cluster object (read-only): the catalog's
    link and NIC bandwidths times their achieved fractions (link_efficiency, nic_efficiency)."""
    bw = cluster.bandwidth_matrix_gbps * 1e9
    node = np.array([d.node for d in cluster.devices])
    link_eff = np.array([d.gpu.link_efficiency for d in cluster.devices])
    nic_eff = np.array([d.gpu.nic_efficiency for d in cluster.devices])
    same = node[:, None] == node[None, :]
    eff = np.where(
        same, np.minimum(link_eff[:, None], link_eff[None, :]), np.minimum(nic_eff[:, None], nic_eff[None, :])
    )
    bw = bw * eff
    bw.setflags(write=False)
    lat = cluster.latency_matrix_s
    return bw, lat
