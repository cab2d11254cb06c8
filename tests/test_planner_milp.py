"""The model of one grouping: exact on small cases, honest bounds, aggregation, solver back ends."""

from __future__ import annotations

import importlib.util

import pytest

from hexiseq.costmodel import estimate
from hexiseq.costmodel.linear import linear_form
from hexiseq.errors import HexiSeqError
from hexiseq.planner.groupings import (
    Grouping,
    candidate_groupings,
    head_units,
    node_grouping,
    split_sizes,
)
from hexiseq.planner.milp import solve_grouping
from hexiseq.planner.solvers import check_solver
from hexiseq.specs import ClusterSpec, Workload, get_model

WL = Workload(seq_len=32768, activation_checkpointing=True)


@pytest.fixture(scope="module")
def m7():
    return get_model("llama2-7b")


def _plan_linear_time(sol, cluster, model, wl):
    plan = sol.to_plan(wl, model, cluster)
    lf = linear_form(cluster, model, wl, [list(g.devices) for g in plan.groups], heads=[list(g.heads) for g in plan.groups])
    t, mem = lf.evaluate(plan)
    return plan, t.max(), mem, lf


def test_node_grouping_solution_valid_fits_and_matches_linear_form(mixed, m7):
    g = Grouping(((0, 1), (2, 3)), "nodes")
    sol = solve_grouping(g, mixed, m7, WL)
    assert sol.status == "optimal" and sol.aggregated
    assert sol.lower_bound_s <= sol.objective_s + 1e-9
    assert sol.gap <= 0.005
    plan, t_lin, mem, lf = _plan_linear_time(sol, mixed, m7, WL)
    assert plan.validate(mixed, m7, WL) == []
    assert plan.groups[0].tokens > plan.groups[1].tokens  # the H100 node takes more of the sequence
    assert t_lin == pytest.approx(sol.objective_s, rel=1e-3)  # rounding to whole tokens only
    assert all(m <= c for m, c in zip(mem, lf.capacity_bytes))
    assert estimate(plan, mixed, m7, WL).fits


def test_brute_force_optimum_two_single_device_groups(mixed, m7):
    """One device per group: shards are the chunks, heads are all H; enumerate every chunk split."""
    wl = Workload(seq_len=16384, activation_checkpointing=True, block_size=512)
    groups = [[0], [2]]
    sol = solve_grouping(Grouping(((0,), (2,)), "pair"), mixed, m7, wl, rel_gap=1e-9)
    lf = linear_form(mixed, m7, wl, groups, heads=[[32], [32]])
    nblocks = wl.seq_len // (2 * wl.block_size)
    best = float("inf")
    for b0 in range(1, nblocks):
        L = [b0 * wl.block_size, (nblocks - b0) * wl.block_size]
        v = {("L", 0): L[0], ("L", 1): L[1], ("s", 0): 2 * L[0], ("s", 1): 2 * L[1]}
        t = max(sum(max(p.evaluate(v) for p in term) for term in terms) for terms in lf.time_terms)
        if all(p.evaluate(v) <= lf.capacity_bytes[r] for r in range(2) for p in lf.memory_pieces(r)):
            best = min(best, t)
    assert sol.objective_s == pytest.approx(best, rel=1e-6)


def test_free_heads_mixed_group_is_exact(mixed, m7):
    """A group of two GPU types has no even split to fall back on: heads are binary-expanded and
    η·L is linearized exactly, so the plan's linear-form time equals the model's objective."""
    g = Grouping(((0, 1, 2, 3),), "one mixed group")
    sol = solve_grouping(g, mixed, m7, WL)
    assert sol.feasible
    heads = sol.heads[0]
    assert sum(heads) == m7.heads and all(h % m7.group_size == 0 for h in heads)
    assert heads[0] == heads[1] and heads[2] == heads[3]  # aggregated classes
    assert heads[0] > heads[2]  # faster devices take more heads
    plan = sol.to_plan(WL, m7, mixed)
    lf = linear_form(mixed, m7, WL, [[0, 1, 2, 3]])
    t, _ = lf.evaluate(plan)
    assert t.max() == pytest.approx(sol.objective_s, rel=2e-3)
    assert sol.lower_bound_s <= sol.objective_s + 1e-9


