"""The joint planner's certificate against every joint plan of small clusters (tests/_joint_plans.py):
every replica partition (devices may be left out), every layout of each replica (uneven groupings
inside a node included), every sharding strategy and every integer batch share of G = 1..4
sequences, judged by the step model. The joint planner's reported lower bound must be below every
one of them (so its reported gap is true), its plan within that gap of the best, and its plan must
replay to the time it reports. Nodes of 3, 5 and 7 GPUs and mixed node sizes and GPU types."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from _joint_plans import ReplicaLayouts, every_joint_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexiseq.costmodel.step import estimate_step, replica_lines, step_time
from hexiseq.planner.joint import plan_joint
from hexiseq.planner.shares import STRATEGIES
from hexiseq.specs import ClusterSpec, ModelSpec, Workload

TINY = ModelSpec("tiny-gqa", layers=4, hidden=1024, heads=8, kv_heads=2, ffn=2816, vocab=32000)
REL = 1e-9  # rounding of the same float64 sums in another order

CASES = [
    # name, nodes, seq_len, policy, slow
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
        _ENUMERATED[name] = (cluster, wl, ReplicaLayouts(cluster, TINY, wl), {})
    return _ENUMERATED[name]


def check_certificate(cluster: ClusterSpec, wl: Workload, layouts: ReplicaLayouts, cache: dict, label: str):
    """Every joint plan of `wl.global_batch` sequences against the joint planner's result (module doc);
    the enumeration's count and best, for the table."""
    found = every_joint_plan(cluster, TINY, wl, STRATEGIES, layouts, cache)
    assert found.count > 0 and found.best is not None and math.isfinite(found.best_s)
    # the enumeration's judge is the replay: its best plan replays to the time it was scored at
    assert estimate_step(found.best, cluster, TINY, wl).step_time_s == pytest.approx(found.best_s, rel=REL)
    res = plan_joint(cluster, TINY, wl)
    print(
        f"{label:<34} G={wl.global_batch}  plans {found.count:>6}  best {found.best_s:.6f} s  planner "
        f"{res.step_time_s:.6f} s  bound {res.lower_bound_s:.6f} s  gap {res.gap:6.2%}  "
        f"({res.partition}, {res.plan.sharding.describe()})"
    )
    assert res.lower_bound_s <= min(found.times) * (1 + REL), "the joint bound is above an enumerated plan"
    assert res.lower_bound_s <= res.step_time_s
    assert res.step_time_s * (1 - res.gap) <= found.best_s * (1 + REL), "the plan is not within its gap of the best"
    # the plan the planner returns replays to the time it reports, and its lines score it the same
    again = estimate_step(res.plan, cluster, TINY, wl.with_recompute(res.recompute))
    assert again.step_time_s == pytest.approx(res.step_time_s, rel=REL)
    if res.plan.num_replicas > 1:
        lines = replica_lines(res.plan, cluster, TINY, wl.with_recompute(res.recompute))
        assert step_time(res.plan, cluster, TINY, lines) == pytest.approx(res.step_time_s, rel=REL)
    assert sum(r.sequences for r in res.plan.replicas) == wl.global_batch
    return found, res


@pytest.mark.parametrize("G", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "name,nodes,S,policy",
    [pytest.param(*c[:4], marks=[pytest.mark.slow] if c[4] else []) for c in CASES],
    ids=[c[0] for c in CASES],
)
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
    check_certificate(cluster, wl, ReplicaLayouts(cluster, TINY, wl), {}, f"random {nodes}")
