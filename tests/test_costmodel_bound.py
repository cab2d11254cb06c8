"""The compute bound (hexiseq/costmodel/bound.py): the balanced-work LP against an LP solved by
HiGHS (through Pyomo) and a grid search, its closed form on identical devices, and
`subset_time_bound` — which the planner prunes with — below the replay of every plan tried on that
subset under each policy."""

import itertools

import numpy as np
import pytest
from _costmodel_ref import attention_row_seconds, on_devices, stack_attention, with_knobs
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hexiseq.costmodel import CostOptions, compute_bound, estimate, simulate, useful_flops
from hexiseq.costmodel import bound as bound_module
from hexiseq.costmodel.bound import (
    every_plan_bound,
    fewest_devices_compute_floor,
    identical_devices,
    kernel_rates,
    min_compute_time,
    min_iteration_time,
    subset_time_bound,
)
from hexiseq.costmodel.kernels import memory_bytes
from hexiseq.errors import SpecError
from hexiseq.plan import random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.specs import ClusterSpec, Workload, get_model, load_cluster

MODEL = get_model("llama2-7b")
H, HKV = MODEL.heads, MODEL.kv_heads


def lp_time(m: np.ndarray, a: np.ndarray, f_lin: float, f_att: float) -> float:
    """min t s.t. Σ x = f_lin, Σ y = f_att, x_i/m_i + y_i/a_i <= t, x, y >= 0, by HiGHS."""
    import pyomo.environ as pyo
    from pyomo.contrib.appsi.base import TerminationCondition
    from pyomo.contrib.appsi.solvers import Highs

    N = len(m)
    mod = pyo.ConcreteModel()
    mod.x = pyo.Var(range(N), domain=pyo.NonNegativeReals)
    mod.y = pyo.Var(range(N), domain=pyo.NonNegativeReals)
    mod.t = pyo.Var()
    mod.obj = pyo.Objective(expr=mod.t)
    mod.lin = pyo.Constraint(expr=sum(mod.x[i] for i in range(N)) == f_lin)
    mod.att = pyo.Constraint(expr=sum(mod.y[i] for i in range(N)) == f_att)
    mod.dev = pyo.Constraint(range(N), rule=lambda M, i: M.x[i] / float(m[i]) + M.y[i] / float(a[i]) <= M.t)
    solver = Highs()
    solver.highs_options = {
        "threads": 1,
        "output_flag": False,
        "primal_feasibility_tolerance": 1e-10,
        "dual_feasibility_tolerance": 1e-10,
    }
    res = solver.solve(mod)
    assert res.termination_condition == TerminationCondition.optimal
    return float(res.best_feasible_objective)


def test_lp_against_highs():
    """The sorted-split solution equals the LP's optimum for 1..7 devices of random rates and work,
    scaled like real ones (rates ~1e4..1e6, work ~1e6..1e9)."""
    rng = np.random.default_rng(0)
    for trial in range(30):
        N = 1 + trial % 7
        m, a = 10 ** rng.uniform(4, 6, N), 10 ** rng.uniform(4, 6, N)
        f_lin, f_att = 10 ** rng.uniform(6, 9, 2)
        if trial % 5 == 4:  # identical devices and equal ratios (ties in the sort)
            m, a = np.repeat(m[:1], N), np.repeat(a[:1], N) * np.linspace(1, 2, N) ** (trial % 2)
        t, ref = min_compute_time(m, a, f_lin, f_att), lp_time(m, a, f_lin, f_att)
        assert t == pytest.approx(ref, rel=1e-7), (trial, N)


def test_lp_with_one_kind_of_work():
    m, a = np.array([1.0, 3.0]), np.array([2.0, 2.0])
    assert min_compute_time(m, a, 8.0, 0.0) == 2.0
    assert min_compute_time(m, a, 0.0, 8.0) == 2.0
    assert min_compute_time(np.array([4.0]), np.array([2.0]), 8.0, 6.0) == pytest.approx(5.0)


