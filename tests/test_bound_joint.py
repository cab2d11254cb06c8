"""The joint planner's certificate against every joint plan of small clusters (tests/_joint_plans.py):
every replica partition (devices may be left out), every layout of each replica (uneven groupings inside
a node included), every sharding strategy and every integer batch share of G = 1..4 sequences (G = 1 and
3 on the two largest cases), judged by the step model. The joint planner's reported lower bound must be
below every one of them (so its reported gap is true), its plan within that gap of the best, and its
plan must replay to the time it reports. Nodes of 3, 5 and 7 GPUs and mixed node sizes and GPU types."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from _joint_plans import ReplicaLayouts, every_joint_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexiseq.costmodel import bound as bound_module
from hexiseq.costmodel import estimate
from hexiseq.costmodel.bound import (
    compute_bound,
    one_replica_bound,
    outer_group_collectives_floor,
    sequence_can_fit,
    subset_time_bound,
)
from hexiseq.costmodel.kernels import CostOptions, work_times
from hexiseq.costmodel.step import estimate_step, replica_lines, step_time
from hexiseq.errors import InfeasibleError
from hexiseq.plan import (
    Plan,
    Sharding,
    ShardingScope,
    ShardingStage,
    random_plan,
    ring_plan,
    symmetric_plan,
    ulysses_plan,
)
from hexiseq.planner.joint import _Shapes, every_joint_plan_bound, plan_joint
from hexiseq.planner.replicas import Partition, Piece
from hexiseq.planner.shares import STRATEGIES, lower_shares_bound
from hexiseq.specs import ClusterSpec, ModelSpec, Workload

TINY = ModelSpec("tiny-gqa", layers=4, hidden=1024, heads=8, kv_heads=2, ffn=2816, vocab=32000)
# deep enough that at 64K one sequence without recompute fits on no small cluster (memory.py's model)
DEEP = ModelSpec("deep-gqa", layers=32, hidden=2048, heads=16, kv_heads=2, ffn=5504, vocab=32000)
# 3.5B parameters: its model states (56 GB) fit on no single L40S; one GPU runs it only with its
# states sharded with other replicas' (ZeRO over all devices, in lockstep, over the NICs)
WIDE = ModelSpec("wide-gqa", layers=8, hidden=6144, heads=48, kv_heads=8, ffn=16384, vocab=32000)
REL = 1e-9  # rounding of the same float64 sums in another order

CASES = [
    # name, nodes, seq_len, policy, slow (TINY model)
    ("node of 3", [("H100-SXM", 3, 25)], 16 * 1024, "none", False),
    ("nodes of 2 and 1, two types", [("H100-SXM", 2, 25), ("L40S", 1, 12.5)], 16 * 1024, "selective", False),
    ("node of 5", [("A100-80GB", 5, 25)], 16 * 1024, "full", False),
    ("nodes of 3 and 2", [("H100-SXM", 3, 25), ("A100-80GB", 2, 25)], 16 * 1024, "none", False),
    ("nodes of 3, 1 and 2", [("H100-SXM", 3, 50), ("A100-80GB", 1, 25), ("L40S", 2, 12.5)], 16 * 1024, "none", True),
    ("node of 7", [("H100-SXM", 7, 50)], 16 * 1024, "selective", True),
]

_ENUMERATED: dict[str, tuple] = {}  # case -> (cluster, workload, layouts, lines cache): shared by its G


def _case(name: str, nodes, S: int, policy: str):
    if name not in _ENUMERATED:
        cluster = ClusterSpec.from_nodes(name.replace(" ", "-").replace(",", ""), nodes)
        wl = Workload(seq_len=S, activation_checkpointing=policy)
        _ENUMERATED[name] = (cluster, wl, {}, {})
    return _ENUMERATED[name]


def check_certificate(
    cluster: ClusterSpec,
    wl: Workload,
    layouts: dict[str, ReplicaLayouts],
    cache: dict,
    label: str,
    model: ModelSpec = TINY,
):
    """Every joint plan of `wl.global_batch` sequences against the joint planner's result (module doc);
    under recompute "auto" every plan of every policy (`layouts`: one ReplicaLayouts per policy,
    filled on first use). The enumeration's count and best, for the table."""
    policies = ["none", "selective", "full"] if wl.recompute == "auto" else [str(wl.recompute)]
    times: list[float] = []
    by_partition: dict[tuple, float] = {}
    best_s, best, best_wl = math.inf, None, wl
    for policy in policies:
        wp = wl.with_recompute(policy)
        if policy not in layouts:
            layouts[policy] = ReplicaLayouts(cluster, model, wp)
        found = every_joint_plan(cluster, model, wp, STRATEGIES, layouts[policy], cache)
        times += found.times
        for part, t in found.by_partition.items():
            by_partition[part] = min(by_partition.get(part, math.inf), t)
        if found.best_s < best_s:
            best_s, best, best_wl = found.best_s, found.best, wp
    assert times and best is not None and math.isfinite(best_s)
    # the enumeration's judge is the replay: its best plan replays to the time it was scored at
    assert estimate_step(best, cluster, model, best_wl).step_time_s == pytest.approx(best_s, rel=REL)
    found = type(found)(len(times), best_s, best, max(times), times, by_partition)
    # the search's floor of a replica partition (what it says of the partitions it does not plan)
    # is below every plan of that partition, whatever its layouts, strategy and shares
    shapes = _Shapes(cluster, model, wl, CostOptions())
    for part, t in by_partition.items():
        floor = shapes.partition_floor(Partition("", tuple(_pieces(cluster, block) for block in part)), wl.global_batch)
        assert floor <= t * (1 + REL), (part, floor, t)
    res = plan_joint(cluster, model, wl)
    print(
        f"{label:<34} G={wl.global_batch}  plans {found.count:>6}  best {found.best_s:.6f} s  planner "
        f"{res.step_time_s:.6f} s  bound {res.lower_bound_s:.6f} s  gap {res.gap:6.2%}  "
        f"({res.partition}, {res.plan.sharding.describe()})"
    )
    assert res.lower_bound_s <= min(found.times) * (1 + REL), "the joint bound is above an enumerated plan"
    assert res.lower_bound_s <= res.step_time_s
    assert res.step_time_s * (1 - res.gap) <= found.best_s * (1 + REL), "the plan is not within its gap of the best"
    # the plan the planner returns replays to the time it reports, and its lines score it the same
    again = estimate_step(res.plan, cluster, model, wl.with_recompute(res.recompute))
    assert again.step_time_s == pytest.approx(res.step_time_s, rel=REL)
    if res.plan.num_replicas > 1:
        lines = replica_lines(res.plan, cluster, model, wl.with_recompute(res.recompute))
        assert step_time(res.plan, cluster, model, lines) == pytest.approx(res.step_time_s, rel=REL)
    assert sum(r.sequences for r in res.plan.replicas) == wl.global_batch
    return found, res