def test_gqa_granularity_respected():
    cluster = ClusterSpec.from_nodes("h", [("H100-SXM", 2, 25), ("L40S", 2, 12.5)])
    model = get_model("llama3-8b")  # 32 heads, 8 KV heads -> units of 4
    sol = solve_grouping(Grouping(((0, 1, 2, 3),), "mixed"), cluster, model, Workload(seq_len=16384, activation_checkpointing=True))
    assert sol.feasible
    assert all(h % 4 == 0 for h in sol.heads[0]) and sum(sol.heads[0]) == 32


def test_aggregation_shrinks_the_model():
    cluster = ClusterSpec.from_nodes("h8", [("A100-80GB", 8, 25)] * 2)
    model = get_model("llama2-7b")
    g = node_grouping(cluster, ["A100-80GB"], {"A100-80GB": 8}, head_units(model))
    sol = solve_grouping(g, cluster, model, WL)
    assert sol.aggregated and sol.status == "optimal"
    assert sol.variables < cluster.size  # one shard variable per (group, type), not per device
    plan = sol.to_plan(WL, model, cluster)
    assert len(set(plan.shards)) <= 2 and len(set(plan.heads)) == 1  # identical devices, identical work


def test_relaxation_only_and_cutoff(mixed, m7):
    g = Grouping(((0, 1), (2, 3)), "nodes")
    lp = solve_grouping(g, mixed, m7, WL, lp_only=True)
    assert lp.status == "relaxation only" and not lp.feasible
    full = solve_grouping(g, mixed, m7, WL)
    assert lp.lp_bound_s <= full.objective_s + 1e-9
    pruned = solve_grouping(g, mixed, m7, WL, cutoff_s=lp.lp_bound_s * 0.5)
    assert pruned.status == "pruned"


def test_memory_infeasible_grouping(mixed, m7):
    sol = solve_grouping(Grouping(((0,),), "one device"), mixed, m7, Workload(seq_len=262144))
    assert not sol.feasible and sol.status.startswith("infeasible")
    short = solve_grouping(Grouping(((0,), (1,), (2,)), "3"), mixed, m7, Workload(seq_len=512, block_size=128))
    assert short.status.startswith("infeasible")  # 512 tokens = 2 blocks per side, not 3 groups


def test_pyomo_path_agrees_with_direct_highs(mixed, m7):
    g = Grouping(((0, 1), (2, 3)), "nodes")
    a = solve_grouping(g, mixed, m7, WL, solver="highs", rel_gap=1e-6)
    b = solve_grouping(g, mixed, m7, WL, solver="pyomo_highs", rel_gap=1e-6)
    assert b.status == "optimal"
    assert b.objective_s == pytest.approx(a.objective_s, rel=1e-5)
    assert b.lower_bound_s == pytest.approx(a.lower_bound_s, rel=1e-5)


def test_solver_errors_are_clear():
    with pytest.raises(HexiSeqError, match="not available"):
        check_solver("no-such-solver")
    if importlib.util.find_spec("pyscipopt") is None:
        with pytest.raises(HexiSeqError, match="pyscipopt"):
            check_solver("scip_direct")
    check_solver("highs")


def test_stage_one_candidates(mixed, m7):
    assert split_sizes(8, 8) == [1, 2, 4, 8] and split_sizes(8, 5) == [1]
    cands = candidate_groupings(mixed, m7)
    keys = {c.key for c in cands}
    assert ((0, 1), (2, 3)) in keys and ((0,), (1,), (2,), (3,)) in keys and ((0, 1),) in keys
    assert len(keys) == len(cands)
    for c in cands:
        assert len(set(c.devices)) == len(c.devices)