def test_lp_against_a_grid():
    """Two devices: the solution equals a grid search over every work split (within its step)."""
    rng = np.random.default_rng(1)
    grid = np.linspace(0, 1, 401)
    for _ in range(20):
        m, a = rng.uniform(1, 10, 2), rng.uniform(1, 10, 2)
        f_lin, f_att = rng.uniform(1, 100, 2)
        t = min_compute_time(m, a, f_lin, f_att)
        x, y = np.meshgrid(grid, grid)  # shares of linear / attention work on device 0
        t0 = x * f_lin / m[0] + y * f_att / a[0]
        t1 = (1 - x) * f_lin / m[1] + (1 - y) * f_att / a[1]
        brute = np.maximum(t0, t1).min()
        assert t <= brute + 1e-9
        assert t >= brute - 2 * (f_lin / m.min() + f_att / a.min()) / 400
        assert t <= f_lin / m.sum() + f_att / a.sum() + 1e-9


def test_bound_homogeneous_closed_form():
    """Identical devices: t* = tokens·τ/N + pair-heads·ρ/N + the optimizer step, τ and ρ written out
    from the catalog and the model (matmuls at eff_matmul, elementwise kernels and the loss at HBM
    bandwidth, attention forward + 2.5x backward at eff_attention)."""
    node8 = ClusterSpec.from_nodes("h100x8", [("H100-SXM", 8, 50)])
    w = Workload(seq_len=64 * 1024, global_batch=2)
    g = node8.devices[0].gpu
    mm, at, hbm = (
        g.peak_bf16_tflops * 1e12 * g.eff_matmul,
        g.peak_bf16_tflops * 1e12 * g.eff_attention * stack_attention(g),
        g.hbm_bandwidth_gbps * 1e9 * g.eff_hbm,
    )
    layer_bytes = sum(memory_bytes(MODEL).values())  # forward + backward elementwise traffic per token and layer
    tau = 3 * MODEL.linear_flops_per_token / mm + MODEL.layers * layer_bytes / hbm + MODEL.vocab * 12.0 / hbm
    rho = 3.5 * 4 * MODEL.head_dim / at
    pair_heads = 2 * MODEL.layers * H * w.seq_len * (w.seq_len + 1) / 2
    opt = MODEL.param_count / 8 * 28.0 / hbm
    t = w.tokens * tau / 8 + pair_heads * rho / 8 + opt
    assert min_iteration_time(node8, MODEL, w) == pytest.approx(t, rel=1e-12)
    assert compute_bound(node8, MODEL, w) == pytest.approx(w.tokens / t, rel=1e-12)
    tok, att = kernel_rates(node8, MODEL)
    np.testing.assert_allclose(tok, 1 / tau, rtol=1e-12)
    np.testing.assert_allclose(att, 1 / rho, rtol=1e-12)
    f_lin, f_att = useful_flops(MODEL, w)
    assert f_lin + f_att == pytest.approx(2 * MODEL.training_flops(w.seq_len), rel=1e-12)
    # the kernel-time bound is below the useful-FLOP one (flash backward, loss, optimizer cost time)
    assert compute_bound(node8, MODEL, w) < w.tokens / (f_lin / (8 * mm) + f_att / (8 * at))


def test_subset_bound_of_all_devices_without_recompute_is_at_least_the_iteration_bound(testbed):
    """Without recompute the subset bound of all devices is at least the iteration bound (the
    pass-by-pass bound and the collectives only raise it), and equal to it on identical devices
    without communication (one balanced split serves every pass)."""
    node8 = ClusterSpec.from_nodes("h100x8", [("H100-SXM", 8, 50)])
    free = CostOptions(ignore_comm=True)
    for sharding in ("zero3", "replicated"):
        w = Workload(seq_len=64 * 1024, param_sharding=sharding, global_batch=3)
        assert subset_time_bound(testbed, range(8), MODEL, w) >= min_iteration_time(testbed, MODEL, w) * (1 - 1e-14)
        assert subset_time_bound(testbed, range(8), MODEL, w, free) >= min_iteration_time(testbed, MODEL, w, free) * (
            1 - 1e-14
        )
        assert subset_time_bound(node8, range(8), MODEL, w, free) == pytest.approx(
            min_iteration_time(node8, MODEL, w, free), rel=1e-12
        )
    with pytest.raises(SpecError, match="concrete recompute policy"):
        subset_time_bound(testbed, range(8), MODEL, Workload(seq_len=65536, activation_checkpointing="auto"))


