"""The baselines a person could build by hand, for the "never worse than any baseline" tests: every
symmetric layout of every family (ring, Ulysses, USP in both placements) on given device sets, and
DP replicas of one such layout on equal blocks of them, each family at its best, judged by the step
replay (one replica) or the step model (replicas, every sharding strategy). Written apart from the
planner's pruning: nothing is skipped."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from hexiseq.costmodel import estimate
from hexiseq.costmodel.kernels import CostOptions
from hexiseq.planner.baselines import FAMILIES, divisors
from hexiseq.planner.dp_baselines import dp_blocks
from hexiseq.planner.shares import STRATEGIES, best_over_strategies
from hexiseq.specs import ClusterSpec, ModelSpec, Workload

POLICIES = ("none", "selective", "full")


def best_symmetric(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    subsets: Iterable[Sequence[int]],
    policies: Sequence[str] = POLICIES,
) -> dict[str, tuple[float, tuple]]:
    """{family: (fastest replayed step of a fitting layout, where)} over the subsets and policies."""
    best = {family: (math.inf, ()) for family in FAMILIES}
    for devs in subsets:
        for family, make in FAMILIES.items():
            for cfg, plan in make(list(devs), workload.seq_len, model, workload.block_size):
                for policy in policies:
                    e = estimate(plan, cluster, model, workload.with_recompute(policy))
                    if e.fits and e.iteration_time_s < best[family][0]:
                        best[family] = (e.iteration_time_s, (cfg, tuple(devs), policy))
    return best


def best_dp_symmetric(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    subsets: Iterable[Sequence[int]],
    policies: Sequence[str] = POLICIES,
) -> dict[str, tuple[float, tuple]]:
    """{family: (fastest step, where)}: every DP <= the global batch dividing a subset, its equal
    blocks each the same layout of the family, every policy and sharding strategy."""
    best = {family: (math.inf, ()) for family in FAMILIES}
    for devs in subsets:
        for dp in divisors(len(devs)):
            if dp > workload.global_batch:
                continue
            blocks = dp_blocks(devs, dp)
            for family, make in FAMILIES.items():
                per_block = [make(b, workload.seq_len, model, workload.block_size) for b in blocks]
                for j, (cfg, _) in enumerate(per_block[0]):
                    for policy in policies:
                        t, plan, _ = best_over_strategies(
                            [pb[j][1] for pb in per_block],
                            cluster,
                            model,
                            workload.with_recompute(policy),
                            STRATEGIES,
                            CostOptions(),
                            family,
                        )
                        if plan is not None and t < best[family][0]:
                            best[family] = (t, (dp, cfg, tuple(devs), policy))
    return best
