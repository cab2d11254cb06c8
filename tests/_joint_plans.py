"""Every joint plan of a small cluster, for the exhaustive tests of the joint planner's certificate:
every replica partition of the devices (any disjoint device sets, devices may be left out, each
partition once up to identical devices), for each replica every layout of its devices
(tests/_groupings.py: every grouping into HP groups, uneven splits of a node included, every ring
order and head split, each layout's best plan from its relaxation), every parameter-sharding
strategy and every integer batch share (each replica at least one sequence: a replica given none
is the smaller partition without it), each judged by the step model (costmodel/step.py: the
replicas' replayed lines under the plan's strategy and `step_time`, the planner's own scoring).
Written independently of the planner's replica partitions (planner/replicas.py) and of its shares
(planner/shares.py)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from _groupings import _kinds, layouts, lp_plan, set_partitions

from hexiseq.costmodel.kernels import CostOptions
from hexiseq.costmodel.step import replica_lines, step_time
from hexiseq.errors import PlanError
from hexiseq.plan import Group, Plan, Sharding
from hexiseq.specs import ClusterSpec, ModelSpec, Workload


def replica_partitions(cluster: ClusterSpec, max_replicas: int) -> list[tuple[tuple[int, ...], ...]]:
    """Every set of at most `max_replicas` disjoint non-empty device sets, once up to identical
    devices (two partitions with the same multiset of replicas' device kinds map onto each other by
    a permutation of identical devices)."""
    kind = _kinds(cluster)
    out, seen = [], set()
    for r in range(1, cluster.size + 1):
        for subset in itertools.combinations(range(cluster.size), r):
            for part in set_partitions(list(subset)):
                if len(part) > max_replicas:
                    continue
                key = tuple(sorted(tuple(sorted(kind[d] for d in block)) for block in part))
                if key not in seen:
                    seen.add(key)
                    out.append(tuple(tuple(block) for block in part))
    return out


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Ordered sums of `parts` positive integers equal to `total`."""
    if parts == 1:
        if total >= 1:
            yield (total,)
        return
    for x in range(1, total - parts + 2):
        for rest in compositions(total - x, parts - 1):
            yield (x,) + rest


def _moved(plan: Plan, mapping: dict[int, int]) -> Plan:
    return replace(
        plan,
        groups=tuple(Group(tuple(mapping[d] for d in g.devices), g.chunk_len, g.shards, g.heads) for g in plan.groups),
    )


class ReplicaLayouts:
    """The best plan of every layout of a replica's devices (one sequence, ZeRO-3 over its devices:
    tests/_groupings.lp_plan), and where it differs the best plan with the model states sharded over
    every device of the cluster (a replica whose states are sharded with other replicas' has more
    memory for its sequence: only such a strategy runs it), computed once per replica up to
    identical devices and moved onto each replica's own devices."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, workload: Workload):
        self.cluster, self.model = cluster, model
        self.wl1 = replace(workload, global_batch=1, param_sharding="zero3")
        self.kind = _kinds(cluster)
        self.done: dict[tuple, tuple[tuple[int, ...], list[Plan]]] = {}

    def plans(self, block: Sequence[int]) -> list[Plan]:
        key = tuple(sorted(self.kind[d] for d in block))
        if key not in self.done:
            found = []
            wide = CostOptions(state_shards=self.cluster.size)
            for groups, heads in layouts(self.cluster, self.model, devices=tuple(block)):
                for options in (CostOptions(), wide) if len(block) < self.cluster.size else (CostOptions(),):
                    _, p = lp_plan(self.cluster, self.model, self.wl1, groups, heads, options)
                    if p is not None and p not in found:
                        found.append(p)
            self.done[key] = (tuple(sorted(block)), found)
        canon, found = self.done[key]
        mapping: dict[int, int] = {}
        for k in set(key):  # identical devices onto identical devices, in index order
            mapping.update(
                zip(sorted(d for d in canon if self.kind[d] == k), sorted(d for d in block if self.kind[d] == k))
            )
        return [_moved(p, mapping) for p in found]


@dataclass
class Enumerated:
    """The joint plans of one (cluster, workload, G) and the best of them."""

    count: int  # plans judged (fitting)
    best_s: float
    best: Plan | None
    worst_s: float
    times: list[float]
    by_partition: dict[tuple[tuple[int, ...], ...], float]  # each replica partition's best step


def every_joint_plan(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    strategies: Sequence[Sharding],
    layouts_: ReplicaLayouts | None = None,
    cache: dict | None = None,
) -> Enumerated:
    """Every joint plan of `workload.global_batch` sequences (module doc) that fits, judged by the
    step model; its count, the best, and every step time."""
    G = workload.global_batch
    layouts_ = layouts_ or ReplicaLayouts(cluster, model, workload)
    cache = {} if cache is None else cache
    times: list[float] = []
    by_partition: dict[tuple[tuple[int, ...], ...], float] = {}
    best_s, best = math.inf, None
    for part in replica_partitions(cluster, G):
        per_replica = [layouts_.plans(block) for block in part]
        if any(not p for p in per_replica):
            continue
        k = len(part)
        shares = list(compositions(G, k))
        for combo in itertools.product(*per_replica):
            for sharding in strategies:
                trial = Plan.joint(list(combo), [1] * k, sharding, name="enumerated")
                try:
                    lines = replica_lines(trial, cluster, model, replace(workload, global_batch=k), cache=cache)
                except PlanError:
                    continue
                if not all(ln.fits for ln in lines):
                    continue
                for seqs in shares:
                    plan = Plan.joint(list(combo), list(seqs), sharding, name="enumerated")
                    t = step_time(plan, cluster, model, lines)
                    times.append(t)
                    by_partition[part] = min(by_partition.get(part, math.inf), t)
                    if t < best_s:
                        best_s, best = t, plan
    return Enumerated(len(times), best_s, best, max(times, default=math.inf), times, by_partition)