def test_subset_bound_counts_the_collectives_of_its_devices():
    """A long ZeRO-3 step over a slow NIC is bounded by its layer all-gathers and reduce-scatters:
    the bound of two nodes is at least Λ·AG (forward) + Λ·(AG + RS) (backward), the collectives
    over the slowest link between its devices."""
    from hexiseq.costmodel.arrays import link_matrices
    from hexiseq.costmodel.comm import param_collectives

    cluster = ClusterSpec.from_nodes("slow-nic", [("H100-SXM", 8, 1.0), ("H100-SXM", 8, 1.0)])
    m = get_model("llama2-13b")
    w = Workload(seq_len=8 * 1024)
    bw, lat = link_matrices(cluster)
    pc = param_collectives(bw, lat, m, w)
    floor = (m.layers - 1) * pc.ag_layer + (m.layers - 1) * (pc.ag_layer + pc.rs_layer)
    assert subset_time_bound(cluster, range(16), m, w) >= floor
    assert subset_time_bound(cluster, range(16), m, w) > 3 * min_iteration_time(cluster, m, w)


def test_recompute_raises_the_subset_bound(testbed):
    t = [
        subset_time_bound(testbed, [0, 1, 5, 6], MODEL, Workload(seq_len=65536, activation_checkpointing=p))
        for p in ("none", "selective", "full")
    ]
    assert t[0] < t[1] < t[2]


SIM32 = load_cluster("sim-32")
TESTBED = load_cluster("testbed-8")
M8 = get_model("llama3-8b")
UNEVEN = ClusterSpec.from_nodes("uneven-9", [("H100-SXM", 3, 50), ("A100-80GB", 5, 25), ("L40S", 1, 12.5)])


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 10),
    on_sim=st.booleans(),
    policy=st.sampled_from(("none", "selective", "full")),
    sharding=st.sampled_from(("zero3", "replicated")),
    batch=st.integers(1, 3),
    ignore_comm=st.booleans(),
    knobs=st.sampled_from([None, (0.0, 0.0), (512.0, 0.1), (512.0, 0.1, 40.0)]),
    blocks=st.integers(0, 40),
)
def test_subset_time_bound_is_below_the_replay_of_every_plan(
    seed, n, on_sim, policy, sharding, batch, ignore_comm, knobs, blocks
):
    """It is used to prune candidate subsets: no plan on the subset may replay faster than it, under
    any policy, sharding, batch, with or without communication, on the catalog's kernel knobs (None)
    and on set ones."""
    cluster = SIM32 if on_sim else TESTBED
    n = min(n, cluster.size)
    devices = sorted(np.random.default_rng(seed).choice(cluster.size, n, replace=False).tolist())
    S = 2 * 128 * (n + blocks)
    plan = on_devices(
        random_plan(n, S, M8.heads, M8.kv_heads, seed=seed, block_size=128, whole_kv_heads=seed % 2 == 0), devices
    )
    w = Workload(seq_len=S, activation_checkpointing=policy, param_sharding=sharding, global_batch=batch)
    cluster = cluster if knobs is None else with_knobs(cluster, *knobs)
    bound = subset_time_bound(cluster, devices, M8, w, CostOptions(ignore_comm=ignore_comm))
    t = simulate(plan, cluster, M8, w, CostOptions(ignore_comm=ignore_comm)).iteration_time_s
    assert bound <= t * (1 + 1e-12)


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_subset_time_bound_is_tight_for_balanced_comm_free_plans(policy):
    """Identical devices, even plan, no communication and no tile waste: without the per-row block
    cost (attn_block_half_keys = 0, set here) the replay reaches the bound (the bound counts the
    policy's recompute exactly); with a per-row cost (the catalog's, and a larger one) the replay
    exceeds the bound by exactly that cost, which the bound leaves out: per layer and sequence
    (1 + attn_bwd_factor, + 1 forward again under "full") × η × rows × row seconds."""
    catalog = ClusterSpec.from_nodes("h100x8", [("H100-SXM", 8, 50)])
    opts = CostOptions(ignore_comm=True, attn_tile=0)
    w = Workload(seq_len=64 * 1024, activation_checkpointing=policy, global_batch=2)
    runs = 1 + opts.attn_bwd_factor + (1.0 if policy == "full" else 0.0)  # attention passes per layer and sequence
    for plan in (
        ring_plan(range(8), w.seq_len, H, HKV),
        ulysses_plan(range(8), w.seq_len, H, HKV),
        symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4),
    ):
        for node8 in (with_knobs(catalog), catalog, with_knobs(catalog, block_half_keys=384)):
            t = simulate(plan, node8, MODEL, w, opts).iteration_time_s
            rows = w.global_batch * MODEL.layers * runs * attention_row_seconds(plan, node8, MODEL.head_dim)
            assert np.ptp(rows) <= 1e-15 * rows.max()  # an even plan: the same rows on every rank
            bound = subset_time_bound(node8, range(8), MODEL, w, opts)
            assert bound + rows.max() == pytest.approx(t, rel=1e-12), plan.name
            assert (rows.max() == 0) == (node8.devices[0].gpu.attn_block_half_keys == 0)