def _pieces(cluster: ClusterSpec, block: tuple[int, ...]) -> tuple[Piece, ...]:
    """A replica's devices as planner/replicas.py's pieces (identical GPUs of a node are interchangeable)."""
    by_node: dict[int, list[int]] = {}
    for d in block:
        by_node.setdefault(cluster.devices[d].node, []).append(cluster.devices[d].local_rank)
    return tuple(Piece(n, min(r), len(r)) for n, r in sorted(by_node.items()))


# The two large cases (6 and 7 GPUs: up to 132,250 plans per G) run at G = 1 and 3 only, to keep
# `make test` short: G = 2 and 4 (even shares, more of them) are enumerated on the four smaller cases.
PARAMS = [
    pytest.param(*c[:4], G, marks=[pytest.mark.slow] if c[4] else [], id=f"{c[0]}-{G}")
    for c in CASES
    for G in ((1, 3) if c[4] else (1, 2, 3, 4))
]


@pytest.mark.parametrize("name,nodes,S,policy,G", PARAMS)
def test_the_joint_bound_holds_for_every_joint_plan(name, nodes, S, policy, G):
    cluster, wl, layouts, cache = _case(name, nodes, S, policy)
    check_certificate(cluster, replace(wl, global_batch=G), layouts, cache, name)


GPUS = ["H100-SXM", "A100-80GB", "L40S"]


@st.composite
def small_clusters(draw):
    """One or two nodes of 1-3 GPUs (at most 4 in all), any of three GPU types and NIC speeds."""
    n_nodes = draw(st.integers(1, 2))
    nodes, left = [], 4
    for i in range(n_nodes):
        count = draw(st.integers(1, min(3, left - (n_nodes - 1 - i))))
        left -= count
        nodes.append((draw(st.sampled_from(GPUS)), count, draw(st.sampled_from([12.5, 25.0, 50.0]))))
    return nodes


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=small_clusters(),
    G=st.integers(1, 3),
    policy=st.sampled_from(["none", "selective", "full"]),
    S=st.sampled_from([8 * 1024, 16 * 1024]),
)
def test_the_joint_bound_holds_on_random_small_clusters(nodes, G, policy, S):
    """Property: on any small cluster, the joint bound is below the best enumerated joint plan."""
    cluster = ClusterSpec.from_nodes("random", nodes)
    wl = Workload(seq_len=S, activation_checkpointing=policy, global_batch=G)
    check_certificate(cluster, wl, {}, {}, f"random {nodes}")


