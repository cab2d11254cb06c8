"""The planner against an exhaustive reference search on small clusters: every device subset, every
partition into groups, every ring order, every head split in whole KV heads, and a grid of chunk
lengths and token shards, all judged by the step replay. The planner's lower bound must be below the
best plan the reference finds (so its reported gap is true), and its plan no slower than it.

The reference is written independently of the planner's candidate list (planner/candidates.py)."""

from __future__ import annotations

import itertools
import math

import pytest

from hexiseq.costmodel import estimate
from hexiseq.plan import Group, Plan
from hexiseq.planner import plan_cluster
from hexiseq.specs import ClusterSpec, ModelSpec, Workload

GQA = ModelSpec("gqa-test", layers=8, hidden=2048, heads=16, kv_heads=2, ffn=5504, vocab=32000)


def _partitions(items):
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for p in _partitions(rest):
        yield [[head]] + p
        for i in range(len(p)):
            yield p[:i] + [[head] + p[i]] + p[i + 1 :]


def _splits(total: int, parts: int, step: int = 1):
    """Ordered sums of `parts` non-negative multiples of `step` equal to `total`."""
    if parts == 1:
        yield (total,)
        return
    for x in range(0, total + 1, step):
        for rest in _splits(total - x, parts - 1, step):
            yield (x,) + rest


def reference_best(
    cluster: ClusterSpec, model: ModelSpec, wl: Workload, chunk_step: int, shard_parts: int
) -> tuple[float, Plan, int]:
    """The fastest plan that fits among every layout and the grid (module doc); and how many were replayed."""
    B, S = wl.block_size, wl.seq_len
    nb = S // (2 * B)
    units, unit = model.heads // model.group_size, model.group_size
    best, best_plan, n = math.inf, None, 0
    for r in range(1, cluster.size + 1):
        for subset in itertools.combinations(range(cluster.size), r):
            for part in _partitions(list(subset)):
                for order in itertools.permutations(part):
                    k = len(order)
                    for heads in itertools.product(*[list(_splits(units, len(g))) for g in order]):
                        for blocks in _splits(nb - k, k, chunk_step):
                            shard_opts = []
                            for g, b in zip(order, blocks):
                                tokens = 2 * (b + 1) * B
                                opts = [
                                    tuple(tokens * x // shard_parts for x in sp[:-1])
                                    for sp in _splits(shard_parts, len(g))
                                ]
                                shard_opts.append([o + (tokens - sum(o),) for o in opts])
                            for shards in itertools.product(*shard_opts):
                                groups = []
                                ok = True
                                for g, h, b, sh in zip(order, heads, blocks, shards):
                                    if any(s == 0 and hh == 0 for s, hh in zip(sh, h)):
                                        ok = False  # a rank with nothing to do: the smaller subset has it
                                        break
                                    groups.append(Group(tuple(g), (b + 1) * B, tuple(sh), tuple(x * unit for x in h)))
                                if not ok:
                                    continue
                                plan = Plan(S, model.heads, model.kv_heads, tuple(groups), B)
                                est = estimate(plan, cluster, model, wl)
                                n += 1
                                if est.fits and est.iteration_time_s < best:
                                    best, best_plan = est.iteration_time_s, plan
    return best, best_plan, n


CASES = [
    (
        "3 GPUs, 16K",
        ClusterSpec.from_nodes("h2a1", [("H100-SXM", 2, 25), ("A100-80GB", 1, 25)]),
        16 * 1024,
        "selective",
        8,
        4,
    ),
    (
        "3 GPUs, 32K, full",
        ClusterSpec.from_nodes("h1l2", [("H100-SXM", 1, 50), ("L40S", 2, 12.5)]),
        32 * 1024,
        "full",
        16,
        4,
    ),
    (
        "4 GPUs, 16K",
        ClusterSpec.from_nodes("h2a2", [("H100-SXM", 2, 25), ("A100-80GB", 2, 25)]),
        16 * 1024,
        "none",
        16,
        2,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,cluster,S,policy,chunk_step,shard_parts", CASES, ids=[c[0] for c in CASES])
def test_planner_bound_holds_against_an_exhaustive_search(name, cluster, S, policy, chunk_step, shard_parts):
    wl = Workload(seq_len=S, activation_checkpointing=policy, global_batch=2)
    ref, ref_plan, n = reference_best(cluster, GQA, wl, chunk_step, shard_parts)
    assert n > 200 and ref_plan is not None
    res = plan_cluster(cluster, GQA, wl, progress=False)
    print(
        f"{name}: reference best {ref:.5f} s over {n} plans; planner {res.iteration_time_s:.5f} s, bound "
        f"{res.lower_bound_s:.5f} s, gap {res.gap:.3%}, {res.work_rounds} rounds"
    )
    assert res.lower_bound_s <= ref * (1 + 1e-9), "the planner's bound is above a plan the reference found"
    assert res.iteration_time_s <= ref * (1 + 1e-9), "the planner's plan is slower than the reference's best"
    assert res.lower_bound_s <= res.iteration_time_s
    assert res.gap == pytest.approx(1 - res.lower_bound_s / res.iteration_time_s)