# ------------------------------------------------------------------------------ every plan at all (every_plan_bound)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 12),
    cluster_name=st.sampled_from(("sim", "testbed", "uneven")),
    policy=st.sampled_from(("none", "selective", "full")),
    sharding=st.sampled_from(("zero3", "replicated")),
    batch=st.integers(1, 3),
    blocks=st.integers(0, 40),
)
def test_every_plan_bound_is_below_the_replay_of_every_plan(seed, n, cluster_name, policy, sharding, batch, blocks):
    """No plan on any subset of the cluster, in any grouping, replays faster than the bound: on a
    cluster small enough for the exact enumeration (the uneven one: nodes of 3, 5 and 1 GPUs), and
    on those where the relaxation of spanning subsets (every_plan_bound (b)) is used."""
    cluster = {"sim": SIM32, "testbed": TESTBED, "uneven": UNEVEN}[cluster_name]
    n = min(n, cluster.size)
    devices = sorted(np.random.default_rng(seed).choice(cluster.size, n, replace=False).tolist())
    S = 2 * 128 * (n + blocks)
    plan = on_devices(
        random_plan(n, S, M8.heads, M8.kv_heads, seed=seed, block_size=128, whole_kv_heads=seed % 2 == 0), devices
    )
    w = Workload(seq_len=S, activation_checkpointing=policy, param_sharding=sharding, global_batch=batch)
    # a plan that does not fit in memory is no plan: the bound leaves out device sets that cannot hold a sequence
    assume(estimate(plan, cluster, M8, w).fits)
    bound = every_plan_bound(cluster, M8, w)
    assert bound <= simulate(plan, cluster, M8, w).iteration_time_s * (1 + 1e-12)
    assert bound <= subset_time_bound(cluster, devices, M8, w) * (1 + 1e-12)


@pytest.mark.parametrize("policy", ["none", "full"])
@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_the_relaxation_of_spanning_subsets_is_below_the_exact_least(monkeypatch, policy, sharding):
    """With the enumeration turned off, every_plan_bound (single nodes exactly, spanning subsets by
    the relaxation) is at most the exact least subset bound over every subset."""
    w = Workload(seq_len=64 * 1024, activation_checkpointing=policy, param_sharding=sharding)
    for cluster in (TESTBED, UNEVEN):
        exact = bound_module.every_plan_bound(cluster, M8, w)
        every = [
            subset_time_bound(cluster, list(s), M8, w)
            for r in range(1, cluster.size + 1)
            for s in itertools.combinations(range(cluster.size), r)
        ]
        assert exact == pytest.approx(min(every), rel=1e-12)
        monkeypatch.setattr(bound_module, "MAX_SUBSET_SHAPES", 0)
        relaxed = bound_module.every_plan_bound(cluster, M8, w)
        monkeypatch.undo()
        assert relaxed <= exact * (1 + 1e-12)
        assert relaxed > 0.5 * exact  # a floor, not a vacuous one


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 7),
    kinds=st.integers(1, 3),
    most=st.integers(1, 7),
    share=st.floats(0.0, 1.0),
)
def test_the_priced_floor_is_below_every_set_of_at_most_that_many_devices(seed, n, kinds, most, share):
    """fewest_devices_compute_floor is at most the balanced compute time of every set of at most
    `most` of the devices (exhaustive), with devices of a few kinds (repeated rates, as in a cluster)."""
    rng = np.random.default_rng(seed)
    kind_m, kind_a = rng.uniform(0.5, 3.0, kinds), rng.uniform(0.5, 3.0, kinds)
    pick = rng.integers(0, kinds, n)
    m, a = kind_m[pick], kind_a[pick]
    f_lin, f_att = 10.0 * share, 10.0 * (1.0 - share)
    floor = fewest_devices_compute_floor(m, a, f_lin, f_att, most)
    least = min(
        min_compute_time(m[list(s)], a[list(s)], f_lin, f_att)
        for r in range(1, min(most, n) + 1)
        for s in itertools.combinations(range(n), r)
    )
    assert floor <= least * (1 + 1e-12)