@pytest.mark.parametrize("G", [1, 2, 3])
def test_the_joint_bound_holds_when_memory_rules_out_a_policy(G):
    """Under recompute "auto", on a node of 2 GPUs where one 64K sequence of DEEP cannot be held
    without recompute by any plan (costmodel.bound.sequence_can_fit), the bound takes the balanced
    compute with selective recompute; every plan of every policy is still above it."""
    cluster = ClusterSpec.from_nodes("h2", [("H100-SXM", 2, 25)])
    wl = Workload(seq_len=64 * 1024, activation_checkpointing="auto", global_batch=G)
    assert not sequence_can_fit(cluster, DEEP, wl.with_recompute("none"))
    assert sequence_can_fit(cluster, DEEP, wl.with_recompute("selective"))
    lower, policy = every_joint_plan_bound(cluster, DEEP, wl)
    assert policy == "selective"
    assert lower > every_joint_plan_bound(cluster, DEEP, wl.with_recompute("none"))[0]
    if "deep" not in _ENUMERATED:
        _ENUMERATED["deep"] = (cluster, wl, {}, {})
    _, _, layouts, cache = _ENUMERATED["deep"]
    found, res = check_certificate(cluster, wl, layouts, cache, "node of 2, DEEP 64K, auto", DEEP)
    assert res.lower_bound_s == pytest.approx(lower)
    # the search's floor of a replica of both GPUs counts the recompute it needs (checked above
    # against every plan): above its balanced compute without recompute
    shapes = _Shapes(cluster, DEEP, wl, CostOptions())
    both = (Piece(0, 0, 2),)
    least = min(shapes.sequence_floors(both, p).inside for p in ("none", "selective", "full"))
    assert least > 1.05 * shapes.compute_per_sequence(both)
    assert "with selective recompute (the least of the policies one sequence can fit under: selective, full)" in (
        res.bound_covers
    )


@pytest.mark.parametrize("G", [2, 3])
def test_the_joint_bound_holds_when_replicas_need_states_sharded_beyond_their_nodes(G):
    """Nodes of one GPU (L40S, L40S, A100) and WIDE: a one-GPU L40S replica holds its model states
    only sharded with other replicas' over the NICs. The enumeration then holds plans whose replicas'
    layouts fit only that way (tests/_joint_plans.py), and the search's floor of every partition is
    below them. With an L40S and the A100 as replicas, G = 3, the floor counts that the L40S runs in
    lockstep with the A100 (one shard group: each shared micro-step at the L40S's pace) where it
    gets sequences at all: above the shares of each replica's least floor taken on its own."""
    cluster = ClusterSpec.from_nodes("l40s-l40s-a100", [("L40S", 1, 12.5), ("L40S", 1, 12.5), ("A100-80GB", 1, 25)])
    wl = Workload(seq_len=16 * 1024, activation_checkpointing="auto", global_batch=G)
    if "wide" not in _ENUMERATED:
        _ENUMERATED["wide"] = (cluster, wl, {}, {})
    _, _, layouts, cache = _ENUMERATED["wide"]
    found, res = check_certificate(cluster, wl, layouts, cache, "nodes of one L40S, L40S, A100; WIDE 16K", WIDE)
    singles = tuple((d,) for d in range(G))
    assert singles in found.by_partition  # G one-GPU replicas run (ZeRO over all devices)
    if G == 3:
        shapes = _Shapes(cluster, WIDE, wl, CostOptions())
        part = Partition("", tuple(_pieces(cluster, block) for block in ((0,), (2,))))

        def least(rep):  # the replica's least floor of any policy and shard group, taken on its own
            floors = [shapes.sequence_floors(rep, p) for p in ("none", "selective", "full")]
            return min(min([f.inside, *(c for c, _ in f.outer.values())]) for f in floors)

        assert shapes.partition_floor(part, G) > 1.15 * lower_shares_bound([least(r) for r in part.replicas], G)


