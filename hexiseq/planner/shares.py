"""Batch shares and strategies of a set of replica layouts: the exact integer shares of the global
batch given the replicas' lines, and the fastest fitting sharding strategy (costmodel/step.py's
step model). Shared by the joint planner (planner/joint.py) and the DP baselines (dp_baselines.py).

Exact shares: the integer B_i minimising max_i T_i(B_i) with Σ B_i = G, T_i(B) = c_i + B·m_i, come
from the greedy that gives each sequence to the replica finishing it first (each T_i is increasing:
the chosen values are the G smallest of the merged sequences T_i(1) < T_i(2) < ...). A replica
given no sequence is left out.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import replace

from ..costmodel.kernels import CostOptions
from ..costmodel.step import ReplicaLine, replica_lines, shard_groups, step_time
from ..errors import PlanError
from ..plan import Plan, Sharding, ShardingScope, ShardingStage
from ..specs import ClusterSpec, ModelSpec, Workload

STRATEGIES: tuple[Sharding, ...] = (
    Sharding(ShardingStage.ZERO3, ShardingScope.ALL),
    Sharding(ShardingStage.ZERO3, ShardingScope.REPLICA),
    Sharding(ShardingStage.ZERO3, ShardingScope.NODE),
    Sharding(ShardingStage.ZERO2, ShardingScope.ALL),
    Sharding(ShardingStage.ZERO2, ShardingScope.REPLICA),
    Sharding(ShardingStage.ZERO2, ShardingScope.NODE),
    Sharding(ShardingStage.ZERO1, ShardingScope.ALL),
    Sharding(ShardingStage.ZERO1, ShardingScope.REPLICA),
    Sharding(ShardingStage.ZERO1, ShardingScope.NODE),
    Sharding(ShardingStage.REPLICATED),
)


def batch_shares(lines: Sequence[ReplicaLine], global_batch: int) -> list[int]:
    """Integer sequences per replica minimising the slowest replica's time (module doc); replicas
    that do not fit get none."""
    shares = [0] * len(lines)
    heap = [(ln.time_s(1), i) for i, ln in enumerate(lines) if ln.fits]
    if not heap:
        return shares
    heapq.heapify(heap)
    for _ in range(global_batch):
        _, i = heapq.heappop(heap)
        shares[i] += 1
        heapq.heappush(heap, (lines[i].time_s(shares[i] + 1), i))
    return shares


def lower_shares_bound(bounds: list[float], global_batch: int) -> float:
    """min over integer shares of max_i B_i·b_i (the exact greedy on bound lines)."""
    lines = [ReplicaLine(0.0, b, 0.0, True, 0.0) for b in bounds]
    shares = batch_shares(lines, global_batch)
    return max(ln.time_s(s) for ln, s in zip(lines, shares))


def best_over_strategies(
    replicas: list[Plan],
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    strategies: Sequence[Sharding],
    options: CostOptions,
    name: str,
    cache: dict | None = None,
) -> tuple[float, Plan | None, bool]:
    """The fastest fitting (step seconds, joint plan) of these replica layouts over the strategies,
    with exact shares, and whether every replica fits under every strategy (then more recompute
    cannot give a faster plan of these layouts)."""
    G = workload.global_batch
    cache = {} if cache is None else cache
    best: tuple[float, Plan | None] = (math.inf, None)
    tried: set = set()
    all_fit = True
    for sharding in strategies:
        trial = Plan.joint(replicas, [1] * len(replicas), sharding, name=name)
        same = (sharding.stage, tuple(tuple(g.tolist()) for g in shard_groups(trial, cluster)))
        if same in tried:
            continue  # the same shard groups as a scope already tried
        tried.add(same)
        try:
            lines = replica_lines(trial, cluster, model, replace(workload, global_batch=len(replicas)), options, cache)
        except PlanError:
            all_fit = False
            continue
        all_fit = all_fit and all(ln.fits for ln in lines)
        shares = batch_shares(lines, G)
        used = [i for i, b in enumerate(shares) if b > 0]
        if not used:
            continue
        plan = Plan.joint([replicas[i] for i in used], [shares[i] for i in used], sharding, name=name)
        if len(used) < len(replicas):  # the shard groups changed: score the plan that runs
            lines = replica_lines(plan, cluster, model, workload, options, cache)
            if not all(ln.fits for ln in lines):
                continue
        else:
            lines = [lines[i] for i in used]
        t = step_time(plan, cluster, model, lines, options, cache)
        if t < best[0]:
            best = (t, plan)
    return best[0], best[1], all_fit