def test_the_priced_floor_is_tighter_than_each_kind_of_work_alone():
    """Two kinds of device, each best at one kind of work, at most 2 of 4: each kind of work alone on
    its 2 largest capacities says 2.5 s, but no 2 devices do both in under 5 s (one of each kind, each
    on its own work); priced at r = 1 the floor is exactly that."""
    m, a = np.array([2.0, 2.0, 1.0, 1.0]), np.array([1.0, 1.0, 2.0, 2.0])
    t = fewest_devices_compute_floor(m, a, 10.0, 10.0, 2)
    best_pair = min(min_compute_time(m[list(s)], a[list(s)], 10.0, 10.0) for s in itertools.combinations(range(4), 2))
    assert best_pair == pytest.approx(5.0, rel=1e-12)
    assert t == pytest.approx(best_pair, rel=1e-12)


def test_device_sets_that_cannot_hold_a_sequence_are_left_out(monkeypatch):
    """llama2-7b at 64K without recompute on 3 H100 + 5 A100 nodes joined by a slow link: no set of
    fewer than 6 devices can hold a sequence (no ring plan on them fits), so neither node alone can,
    though the H100 node alone would be the fastest set. The bound is the least subset bound over
    the sets that can, above the least over all sets; the relaxation of spanning sets stays below
    it and also leaves the small sets out."""
    cluster = ClusterSpec.from_nodes("slow-link", [("H100-SXM", 3, 1.0), ("A100-80GB", 5, 1.0)])
    w = Workload(seq_len=64 * 1024, activation_checkpointing="none")
    room, c_s, c_w = bound_module.sequence_memory(cluster, MODEL, w, CostOptions())
    need = w.seq_len * (c_s + c_w * MODEL.heads / 2)
    subsets = [list(s) for r in range(1, cluster.size + 1) for s in itertools.combinations(range(cluster.size), r)]
    holds = {tuple(s): float(room[s].sum()) >= need for s in subsets}
    assert min(len(s) for s, h in holds.items() if h) == 6
    for s in ([0, 1, 2, 3], [3, 4, 5, 6], [0, 1], [4, 5, 6, 7]):  # sets that cannot: no plan on them fits
        assert not holds[tuple(s)]
        assert not estimate(ring_plan(s, w.seq_len, H, HKV), cluster, MODEL, w).fits
    each = {tuple(s): subset_time_bound(cluster, s, MODEL, w) for s in subsets}
    assert min(each, key=each.get) == (0, 1, 2)  # the H100 node alone, were memory no limit
    exact = every_plan_bound(cluster, MODEL, w)
    assert exact == pytest.approx(min(v for s, v in each.items() if holds[s]), rel=1e-12)
    assert exact > min(each.values()) * 1.01
    monkeypatch.setattr(bound_module, "MAX_SUBSET_SHAPES", 0)
    relaxed = bound_module.every_plan_bound(cluster, MODEL, w)
    assert relaxed <= exact * (1 + 1e-12)
    assert relaxed > min(each.values()) * 1.01


def test_identical_devices_are_per_node_and_type():
    classes = identical_devices(UNEVEN)
    assert sorted(len(c) for c in classes) == [1, 3, 5]
    assert all(len({UNEVEN.devices[d].node for d in c}) == 1 for c in classes)


def test_every_plan_bound_of_a_device_set_is_the_least_over_its_subsets():
    """`devices=` restricts the subsets to those of a device set (a replica's devices): the bound then
    covers only them, and the whole cluster's bound is at most each device set's."""
    w = Workload(seq_len=32 * 1024, activation_checkpointing="none")
    half = [0, 1, 2, 3]
    sub = every_plan_bound(TESTBED, M8, w, devices=half)
    every = [
        subset_time_bound(TESTBED, list(s), M8, w)
        for r in range(1, len(half) + 1)
        for s in itertools.combinations(half, r)
    ]
    assert sub == pytest.approx(min(every), rel=1e-12)
    assert every_plan_bound(TESTBED, M8, w) <= sub