def test_outer_group_collectives_floor_is_below_every_replayed_micro_step():
    """costmodel.bound.outer_group_collectives_floor against the step model: two replicas on
    different nodes under zero2 / zero3 over all devices (one shard group across the NIC), several
    layouts of each, two policies: each replica's replayed seconds per sequence are at least its floor,
    and the floor comes within 15% of one of them (it is not vacuous)."""
    cluster = ClusterSpec.from_nodes("l40s-1-2-a100", [("L40S", 1, 12.5), ("L40S", 2, 12.5), ("A100-80GB", 1, 25)])
    closest = 0.0
    for policy in ("none", "full"):
        wl = Workload(seq_len=16 * 1024, activation_checkpointing=policy, global_batch=2)
        layouts = ReplicaLayouts(cluster, WIDE, wl)
        for a, b in [((0,), (1, 2)), ((1, 2), (3,))]:
            for pa in layouts.plans(a)[:2]:
                for pb in layouts.plans(b)[:2]:
                    for stage in (ShardingStage.ZERO2, ShardingStage.ZERO3):
                        plan = Plan.joint([pa, pb], [1, 1], Sharding(stage, ShardingScope.ALL), name="two")
                        for rep, line in zip((a, b), replica_lines(plan, cluster, WIDE, wl)):
                            floor = outer_group_collectives_floor(cluster, rep, WIDE)[stage]
                            assert floor <= line.per_sequence_s * (1 + REL), (rep, stage, floor, line)
                            closest = max(closest, floor / line.per_sequence_s)
    assert closest > 0.85
    # a replica over every node has no group beyond its nodes; zero1 runs no per-micro-step collective
    assert outer_group_collectives_floor(cluster, (0, 1, 2, 3), WIDE) is None
    assert outer_group_collectives_floor(cluster, (0,), WIDE)[ShardingStage.ZERO1] == 0.0


# 6.9B parameters in 4 layers: on nodes of one L40S its model states fit only sharded over four of them
HUGE = ModelSpec("huge-gqa", layers=4, hidden=12288, heads=96, kv_heads=8, ffn=32768, vocab=32000)
ONE_REPLICA_CASES = [
    ("wide", WIDE, [("L40S", 1, 12.5), ("L40S", 1, 12.5), ("A100-80GB", 1, 25)], 16 * 1024),
    ("deep", DEEP, [("L40S", 2, 12.5), ("A100-80GB", 1, 25)], 16 * 1024),
    ("huge", HUGE, [("L40S", 1, 12.5)] * 4, 8 * 1024),
]


@pytest.mark.parametrize("name,model,nodes,S", ONE_REPLICA_CASES, ids=[c[0] for c in ONE_REPLICA_CASES])
def test_one_replica_bound_is_below_every_one_replica_plan_under_every_strategy(name, model, nodes, S):
    """costmodel.bound.one_replica_bound (the joint planner's reason to skip the DP = 1 planner)
    against the step model: on every device set, every layout of one replica (tests/_joint_plans.py),
    every strategy and two policies, the step of G = 2 sequences is at least the bound, and the bound
    is inf where no plan fits. With HUGE on four one-GPU nodes only ZeRO-3 over all four holds a
    sequence: the bound counts its collectives over the NICs, several times the one without (its
    plans there: the symmetric ones and random uneven ones, as every layout of 96 heads takes long)."""
    import itertools

    cluster = ClusterSpec.from_nodes(name, nodes)
    raised = 0.0
    for policy in ("none", "full"):
        wl = Workload(seq_len=S, activation_checkpointing=policy, global_batch=2)
        layouts = ReplicaLayouts(cluster, model, wl)
        blocks = [b for r in range(1, cluster.size + 1) for b in itertools.combinations(range(cluster.size), r)]
        for block in blocks if name != "huge" else [tuple(range(cluster.size))]:
            if name == "huge":
                heads = (S, model.heads, model.kv_heads)
                plans = [
                    ulysses_plan(block, *heads),
                    ring_plan(block, *heads),
                    symmetric_plan(block, *heads, cp=2, hp=2),
                ]
                plans += [random_plan(len(block), *heads, seed=k, block_size=128) for k in range(12)]
            else:
                plans = layouts.plans(block)
            bound = one_replica_bound(cluster, block, model, wl)
            best = math.inf
            for plan in plans:
                for sharding in STRATEGIES:
                    step = estimate_step(Plan.joint([plan], [2], sharding, name="one"), cluster, model, wl)
                    if step.fits:
                        best = min(best, step.step_time_s)
                        assert bound <= step.step_time_s * (1 + REL), (block, sharding, bound, step.step_time_s)
            assert math.isfinite(bound) or not math.isfinite(best), (block, policy)
            free = subset_time_bound(
                cluster, block, model, replace(wl, param_sharding="zero3"), CostOptions(ignore_comm=True)
            )
            raised = max(raised, bound / free if math.isfinite(bound) else 0.0)
    if name == "huge":
        assert raised > 3.0 and math.isfinite(best)


