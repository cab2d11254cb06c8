"""The planner against an exhaustive reference search on small clusters: every device subset, every
partition into groups, every ring order, every head split in whole KV heads, and a grid of chunk
lengths and token shards, all judged by the step replay. The planner's lower bound must be below the
best plan the reference finds (so its reported gap is true), and its plan no slower than it.

The reference is written independently of the planner's candidate list (planner/candidates.py)."""

from __future__ import annotations

import itertools
import math

import pytest
from _groupings import layouts as grouping_layouts
from _groupings import lp_plan

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


# ------------------------------------------------------------------------------ every grouping, nodes of 3, 5, 7 GPUs

TINY = ModelSpec("tiny-gqa", layers=4, hidden=1024, heads=8, kv_heads=2, ffn=2816, vocab=32000)

# The same clusters, lengths and policies as test_bound_joint's CASES where they overlap: the layouts'
# plans (tests/_groupings.lp_plan) are computed once per pytest process for both.
GROUPING_CASES = [
    # name, nodes, seq_len, policy, slow
    ("node of 5", [("A100-80GB", 5, 25)], 16 * 1024, "full", False),
    ("nodes of 3 and 2", [("H100-SXM", 3, 25), ("A100-80GB", 2, 25)], 16 * 1024, "none", False),
    ("nodes of 3 and 2, selective", [("H100-SXM", 3, 25), ("A100-80GB", 2, 25)], 32 * 1024, "selective", False),
    ("nodes of 3, 1 and 2", [("H100-SXM", 3, 50), ("A100-80GB", 1, 25), ("L40S", 2, 12.5)], 16 * 1024, "none", True),
    ("node of 7", [("H100-SXM", 7, 50)], 16 * 1024, "selective", True),
]


@pytest.mark.parametrize(
    "name,nodes,S,policy",
    [pytest.param(*c[:4], marks=[pytest.mark.slow] if c[4] else []) for c in GROUPING_CASES],
    ids=[c[0] for c in GROUPING_CASES],
)
def test_the_bound_holds_for_every_grouping(name, nodes, S, policy):
    """Every device subset, every grouping into HP groups (uneven splits of a node included), every
    ring order and head split, each layout's best plan from its relaxation (tests/_groupings.py),
    judged by the replay: the planner's bound is below every one of them, and its plan within its
    reported gap of the best."""
    cluster = ClusterSpec.from_nodes(name.replace(" ", "-").replace(",", ""), nodes)
    wl = Workload(seq_len=S, activation_checkpointing=policy)
    res = plan_cluster(cluster, TINY, wl, progress=False)
    found = [(lp_plan(cluster, TINY, wl, g, h)[0], g, h) for g, h in grouping_layouts(cluster, TINY)]
    best = min(found)
    assert math.isfinite(best[0])
    print(
        f"{name}: {len(found)} layouts, best {best[0]:.6f} s ({best[1]}, heads {best[2]}); planner "
        f"{res.iteration_time_s:.6f} s, bound {res.lower_bound_s:.6f} s, gap {res.gap:.2%}, search bound "
        f"{res.search_lower_bound_s:.6f} s"
    )
    assert all(res.lower_bound_s <= t * (1 + 1e-9) for t, _, _ in found)
    assert res.iteration_time_s * (1 - res.gap) <= best[0] * (1 + 1e-9), "the plan is not within its gap"
    assert res.lower_bound_s <= res.search_lower_bound_s
    assert "every plan" in res.bound_covers


def test_two_groups_of_different_sizes_inside_one_node():
    """The reported counterexample's shape: a node of 3 fast GPUs, one HP group of two of them and the
    third alone (no candidate forms it), faster than the planner's plan and below the bound of its
    candidates; the reported bound must still be below it, and the gap say so."""
    cluster = ClusterSpec.from_nodes("h3a2", [("H100-SXM", 3, 25), ("A100-80GB", 2, 25)])
    wl = Workload(seq_len=16 * 1024, activation_checkpointing="none")
    res = plan_cluster(cluster, TINY, wl, progress=False)
    t, plan = lp_plan(cluster, TINY, wl, ((0, 1), (2,)), ((4, 4), (8,)))
    assert plan is not None and estimate(plan, cluster, TINY, wl).iteration_time_s == t
    assert res.lower_bound_s <= t
    assert res.iteration_time_s * (1 - res.gap) <= t
    if t < res.search_lower_bound_s:  # the search's own bound does not cover it: the reported one must not be it
        assert res.lower_bound_s < res.search_lower_bound_s


def test_a_small_cluster_searched_exhaustively_reports_a_bound_over_every_plan():
    """Up to EXHAUSTIVE_DEVICES devices every layout is a candidate: the bound is the search's own, and
    the grid reference confirms it (every layout, a grid of splits)."""
    cluster = ClusterSpec.from_nodes("h3", [("H100-SXM", 3, 25)])
    wl = Workload(seq_len=8 * 1024, activation_checkpointing="none")
    res = plan_cluster(cluster, TINY, wl, progress=False)
    assert res.lower_bound_s == res.search_lower_bound_s
    assert "was a candidate" in res.bound_covers
    ref, _, n = reference_best(cluster, TINY, wl, 4, 4)
    assert n > 100
    assert res.lower_bound_s <= ref * (1 + 1e-9)
    assert res.iteration_time_s <= ref * (1 + 1e-9)
