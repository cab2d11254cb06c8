"""The optimization model of a layout (planner/layout_model.py) against the step replay it stands for:
exact at every fixed plan, a lower bound of every plan of its layout, with and without orbits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexiseq.costmodel import CostOptions, simulate
from hexiseq.plan import Group, Plan, random_plan
from hexiseq.planner.candidates import layouts
from hexiseq.planner.layout import Layout
from hexiseq.planner.layout_model import LayoutModel
from hexiseq.rounding import round_near
from hexiseq.specs import ClusterSpec, Workload, get_model

GPUS = ["H100-SXM", "A100-80GB", "L40S", "A800"]


def cluster_from(draw_nodes: list[tuple[int, int, float]]) -> ClusterSpec:
    return ClusterSpec.from_nodes("random", [(GPUS[t], n, nic) for t, n, nic in draw_nodes])


def fixed_value(cluster, model, wl, plan, opts=CostOptions()) -> float:
    """The model's optimum with every variable fixed to the plan (no aggregation: any plan)."""
    lm = LayoutModel(cluster, model, wl, Layout.of(plan), opts, aggregate=False, memory=False)
    lm.fix_blocks([g.chunk_len // plan.block_size for g in plan.groups])
    lm.fix_shards([plan.shards[int(np.argmax(lm.cls == c))] for c in range(lm.C)])
    sol = lm.solve()
    assert sol.status == "optimal", sol
    return sol.bound_s


nodes = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 3), st.sampled_from([12.5, 25.0, 50.0])), min_size=1, max_size=3
)
cases = st.fixed_dictionaries(
    {
        "nodes": nodes,
        "seed": st.integers(0, 10_000),
        "model": st.sampled_from(["llama3-8b", "gpt-3b", "llama2-7b"]),
        "policy": st.sampled_from(["none", "selective", "full"]),
        "sharding": st.sampled_from(["zero3", "replicated"]),
        "batch": st.integers(1, 2),
        "blocks": st.integers(4, 12),
        "comm": st.booleans(),
        "op_us": st.sampled_from([0.0, 0.0, 60.0]),  # a per-operator time (costmodel/operators.py)
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_model_equals_the_replay_at_every_fixed_plan(case):
    cluster = cluster_from(case["nodes"])
    if case["op_us"]:
        cluster = cluster.with_profile({g: {"op_overhead_us": case["op_us"]} for g in cluster.gpu_types})
    model = get_model(case["model"])
    R = cluster.size
    S = 2 * 128 * case["blocks"] * R
    plan = random_plan(R, S, model.heads, model.kv_heads, seed=case["seed"], block_size=128, whole_kv_heads=True)
    wl = Workload(
        seq_len=S, activation_checkpointing=case["policy"], param_sharding=case["sharding"], global_batch=case["batch"]
    )
    opts = CostOptions(ignore_comm=not case["comm"])
    want = simulate(plan, cluster, model, wl, opts).iteration_time_s
    assert fixed_value(cluster, model, wl, plan, opts) == pytest.approx(want, rel=1e-9)


def _random_plans_of(layout: Layout, S: int, B: int, model, rng, n: int) -> list[Plan]:
    """Random plans of one layout: random chunk lengths (whole blocks) and token shards."""
    out = []
    nb, k = S // (2 * B), layout.k
    for _ in range(n):
        cuts = sorted(rng.choice(np.arange(1, nb), size=k - 1, replace=False)) if k > 1 else []
        blocks = np.diff([0, *cuts, nb])
        groups = []
        for devs, heads, b in zip(layout.groups, layout.heads, blocks):
            w = rng.random(len(devs)) + 0.05
            sh = np.floor(w / w.sum() * 2 * b * B).astype(int)
            sh[0] += 2 * b * B - sh.sum()
            groups.append(Group(devs, int(b) * B, tuple(int(x) for x in sh), heads))
        out.append(Plan(S, model.heads, model.kv_heads, tuple(groups), B))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_relaxation_bounds_every_plan_of_its_layout(testbed, seed):
    """The free model's optimum (chunks and shards free, box from a plan's own time) is below the
    replay of every plan of the layout that the box keeps, and of the plan that set the box; seeds 4
    and 5 with a per-operator time on every device (costmodel/operators.py)."""
    model = get_model("llama3-8b")
    rng = np.random.default_rng(seed)
    S = 64 * 1024
    wl = Workload(seq_len=S, activation_checkpointing=["selective", "full", "none", "selective", "none", "full"][seed])
    if seed >= 4:
        testbed = testbed.with_profile({g: {"op_overhead_us": 80.0} for g in testbed.gpu_types})
    cands = layouts(testbed, model, "all", range(testbed.size))
    cand = cands[[0, 2, 3, 5, 1, 4][seed] % len(cands)]
    plans = _random_plans_of(cand.layout, S, wl.block_size, model, rng, 12)
    times = [simulate(p, testbed, model, wl).iteration_time_s for p in plans]
    lm = LayoutModel(testbed, model, wl, cand.layout, memory=False)
    free = lm.solve()
    assert free.ok and free.bound_s <= min(times) * (1 + 1e-9)
    best = min(times)
    lm.set_box(*lm.box_from_bound(best))
    boxed = lm.solve()
    assert boxed.ok and boxed.bound_s <= best * (1 + 1e-9)  # the box keeps every plan at least as fast as `best`
    # a few cutting-plane rounds only (a work limit) still give a valid, weaker bound
    lm2 = LayoutModel(testbed, model, wl, cand.layout, memory=False)
    early = lm2.solve(max_rounds=1)
    assert early.bound_s <= free.bound_s * (1 + 1e-9) and early.bound_s <= best


def _periodic_plans_of(layout: Layout, S: int, B: int, model, orbits: list[int], rng, n: int) -> list[Plan]:
    """Random periodic plans: groups of one orbit get the same chunk and the same shards."""
    nb, NV = S // (2 * B), max(orbits) + 1
    q = orbits.count(0)  # every orbit has q groups
    out = []
    while len(out) < n:
        per = rng.integers(1, nb // q, size=NV)
        if per.sum() * q > nb:
            continue
        per[0] += nb // q - per.sum()
        if nb % q or per[0] < 1:
            continue
        shares = [rng.random(len(layout.groups[g])) + 0.05 for g in range(NV)]
        groups = []
        for g, (devs, heads) in enumerate(zip(layout.groups, layout.heads)):
            b, w = int(per[orbits[g]]), shares[orbits[g]]
            sh = np.floor(w / w.sum() * 2 * b * B).astype(int)
            sh[0] += 2 * b * B - sh.sum()
            groups.append(Group(devs, b * B, tuple(int(x) for x in sh), heads))
        out.append(Plan(S, model.heads, model.kv_heads, tuple(groups), B))
    return out


def test_orbit_model_is_the_periodic_restriction():
    """A periodic layout (two identical periods) modelled on its orbits: exact at every fixed
    periodic plan, its bound below every periodic plan, and its point rounds to a valid plan."""
    cluster = ClusterSpec.from_nodes("periodic", [("H100-SXM", 4, 50), ("A100-80GB", 4, 25)] * 2)
    model = get_model("llama3-8b")
    S = 128 * 1024
    wl = Workload(seq_len=S, activation_checkpointing="full")
    groups = tuple(tuple(n) for n in cluster.node_devices)
    layout = Layout(groups, tuple((8,) * 4 for _ in groups))
    orbits = [0, 1, 0, 1]
    lm = LayoutModel(cluster, model, wl, layout, orbits=orbits, memory=False)
    assert lm.NV == 2 and lm.SV == 2
    sol = lm.solve()
    assert sol.ok
    plans = _periodic_plans_of(layout, S, 128, model, orbits, np.random.default_rng(7), 12)
    times = [simulate(p, cluster, model, wl).iteration_time_s for p in plans]
    assert sol.bound_s <= min(times) * (1 + 1e-9)
    for p, t in zip(plans[:4], times):  # a fixed periodic plan: the model is the replay
        fixed = LayoutModel(cluster, model, wl, layout, orbits=orbits, aggregate=False, memory=False)
        fixed.fix_blocks([g.chunk_len // 128 for g in p.groups])
        fixed.fix_shards([p.shards[int(fixed.rep[c])] for c in range(fixed.C)])
        got = fixed.solve()
        assert got.status == "optimal" and got.bound_s == pytest.approx(t, rel=1e-9)
    plan = lm.to_plan(round_near(sol.blocks, lm.nb, minimum=1), sol.shards)
    assert plan.validate(cluster, model, wl) == []
    assert simulate(plan, cluster, model, wl).iteration_time_s >= sol.bound_s * (1 - 1e-9)


def test_memory_is_a_constraint(testbed):
    """A layout that cannot hold the workload is infeasible in its model."""
    model = get_model("llama3-8b")
    wl = Workload(seq_len=1024 * 1024, activation_checkpointing="none")
    lay = layouts(testbed, model, "all", range(testbed.size))[0].layout
    lm = LayoutModel(testbed, model, wl, lay)
    assert lm.solve().status == "infeasible"


def test_written_model_reads_back(tmp_path, testbed):
    """--write-model's file: an LP with the cutting planes, readable by HiGHS, with the same optimum."""
    import highspy

    model = get_model("llama3-8b")
    wl = Workload(seq_len=64 * 1024, activation_checkpointing="selective")
    lay = layouts(testbed, model, "all", range(testbed.size))[0].layout
    lm = LayoutModel(testbed, model, wl, lay)
    sol = lm.solve()
    path = tmp_path / "m.mps"
    lm.write(str(path))
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(path))
    h.run()
    assert h.getInfo().objective_function_value / 1e3 == pytest.approx(sol.bound_s, rel=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_judge_equals_the_estimate_of_the_rounded_plan(testbed, seed):
    """The search judges rounded solutions with the layout's own coefficients: the same step time
    and memory verdict as estimating the plan from scratch."""
    from hexiseq.costmodel import estimate

    model = get_model("llama3-8b")
    wl = Workload(seq_len=64 * 1024, activation_checkpointing=["none", "selective", "full"][seed])
    cand = layouts(testbed, model, "all", range(testbed.size))[seed]
    lm = LayoutModel(testbed, model, wl, cand.layout)
    rng = np.random.default_rng(seed)
    for _ in range(4):
        blocks = round_near(list(rng.random(lm.k) + 0.2), lm.nb, minimum=1)
        shards = list(rng.random(lm.C) * 3000 + 1)
        t, fits = lm.judge(blocks, shards)
        est = estimate(lm.to_plan(blocks, shards), testbed, model, wl)
        assert t == pytest.approx(est.iteration_time_s, rel=1e-12) and fits == est.fits


def _dense_lp(solver) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row lower, row upper, column lower, column upper, matrix) of the LP a solver handed to HiGHS."""
    lp = solver._solver_model.getLp()
    a = lp.a_matrix_
    dense = np.zeros((lp.num_row_, lp.num_col_))
    start, index, value = np.asarray(a.start_), np.asarray(a.index_), np.asarray(a.value_)
    for j in range(lp.num_col_):  # HiGHS keeps the matrix column-wise
        dense[index[start[j] : start[j + 1]], j] = value[start[j] : start[j + 1]]
    return (
        np.asarray(lp.row_lower_),
        np.asarray(lp.row_upper_),
        np.asarray(lp.col_lower_),
        np.asarray(lp.col_upper_),
        dense,
    )


def _assert_numbers_hand_over_the_pyomo_lp(lm: LayoutModel) -> None:
    """The LP HiGHS gets from the model's registered numbers equals the one appsi's generic path
    reads from its Pyomo expressions (bounds and matrix to 1e-12)."""
    from hexiseq.planner.lp import QuietHighs

    fast, generic = QuietHighs(linear_rows=lm._linear_rows), QuietHighs()
    fast.set_instance(lm.m)
    generic.set_instance(lm.m)
    for got, want in zip(_dense_lp(fast), _dense_lp(generic)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.booleans())
def test_rows_handed_over_as_numbers_are_the_pyomo_rows_on_random_layouts(case, fixed):
    """The same on random clusters, layouts (any grouping of a random plan), policies and memory rows,
    with the chunks free or fixed to the plan's and orbit-free aggregation of identical ranks."""
    cluster = cluster_from(case["nodes"])
    model = get_model(case["model"])
    S = 2 * 128 * case["blocks"] * cluster.size
    plan = random_plan(
        cluster.size, S, model.heads, model.kv_heads, seed=case["seed"], block_size=128, whole_kv_heads=True
    )
    wl = Workload(seq_len=S, activation_checkpointing=case["policy"], param_sharding=case["sharding"])
    lm = LayoutModel(cluster, model, wl, Layout.of(plan), CostOptions(ignore_comm=not case["comm"]))
    if fixed:
        lm.fix_blocks([g.chunk_len // plan.block_size for g in plan.groups])
    lm.solve(max_rounds=3)
    _assert_numbers_hand_over_the_pyomo_lp(lm)


@pytest.mark.parametrize("fixed", [False, True])
def test_rows_handed_over_as_numbers_are_the_pyomo_rows(testbed, fixed):
    """planner/lp.py hands every row the layout model registered to HiGHS from its numbers: the LP
    is the one appsi's generic path reads from the Pyomo expressions (a fixed variable's term in the
    bound), with the cuts and K/V-buffer rows of a solve in it."""
    model = get_model("llama3-8b")
    wl = Workload(seq_len=64 * 1024, activation_checkpointing="selective")
    lay = layouts(testbed, model, "all", range(testbed.size))[0].layout
    lm = LayoutModel(testbed, model, wl, lay)
    if fixed:
        lm.fix_blocks([lm.nb // lm.k + (1 if g < lm.nb % lm.k else 0) for g in range(lm.k)])
    assert lm.solve().ok
    rows = list(lm.m.component_data_objects(lm.pyo.Constraint, active=True))
    assert len(rows) > 10 and all(con in lm._linear_rows for con in rows)  # every row is registered
    _assert_numbers_hand_over_the_pyomo_lp(lm)