@pytest.mark.parametrize(
    "nodes,policy",
    [([("H100-SXM", 2, 25)], "none"), ([("A100-80GB", 2, 25)], "selective"), ([("L40S", 2, 25)], "full")],
)
def test_the_memory_condition_is_necessary_and_tight(nodes, policy):
    """`sequence_can_fit` is a necessary condition of memory.py's model, and on identical devices a
    tight one: Ulysses over every device (even shards and heads, one group: no K/V buffers, no more
    devices than KV heads: none duplicated) under ZeRO-3 over all of them is its equality case. So
    at the longest length (in steps of 256 tokens) where the condition holds, that plan fits; 256
    tokens longer, the condition fails and neither it nor any random uneven plan fits."""
    cluster = ClusterSpec.from_nodes("mem", nodes)

    def wl(S):
        return Workload(seq_len=S, activation_checkpointing=policy, block_size=128)

    lo, hi = 256, 1 << 24  # fits at lo, not at hi (in units of 256 tokens)
    assert sequence_can_fit(cluster, DEEP, wl(lo)) and not sequence_can_fit(cluster, DEEP, wl(hi))
    while hi - lo > 256:
        mid = (lo + hi) // 512 * 256
        lo, hi = (mid, hi) if sequence_can_fit(cluster, DEEP, wl(mid)) else (lo, mid)
    n = cluster.size
    for S, expect in ((lo - lo % (256 * n), True), (hi + (-hi) % (256 * n), False)):
        uly = ulysses_plan(range(n), S, DEEP.heads, DEEP.kv_heads, block_size=128)
        assert estimate(uly, cluster, DEEP, wl(S)).fits is expect, (S, lo, hi)
    for seed in range(20):  # beyond the condition nothing fits
        plan = random_plan(n, hi + (-hi) % 256, DEEP.heads, DEEP.kv_heads, seed, block_size=128, whole_kv_heads=True)
        assert not estimate(plan, cluster, DEEP, wl(plan.seq_len)).fits


def test_without_recompute_the_joint_bound_is_the_compute_bound():
    """Under no recompute the joint bound is the cluster's compute bound (costmodel.bound.compute_bound:
    the balanced compute and the least optimizer step); selective and full recompute add their work."""
    cluster = ClusterSpec.from_nodes("h2l1", [("H100-SXM", 2, 25), ("L40S", 1, 12.5)])
    wl = Workload(seq_len=16 * 1024, activation_checkpointing="none", global_batch=3)
    none, policy = every_joint_plan_bound(cluster, TINY, wl)
    assert policy == "none"
    assert none == pytest.approx(wl.tokens / compute_bound(cluster, TINY, wl), rel=1e-12)
    sel = every_joint_plan_bound(cluster, TINY, wl.with_recompute("selective"))[0]
    full = every_joint_plan_bound(cluster, TINY, wl.with_recompute("full"))[0]
    assert none < sel < full
    assert every_joint_plan_bound(cluster, TINY, wl.with_recompute("auto")) == (none, "none")


def _capped_lp(tau, rho, room, c_s, c_y, X, Y) -> float:
    """min t s.t. Σ x = X, Σ y = Y, x·τ + y·ρ <= t, c_s·x + c_y·y <= room, x, y >= 0, by HiGHS."""
    import pyomo.environ as pyo
    from pyomo.contrib.appsi.base import TerminationCondition
    from pyomo.contrib.appsi.solvers import Highs

    N = len(tau)
    m = pyo.ConcreteModel()
    m.x = pyo.Var(range(N), domain=pyo.NonNegativeReals)
    m.y = pyo.Var(range(N), domain=pyo.NonNegativeReals)
    m.t = pyo.Var()
    m.obj = pyo.Objective(expr=m.t)
    # scaled to tokens and pair-heads in units of the targets: HiGHS's tolerances are absolute
    m.lin = pyo.Constraint(expr=sum(m.x[i] for i in range(N)) == 1.0)
    m.att = pyo.Constraint(expr=sum(m.y[i] for i in range(N)) == 1.0)
    m.dev = pyo.Constraint(range(N), rule=lambda M, i: M.x[i] * X * tau[i] + M.y[i] * Y * rho[i] <= M.t)
    m.mem = pyo.Constraint(range(N), rule=lambda M, i: (M.x[i] * X * c_s + M.y[i] * Y * c_y) / 1e9 <= room[i] / 1e9)
    solver = Highs()
    solver.highs_options = {"threads": 1, "output_flag": False, "primal_feasibility_tolerance": 1e-10}
    res = solver.solve(m)
    assert res.termination_condition == TerminationCondition.optimal
    return float(res.best_feasible_objective)


