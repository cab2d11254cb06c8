"""Batch shares and strategies of a set of replica layouts: the exact integer shares of the global
batch given the replicas' lines, and the fastest fitting sharding strategy (costmodel/step.py's
step model). Shared by the joint planner (planner/joint.py) and the DP baselines (dp_baselines.py).

Exact shares: the integer B_i minimising the step's slowest lockstep set (costmodel/step.py) with
Σ B_i = G. Each set's least time of n sequences, T_set(n), is non-decreasing in n, so the greedy
that gives each sequence to the set finishing it first is exact (the chosen values are the G
smallest of the merged sequences T_set(1) ≤ T_set(2) ≤ ...). A replica alone: T(n) = c + n·m. A
set in lockstep (`lockstep_table`): micro-step j costs the slowest per-sequence time among the
replicas with a j-th sequence, so n sequences are a multiset of micro-step widths w (how many
replicas run it) with costs m_(w) — the w-th fastest — summing to n, the widest one being every
replica used; with the used replicas' largest fixed part held at each of its values, the used
replicas are the fastest allowed ones, and an unbounded knapsack over the widths is exact. A
replica given no sequence is left out.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import replace

from ..costmodel.kernels import CostOptions
from ..costmodel.step import ReplicaLine, lockstep_sets, replica_lines, shard_groups, step_time
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


def lockstep_table(lines: Sequence[ReplicaLine], most: int) -> list[tuple[float, list[int]]]:
    """For n = 0..most: the least lockstep time (step.lockstep_time) of n sequences over these
    replicas, and the shares that reach it (module doc); replicas that do not fit get none."""
    table: list[tuple[float, list[int]]] = [(0.0, [0] * len(lines))] + [(math.inf, [])] * most
    fit = [i for i, ln in enumerate(lines) if ln.fits]
    for cap in sorted({lines[i].fixed_s for i in fit}):
        allowed = sorted((i for i in fit if lines[i].fixed_s <= cap), key=lambda i: (lines[i].per_sequence_s, i))
        cost = [0.0] + [math.inf] * most  # later micro-steps summing to r, widths 1..u
        width = [0] * (most + 1)
        for u in range(1, min(len(allowed), most) + 1):
            m = lines[allowed[u - 1]].per_sequence_s
            for r in range(u, most + 1):
                if cost[r - u] + m < cost[r]:
                    cost[r], width[r] = cost[r - u] + m, u
            fixed = max(lines[i].fixed_s for i in allowed[:u])
            for n in range(u, most + 1):
                t = fixed + m + cost[n - u]
                if t < table[n][0]:
                    widths, r = [u], n - u
                    while r:
                        widths.append(width[r])
                        r -= width[r]
                    shares = [0] * len(lines)
                    for k, i in enumerate(allowed[:u]):
                        shares[i] = sum(w > k for w in widths)
                    table[n] = (t, shares)
    return table


def batch_shares(
    lines: Sequence[ReplicaLine], global_batch: int, lockstep: Sequence[Sequence[int]] | None = None
) -> list[int]:
    """Integer sequences per replica minimising the slowest lockstep set's time (module doc;
    `lockstep`: the sets of replica indices, default each replica alone); replicas that do not fit
    get none."""
    if lockstep is not None and any(len(m) > 1 for m in lockstep):
        return _lockstep_shares(lines, global_batch, lockstep)
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


def _lockstep_shares(lines: Sequence[ReplicaLine], global_batch: int, lockstep: Sequence[Sequence[int]]) -> list[int]:
    tables = [lockstep_table([lines[i] for i in m], global_batch) for m in lockstep]
    given = [0] * len(lockstep)
    heap = [(t[1][0], k) for k, t in enumerate(tables) if global_batch and t[1][0] < math.inf]
    heapq.heapify(heap)
    for _ in range(global_batch if heap else 0):
        _, k = heapq.heappop(heap)
        given[k] += 1
        if given[k] < global_batch:
            heapq.heappush(heap, (tables[k][given[k] + 1][0], k))
    shares = [0] * len(lines)
    for k, m in enumerate(lockstep):
        if given[k]:
            for i, b in zip(m, tables[k][given[k]][1]):
                shares[i] = b
    return shares


def lower_shares_bound(bounds: list[float], global_batch: int) -> float:
    """min over integer shares of max_i B_i·b_i: batch_shares' greedy on the lines of no fixed
    time, written out (the joint search scores every partition with it)."""
    heap = [(b, i) for i, b in enumerate(bounds)]  # each replica's time with one sequence more
    heapq.heapify(heap)
    given, worst = [0] * len(bounds), 0.0
    for _ in range(global_batch if heap else 0):
        t, i = heapq.heappop(heap)
        given[i] += 1
        worst = max(worst, t)
        heapq.heappush(heap, (bounds[i] * (given[i] + 1), i))
    return worst


def lower_lockstep_bound(bounds: list[float], global_batch: int) -> float:
    """min over integer shares of the lockstep time of replicas whose per-sequence times are at least
    `bounds` and no fixed time (step.lockstep_time), with two replicas or more given sequences: a
    micro-step run by w replicas takes at least the w-th smallest bound, so the least total is an
    unbounded knapsack over the widths summing to the global batch, one of them >= 2 (inf: fewer
    than two finite bounds)."""
    costs = sorted(b for b in bounds if math.isfinite(b))
    G = global_batch
    least = [0.0] + [math.inf] * G  # least cost of micro-steps of widths 1..len(costs) summing to n
    for n in range(1, G + 1):
        for w in range(1, min(len(costs), n) + 1):
            least[n] = min(least[n], least[n - w] + costs[w - 1])
    return min((costs[u - 1] + least[G - u] for u in range(2, min(len(costs), G) + 1)), default=math.inf)


def best_over_strategies(
    replicas: list[Plan],
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    strategies: Sequence[Sharding],
    options: CostOptions,
    name: str,
    cache: dict | None = None,
    even: bool = False,
) -> tuple[float, Plan | None, bool]:
    """The fastest fitting (step seconds, joint plan) of these replica layouts over the strategies,
    with exact shares (`even`: the global batch split equally, every replica taking G / DP; no plan
    when DP does not divide G), and whether every replica fits under every strategy (then more
    recompute cannot give a faster plan of these layouts)."""
    G = workload.global_batch
    if even and G % len(replicas):
        return math.inf, None, True
    cache = {} if cache is None else cache
    best: tuple[float, Plan | None] = (math.inf, None)
    tried: set = set()
    all_fit = True
    for sharding in strategies:
        trial = Plan.joint(replicas, [1] * len(replicas), sharding, name=name)
        groups = shard_groups(trial, cluster)
        same = (sharding.stage, tuple(tuple(g.tolist()) for g in groups))
        if same in tried:
            continue  # the same shard groups as a scope already tried
        tried.add(same)
        try:
            lines = replica_lines(trial, cluster, model, replace(workload, global_batch=len(replicas)), options, cache)
        except PlanError:
            all_fit = False
            continue
        all_fit = all_fit and all(ln.fits for ln in lines)
        if even and not all(ln.fits for ln in lines):
            continue  # equal shares give every replica sequences: each must fit
        shares = [G // len(replicas)] * len(replicas) if even else batch_shares(lines, G, lockstep_sets(trial, groups))
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