@pytest.mark.parametrize("nodes", [[("H100-SXM", 2, 25), ("L40S", 2, 25)], [("H100-SXM", 1, 25), ("A100-80GB", 3, 25)]])
@pytest.mark.parametrize("fill", [0.5, 0.9, 0.99])
def test_the_memory_capped_compute_against_highs(nodes, fill):
    """`memory_capped_work_time` (its polygon test and bisection) equals the capped LP solved by HiGHS
    and is never above it, at lengths where one sequence without recompute takes `fill` of the room."""
    cluster = ClusterSpec.from_nodes("capped", nodes)
    room, c_s, c_w = bound_module.sequence_memory(cluster, DEEP, Workload(seq_len=1024), CostOptions())
    per_token = c_s + c_w * DEEP.heads / 2  # a sequence's bytes per token (memory.py's terms are linear)
    S = int(fill * room.sum() / per_token) // 256 * 256
    wl = Workload(seq_len=S, activation_checkpointing="none", global_batch=3)
    assert bound_module.sequence_memory(cluster, DEEP, wl, CostOptions())[1:] == (c_s, c_w)
    got = bound_module.memory_capped_work_time(cluster, DEEP, wl)
    w = work_times([d.gpu for d in cluster.devices], DEEP, CostOptions())
    tau, rho = bound_module.recompute_work_times(w, DEEP, wl)
    X, Y = float(S), float(DEEP.layers * DEEP.heads * DEEP.causal_pairs(S))
    ref = 3 * _capped_lp(tau, rho, room, c_s, c_w / (DEEP.layers * (S + 1)), X, Y)
    assert got == pytest.approx(ref, rel=1e-7)
    assert got <= ref * (1 + 1e-9)
    free = bound_module.balanced_work_time(cluster, DEEP, wl)
    assert got >= free * (1 - 1e-12)
    if fill > 0.9:  # the caps bind: the fast devices cannot hold the share the balance gives them
        assert got > free * 1.01


@pytest.mark.parametrize("G", [1, 2])
def test_the_joint_bound_holds_where_memory_caps_the_balance(G):
    """An H100 node and a node of two A100s at a length where, without recompute, the H100 cannot
    hold the share of one DEEP sequence the balanced compute gives it: the memory-capped bound is
    above the compute bound, and every joint plan is still above it."""
    cluster = ClusterSpec.from_nodes("h1a2", [("H100-SXM", 1, 25), ("A100-80GB", 2, 25)])
    wl = Workload(seq_len=64 * 1024, activation_checkpointing="none", global_batch=G)
    lower, policy = every_joint_plan_bound(cluster, DEEP, wl)
    assert policy == "none" and lower > 1.01 * wl.tokens / compute_bound(cluster, DEEP, wl)
    if "capped" not in _ENUMERATED:
        _ENUMERATED["capped"] = (cluster, wl, {}, {})
    _, _, layouts, cache = _ENUMERATED["capped"]
    _, res = check_certificate(cluster, wl, layouts, cache, "nodes of 1 and 2, DEEP 64K, capped", DEEP)
    assert res.lower_bound_s == pytest.approx(lower)


def test_where_no_policy_can_fit_no_joint_plan_fits():
    """One L40S, DEEP 64K: no policy passes the memory condition; the enumeration finds no plan that
    fits under any policy, and the joint planner says it is infeasible."""
    cluster = ClusterSpec.from_nodes("l1", [("L40S", 1, 25)])
    wl = Workload(seq_len=64 * 1024, activation_checkpointing="auto", global_batch=2)
    assert every_joint_plan_bound(cluster, DEEP, wl)[1] is None
    for policy in ("none", "selective", "full"):
        wp = wl.with_recompute(policy)
        assert not sequence_can_fit(cluster, DEEP, wp)
        assert every_joint_plan(cluster, DEEP, wp, STRATEGIES).count == 0
    with pytest.raises(InfeasibleError):
        plan_joint(cluster, DEEP, wl)
