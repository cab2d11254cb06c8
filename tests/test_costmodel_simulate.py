"""The step replay (hexiseq/costmodel/simulate.py): against an independent replay written from its
module doc (rendezvous rules of the all-to-alls and KV rounds, double buffering, overlap slowdown,
layer-boundary synchronization, prefetched collectives), phases that sum to the iteration time on
every rank, traced critical paths whose length is their pass's duration, and its properties."""

import json

import numpy as np
import pytest
from _costmodel_ref import edge_plan, executor_bytes, on_devices, rank_gpus, with_fields, with_knobs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexiseq.costmodel import CostOptions, simulate
from hexiseq.costmodel.durations import durations
from hexiseq.costmodel.paths import Barrier, Pass
from hexiseq.costmodel.simulate import PHASES, pass_schedule, path_length, simulate_durations
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.specs import ClusterSpec, ModelSpec, Workload, get_model, load_cluster

MODEL = get_model("llama2-7b")
H, HKV = MODEL.heads, MODEL.kv_heads
POLICIES = ("none", "selective", "full")


@pytest.fixture(scope="module")
def sim32():
    return load_cluster("sim-32")


# ------------------------------------------------------------------------------ an independent replay


def _chain(d, backward: bool) -> np.ndarray:
    """Every rank's finish of one layer pass from a synchronized start at 0 (simulate.py's doc),
    rank by rank with plain loops."""
    a, R, k = d.a, d.a.R, d.a.k
    grp = [int(g) for g in a.grp]
    members = [[r for r in range(R) if grp[r] == g] for g in range(k)]
    active = [bool(e > 0) for e in a.eta]

    def sync(t):  # the all-to-all's rendezvous; without communication there is none
        return [max(t[q] for q in members[grp[r]]) for r in range(R)] if d.comm else list(t)

    def exchange(t, att, cost, both=1.0):  # both = 2 in backward: K/V in and dK/dV back over the link
        att = [
            [att[r][j] + (both * d.slowdown[r] * d.link[r][j + 1] if j + 1 < k else 0.0) for j in range(k)]
            for r in range(R)
        ]
        A = [t[r] + att[r][0] for r in range(R)]
        P = list(t)
        for j in range(1, k):
            if not d.comm:
                A = [A[r] + att[r][j] for r in range(R)]
                continue
            posted = {g: max(P[q] for q in members[g] if active[q]) for g in range(k)}
            M = [max(P[r], posted[(grp[r] - j) % k], posted[(grp[r] + j) % k]) for r in range(R)]
            C = [M[r] + cost(r, j) for r in range(R)]
            P = [max(C[r], A[r]) for r in range(R)]  # P_{j+1} = max(C_j, A_{j-1})
            A = [max(A[r], C[r]) + att[r][j] for r in range(R)]
        return [A[r] if active[r] else t[r] for r in range(R)]

    def forward(t):
        t = [t[r] + d.lin_pre_f[r] for r in range(R)]
        t = [x + max(d.a2a_in[r]) for r, x in enumerate(sync(t))]
        t = exchange(t, d.att_f.tolist(), lambda r, j: max(d.xc_f[r, j]))
        t = [x + max(d.a2a_out[r]) for r, x in enumerate(sync(t))]
        return [t[r] + d.lin_post_f[r] for r in range(R)]

    if not backward:
        return np.array(forward([0.0] * R))
    t = forward([0.0] * R) if d.rule.replay_layer else [0.0] * R
    t = [t[r] + d.lin_post_b[r] for r in range(R)]
    t = [x + max(d.a2a_out[r]) for r, x in enumerate(sync(t))]
    t = exchange(t, d.att_b.tolist(), lambda r, j: d.xc_b[r, j], both=2.0)
    t = [x + max(d.a2a_in[r]) for r, x in enumerate(sync(t))]
    return np.array([t[r] + d.lin_pre_b[r] for r in range(R)])


def reference_iteration(d) -> float:
    """The iteration of simulate.py's doc: passes separated by global synchronization, prefetched
    collectives hidden behind each rank's compute window, the optimizer step at the end."""
    end_f, end_b, head = _chain(d, False), _chain(d, True), d.head

    def D(end, window, c=0.0):
        if c <= 0:
            return end.max()
        return max(c, (end + np.maximum(0.0, c - window) + d.slowdown * c).max())

    p, B, Lyr = d.params, d.batch, d.layers
    f, b, h = (
        (lambda c=0.0: D(end_f, d.window_f, c)),
        (lambda c=0.0: D(end_b, d.window_b, c)),
        (lambda c=0.0: D(head, d.window_h, c)),
    )
    if not d.comm:
        t = B * (Lyr * (f() + b()) + h())
    elif p.sharding == "zero3":
        t = B * (
            p.ag_root
            + p.ag_layer
            + (Lyr - 1) * f(p.ag_layer)
            + f()
            + h(p.ag_layer)
            + (Lyr - 1) * b(p.ag_layer + p.rs_layer)
            + b()
            + p.rs_layer
            + p.rs_root
        )
    else:  # replicated: the all-reduce buckets in the last micro-step's backward only
        t = B * Lyr * f() + B * h() + (B * Lyr - (Lyr - 1)) * b() + (Lyr - 1) * b(p.ar_layer) + p.ar_layer + p.ar_root
    return float(t + d.optimizer.max())


def own_work(d) -> np.ndarray:
    """[R] what each rank does itself in one iteration, with no waiting and every transfer hidden."""
    act = d.a.active
    f = (
        d.lin_pre_f
        + d.lin_post_f
        + d.a2a_in.max(axis=1)
        + d.a2a_out.max(axis=1)
        + np.where(act, d.att_f.sum(axis=1), 0)
    )
    b = (
        d.lin_pre_b
        + d.lin_post_b
        + d.a2a_in.max(axis=1)
        + d.a2a_out.max(axis=1)
        + np.where(act, d.att_b.sum(axis=1), 0)
    )
    b = b + (f if d.rule.replay_layer else 0.0)
    return d.batch * (d.layers * (f + b) + d.head) + d.optimizer


CLUSTERS = {"testbed-8": load_cluster("testbed-8"), "sim-32": load_cluster("sim-32")}
MODELS = {"llama3-8b": get_model("llama3-8b"), "llama3.2-3b": get_model("llama3.2-3b"), "llama2-7b": MODEL}


def _case(seed, world, cluster_name, model_name, policy, sharding, batch, ignore_comm, whole, shuffle):
    cluster, model = CLUSTERS[cluster_name], MODELS[model_name]
    world = min(world, cluster.size)
    S = 2 * 128 * (world + 6 + seed % 7)
    plan = random_plan(world, S, model.heads, model.kv_heads, seed=seed, block_size=128, whole_kv_heads=whole)
    if shuffle:  # a device subset spread over the cluster's nodes
        devs = np.random.default_rng(seed).permutation(cluster.size)[:world]
        plan = on_devices(plan, devs.tolist())
    w = Workload(seq_len=S, activation_checkpointing=policy, param_sharding=sharding, global_batch=batch)
    return plan, cluster, model, w, CostOptions(ignore_comm=ignore_comm)


CASE = st.tuples(
    st.integers(0, 10_000),
    st.integers(1, 10),
    st.sampled_from(sorted(CLUSTERS)),
    st.sampled_from(sorted(MODELS)),
    st.sampled_from(POLICIES),
    st.sampled_from(("zero3", "replicated")),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=CASE,
    knobs=st.sampled_from([None, (0.0, 0.0), (256.0, 0.0), (0.0, 0.08), (512.0, 0.15), (256.0, 0.08, 40.0)]),
)
def test_replay_properties_on_random_plans(case, knobs, within):
    """For random plans, clusters, policies, shardings, batch sizes and kernel knobs (None: the catalog's;
    a third knob: a per-operator time, costmodel/operators.py):
    - every traced critical path's length is its pass's duration;
    - every rank's phases sum to the iteration time, with no negative wait;
    - the replay equals the independent replay of its documented rules;
    - the iteration is at least every rank's own work."""
    plan, cluster, model, w, opts = _case(*case)
    d = durations(plan, cluster if knobs is None else with_knobs(cluster, *knobs), model, w, opts)
    sim = simulate_durations(d, trace=True)
    it = sim.iteration_time_s
    assert set(sim.paths) == set(sim.passes)
    for name, (count, seconds) in sim.passes.items():
        assert count > 0
        within(abs(path_length(d, sim.paths[name]) - seconds) / max(seconds, 1e-300), 1e-12, f"path of {name!r}")
    assert sum(c * s for c, s in sim.passes.values()) == pytest.approx(it, rel=1e-14)
    total = sum(sim.phases[p] for p in PHASES)
    within(np.abs(total - it).max() / it, 1e-12, "phases sum to the iteration")
    assert sim.phases["wait"].min() >= -1e-12 * it
    assert all(sim.phases[p].min() >= -1e-12 * it for p in PHASES)
    within(abs(reference_iteration(d) - it) / it, 1e-12, "independent replay")
    assert it >= own_work(d).max() * (1 - 1e-12)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_paths_and_phases_of_the_edge_plan(policy, sharding, within):
    plan = edge_plan()
    model = ModelSpec("edge", layers=3, hidden=48, heads=6, kv_heads=2, ffn=64, vocab=100)
    cluster = ClusterSpec.from_nodes("c6", [("A100-80GB", 3, 25), ("H100-SXM", 3, 50)])
    w = Workload(
        seq_len=plan.seq_len, block_size=2, activation_checkpointing=policy, param_sharding=sharding, global_batch=2
    )
    d = durations(plan, with_knobs(cluster, 3, 0.2), model, w)
    sim = simulate_durations(d, trace=True)
    for name, (_, seconds) in sim.passes.items():
        within(abs(path_length(d, sim.paths[name]) - seconds) / seconds, 1e-12, name)
    within(abs(reference_iteration(d) - sim.iteration_time_s) / sim.iteration_time_s, 1e-12, "independent replay")
    np.testing.assert_allclose(sum(sim.phases.values()), sim.iteration_time_s, rtol=1e-12)


# ------------------------------------------------------------------------------ special cases


@pytest.mark.parametrize("seed", range(6))
def test_without_communication_single_rank_groups_run_at_the_slowest_rank(testbed, seed):
    """ignore_comm and one rank per group: nothing couples the ranks inside a pass, so each pass takes
    its slowest rank's own work and the iteration is the sum over passes of those."""
    w = Workload(
        seq_len=2 * 128 * 16,
        activation_checkpointing=POLICIES[seed % 3],
        param_sharding=("zero3", "replicated")[seed % 2],
        global_batch=1 + seed % 3,
    )
    k = 2 + seed % 6
    rng = np.random.default_rng(seed)
    blocks = 1 + np.diff(
        np.concatenate([[0], np.sort(rng.choice(np.arange(1, 16 - k + 1), k - 1, replace=False)), [16 - k]])
    )
    plan = Plan(
        w.seq_len,
        H,
        HKV,
        tuple(Group((7 - i,), 128 * int(b), (256 * int(b),), (H,)) for i, b in enumerate(blocks)),
        128,
    )
    d = durations(plan, testbed, MODEL, w, CostOptions(ignore_comm=True))
    sim = simulate_durations(d)
    f = d.lin_pre_f + d.lin_post_f + d.att_f.sum(axis=1)
    b = d.lin_pre_b + d.lin_post_b + d.att_b.sum(axis=1) + (f if d.rule.replay_layer else 0)
    want = w.global_batch * (MODEL.layers * (f.max() + b.max()) + d.head.max()) + d.optimizer.max()
    assert sim.iteration_time_s == pytest.approx(want, rel=1e-12)
    for p in ("alltoall", "kv_exchange", "param_comm"):
        assert np.abs(sim.phases[p]).max() <= 1e-12 * sim.iteration_time_s, p  # zero up to rounding


def _one_uneven_group(testbed, policy):
    S = 64 * 1024
    w = Workload(seq_len=S, activation_checkpointing=policy)
    shards = (12288, 2048, 12288, 6144, 4096, 12288, 8192, 8192)
    heads = (2, 8, 1, 5, 3, 1, 8, 4)
    plan = Plan(S, H, HKV, (Group(tuple(range(8)), S // 2, shards, heads),), 128)
    d = durations(plan, testbed, MODEL, w, CostOptions(ignore_comm=True))
    return d, simulate_durations(d)


def _slowest_own_work_per_pass(d) -> float:
    f = d.lin_pre_f + d.lin_post_f + np.where(d.a.active, d.att_f.sum(axis=1), 0)
    b = d.lin_pre_b + d.lin_post_b + np.where(d.a.active, d.att_b.sum(axis=1), 0) + (f if d.rule.replay_layer else 0)
    return d.batch * (d.layers * (f.max() + b.max()) + d.head.max()) + d.optimizer.max()


@pytest.mark.parametrize("policy", POLICIES)
def test_without_communication_one_group_is_at_least_its_slowest_rank(testbed, policy):
    """ignore_comm, one group of uneven ranks: at least the sum over passes of the slowest rank's own
    work (holds whether or not the free all-to-alls still synchronize the group)."""
    d, sim = _one_uneven_group(testbed, policy)
    assert sim.iteration_time_s >= _slowest_own_work_per_pass(d) * (1 - 1e-12)
    assert sim.iteration_time_s >= own_work(d).max() * (1 - 1e-12)
    np.testing.assert_allclose(sum(sim.phases.values()), sim.iteration_time_s, rtol=1e-12)


def test_without_communication_nobody_waits_inside_a_pass(testbed):
    """ignore_comm and one group: with no transfers nobody waits inside a pass (durations.py's
    Coefficients.comm), so the replay is the sum over passes of the slowest rank's own work."""
    d, sim = _one_uneven_group(testbed, "none")
    assert sim.iteration_time_s == pytest.approx(_slowest_own_work_per_pass(d), rel=1e-12)


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
@pytest.mark.parametrize("policy", POLICIES)
def test_symmetric_plans_on_identical_devices_never_wait(node8, sharding, policy):
    w = Workload(seq_len=128 * 1024, activation_checkpointing=policy, param_sharding=sharding, global_batch=2)
    for plan in (
        ring_plan(range(8), w.seq_len, H, HKV),
        ulysses_plan(range(8), w.seq_len, H, HKV),
        symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4),
        symmetric_plan(range(8), w.seq_len, H, HKV, 4, 2),
    ):
        sim = simulate(plan, node8, MODEL, w)
        assert np.abs(sim.phases["wait"]).max() <= 1e-12 * sim.iteration_time_s, plan.name
        busy = sim.busy_s
        assert np.ptp(busy) <= 1e-12 * busy.max()


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_balanced_plan_param_collectives_add_no_wait(h100x16, sharding):
    """Identical ranks issue every collective together (exposed at 16K, hidden at 256K): no waits;
    the replicated all-reduce is charged once per iteration, not per micro-step."""
    for S in (16 * 1024, 256 * 1024):
        w = Workload(seq_len=S, activation_checkpointing="selective", param_sharding=sharding, global_batch=3)
        plan = symmetric_plan(range(16), S, H, HKV, 2, 8)
        sim = simulate(plan, h100x16, MODEL, w)
        assert np.abs(sim.phases["wait"]).max() <= 1e-12 * sim.iteration_time_s
        assert sim.phases["param_comm"].min() > 0
        if sharding == "replicated":
            s1 = simulate(
                plan, h100x16, MODEL, Workload(seq_len=S, activation_checkpointing="selective", param_sharding=sharding)
            )
            np.testing.assert_allclose(sim.phases["param_comm"], s1.phases["param_comm"], rtol=1e-12)


def test_exchange_coupling_adds_waits(sim32):
    """A ring over mixed GPUs and links: groups wait for their slower partners, so the iteration is
    longer than any rank's own work."""
    w = Workload(seq_len=128 * 1024, activation_checkpointing="selective")
    plan = ring_plan(range(32), w.seq_len, H, HKV)
    d = durations(plan, sim32, MODEL, w)
    sim = simulate_durations(d)
    assert sim.iteration_time_s > 1.01 * own_work(d).max()
    assert sim.phases["wait"].max() > 0 and sim.phases["kv_exchange"].max() > 0


def test_single_rank_plan_has_no_communication(testbed):
    w = Workload(seq_len=32 * 1024)
    plan = Plan(w.seq_len, H, HKV, (Group((4,), w.seq_len // 2, (w.seq_len,), (H,)),), 128, "single")
    sim = simulate(plan, testbed, MODEL, w)
    for p in ("alltoall", "kv_exchange", "param_comm", "wait"):
        assert abs(sim.phases[p][0]) <= 1e-12 * sim.iteration_time_s, p  # zero up to rounding
    d = durations(plan, testbed, MODEL, w)
    assert sim.iteration_time_s == pytest.approx(own_work(d)[0], rel=1e-12)
    assert sim.device_s[0] == pytest.approx(sim.iteration_time_s, rel=1e-12)  # one rank: all its own work


def test_device_time_is_the_step_without_collectives_and_waiting(sim32):
    """SimResult.device_s (what an emulated rank's pacing measures) is each rank's step less its
    collectives and its waiting, on a plan that has both."""
    w = Workload(seq_len=16 * 1024, global_batch=2, param_sharding="zero3")
    plan = random_plan(8, w.seq_len, H, HKV, seed=3, block_size=128)
    sim = simulate(plan, sim32, MODEL, w)
    comm = sum(sim.phases[k] for k in ("alltoall", "kv_exchange", "param_comm", "wait"))
    np.testing.assert_allclose(sim.device_s, sim.iteration_time_s - comm, rtol=1e-12)
    assert (sim.device_s > 0).all() and (sim.device_s < sim.iteration_time_s).any()


# ------------------------------------------------------------------------------ knobs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_full_recompute_is_slower_than_selective_slower_than_none(testbed, seed, sharding):
    """On a fixed plan (memory not considered): each policy only adds work to the replay."""
    plan = random_plan(8, 64 * 1024, H, HKV, seed=seed, block_size=128)
    t = [
        simulate(
            plan, testbed, MODEL, Workload(seq_len=plan.seq_len, activation_checkpointing=p, param_sharding=sharding)
        ).iteration_time_s
        for p in POLICIES
    ]
    assert t[2] > t[1] > t[0]


@pytest.mark.parametrize("seed", range(3))
def test_selective_recompute_phase_is_the_linear_forward(testbed, seed):
    """Selective: the recompute phase is one more linear forward per layer and micro-step, and the
    useful phases stay what they are without recompute."""
    plan = random_plan(8, 64 * 1024, H, HKV, seed=seed, block_size=128)
    w0, w1 = (
        Workload(seq_len=plan.seq_len, activation_checkpointing=p, param_sharding="replicated", global_batch=2)
        for p in ("none", "selective")
    )
    s0, s1 = simulate(plan, testbed, MODEL, w0), simulate(plan, testbed, MODEL, w1)
    d1 = durations(plan, testbed, MODEL, w1)
    np.testing.assert_allclose(s1.phases["recompute"], 2 * MODEL.layers * (d1.lin_pre_f + d1.lin_post_f), rtol=1e-12)
    for p in ("linear", "memory_bound", "attention", "alltoall", "lm_head", "optimizer"):
        np.testing.assert_allclose(s1.phases[p], s0.phases[p], rtol=1e-12, err_msg=p)
    assert not s0.phases["recompute"].any()
    # the rerun also widens the backward window that hides the all-reduce buckets
    assert np.all(s1.phases["param_comm"] <= s0.phases["param_comm"] * (1 + 1e-12))


@pytest.mark.parametrize("seed", range(3))
def test_full_recompute_replays_the_forward(testbed, seed):
    """Full: the recompute phase holds at least the whole forward again (linear parts, all-to-alls,
    attention) on every rank; the useful phases do not change."""
    plan = random_plan(8, 64 * 1024, H, HKV, seed=seed, block_size=128)
    w0, wf = (Workload(seq_len=plan.seq_len, activation_checkpointing=p) for p in ("none", "full"))
    s0, sf = simulate(plan, testbed, MODEL, w0), simulate(plan, testbed, MODEL, wf)
    d = durations(plan, testbed, MODEL, wf)
    fwd = (
        d.lin_pre_f
        + d.lin_post_f
        + d.a2a_in.max(axis=1)
        + d.a2a_out.max(axis=1)
        + np.where(d.a.active, d.att_f.sum(axis=1), 0)
    )
    assert np.all(sf.phases["recompute"] >= MODEL.layers * fwd * (1 - 1e-12))
    for p in ("linear", "memory_bound", "attention", "lm_head", "optimizer"):
        np.testing.assert_allclose(sf.phases[p], s0.phases[p], rtol=1e-12, err_msg=p)
    np.testing.assert_allclose(sf.phases["alltoall"], s0.phases["alltoall"], rtol=1e-12)


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
@pytest.mark.parametrize("ignore_comm", [False, True])
def test_global_batch_scales_the_micro_steps(testbed, sharding, ignore_comm):
    """B sequences: every micro-step pass B times; the optimizer (and the replicated all-reduce of
    the last micro-step) once."""
    plan = random_plan(8, 32 * 1024, H, HKV, seed=7, block_size=128)
    opts = CostOptions(ignore_comm=ignore_comm)
    sims = {
        B: simulate(
            plan,
            testbed,
            MODEL,
            Workload(
                seq_len=plan.seq_len, activation_checkpointing="selective", param_sharding=sharding, global_batch=B
            ),
            opts,
        )
        for B in (1, 4)
    }
    opt = sims[1].passes["optimizer"][1]
    assert sims[4].passes["optimizer"] == (1.0, opt)
    if sharding == "zero3" or ignore_comm:
        assert sims[4].iteration_time_s - opt == pytest.approx(4 * (sims[1].iteration_time_s - opt), rel=1e-12)
    else:
        P = sims[1].passes
        micro = MODEL.layers * P["forward"][1] + P["LM head"][1] + MODEL.layers * P["backward"][1]
        assert sims[4].iteration_time_s - sims[1].iteration_time_s == pytest.approx(3 * micro, rel=1e-12)
        assert sims[4].passes["backward"][0] == 4 * MODEL.layers - (MODEL.layers - 1)
    for name, (count, seconds) in sims[1].passes.items():
        c4, s4 = sims[4].passes[name]
        assert s4 == pytest.approx(seconds, rel=1e-12), name
        if name not in ("optimizer", "backward, all-reduce", "all-reduce last bucket + root", "backward"):
            assert c4 == 4 * count, name


@pytest.mark.parametrize("knobs", ["catalog", "no-slowdown"])
def test_param_collective_phases_by_hand(testbed, knobs):
    """Per-layer collectives prefetched behind each rank's compute windows: the exposed part per rank
    is max(0, comm - window) plus the rank's overlap_slowdown × comm (the compute it overlaps is
    slowed; nothing with overlap_slowdown = 0, set here), plus the exposed first gathers / last
    reduce-scatters."""
    cluster = testbed if knobs == "catalog" else with_fields(testbed, overlap_slowdown=0.0)
    S, B, Lyr = 32 * 1024, 4, MODEL.layers
    plan = symmetric_plan(range(8), S, H, HKV, 2, 4)
    layer = 2 * MODEL.params_per_layer
    root = 2 * (MODEL.param_count - Lyr * MODEL.params_per_layer)
    gpus = rank_gpus(plan, cluster)
    nic = 25e9 * min(
        g.nic_efficiency for g in gpus
    )  # the slowest link: the 25 GB/s NIC at its achieved fraction, 10 us
    assert nic < min(g.link_bandwidth_gbps * 1e9 * g.link_efficiency for g in gpus)
    slow = np.array([g.overlap_slowdown for g in gpus])
    ag, ag_root = 7 / 8 * layer / nic + 7 * 10e-6, 7 / 8 * root / nic + 7 * 10e-6
    ar, ar_root = 2 * 7 / 8 * layer / nic + 14 * 10e-6, 2 * 7 / 8 * root / nic + 14 * 10e-6
    w = Workload(seq_len=S, param_sharding="replicated", global_batch=B)
    d = durations(plan, cluster, MODEL, w)
    rc = simulate_durations(d).phases["param_comm"]
    np.testing.assert_allclose(rc, (Lyr - 1) * (np.maximum(0, ar - d.window_b) + slow * ar) + ar + ar_root, rtol=1e-12)
    assert np.all(rc < Lyr * ar + ar_root)  # something is hidden
    w = Workload(seq_len=S, param_sharding="zero3", global_batch=B)
    d = durations(plan, cluster, MODEL, w)
    zc = simulate_durations(d).phases["param_comm"]
    fwd = ag_root + ag + (Lyr - 1) * (np.maximum(0, ag - d.window_f) + slow * ag)
    bwd = (
        np.maximum(0, ag - d.window_h)
        + slow * ag
        + (Lyr - 1) * (np.maximum(0, 2 * ag - d.window_b) + slow * 2 * ag)
        + ag
        + ag_root
    )
    np.testing.assert_allclose(zc, B * (fwd + bwd), rtol=1e-12)
    assert np.all(zc > 0)


def test_overlap_slowdown_charges_the_overlapped_compute(testbed):
    """A nonzero overlap slowdown makes the multi-group replay slower, and by no more than slowdown ×
    (each round's largest link time, per layer pass; a backward round moves the K/V and their
    gradients: at most twice the forward's) plus slowdown × the collectives it overlaps. The replay
    is monotone in the slowdown: the catalog's lies between none and a larger one."""
    plan = random_plan(8, 64 * 1024, H, HKV, seed=4, block_size=128)
    w = Workload(seq_len=plan.seq_len, param_sharding="replicated")
    base = simulate(plan, with_fields(testbed, overlap_slowdown=0.0), MODEL, w).iteration_time_s
    hi = min(1.0, max(g.overlap_slowdown for g in rank_gpus(plan, testbed)) + 0.1)
    d = durations(plan, with_fields(testbed, overlap_slowdown=hi), MODEL, w)
    slow = simulate_durations(d).iteration_time_s
    assert slow > base
    catalog = simulate(plan, testbed, MODEL, w).iteration_time_s
    assert base * (1 - 1e-12) <= catalog <= slow * (1 + 1e-12)
    # a pass's longest path meets each exchange round once, on one rank: it gains at most the largest
    # link time of each round (twice that in a backward exchange), and the collective it overlaps
    Lyr, B = MODEL.layers, w.global_batch
    forwards = B * Lyr * (2 if d.rule.replay_layer else 1)
    per_round = d.link.max(axis=0).sum()
    assert slow - base <= hi * ((forwards + 2 * B * Lyr) * per_round + (Lyr - 1) * d.params.ar_layer) * (1 + 1e-12)
    assert plan.num_groups > 1


def _hidden_exchange(node8, slowdown: float):
    """Two groups of four identical H100s at 128K, no recompute: every KV transfer is shorter than
    the attention it hides behind and every rank does the same work, so nobody waits and the
    "kv_exchange" phase is only what the overlap slowdown charges. Returns (durations, replay,
    [R] link seconds of the forward round from the executor's tables: bytes in + bytes out over the
    NVLink at the catalog's link_efficiency)."""
    plan = symmetric_plan(range(8), 128 * 1024, H, HKV, 2, 4)
    cluster = with_fields(node8, overlap_slowdown=slowdown)
    d = durations(plan, cluster, MODEL, Workload(seq_len=plan.seq_len, activation_checkpointing="none", global_batch=2))
    recv, send = executor_bytes(plan, MODEL.head_dim)
    g = node8.devices[0].gpu
    return d, simulate_durations(d), (recv + send).sum(axis=1) / (g.link_bandwidth_gbps * 1e9 * g.link_efficiency)


def test_hidden_exchange_exposes_nothing_without_slowdown(node8):
    d, sim, link = _hidden_exchange(node8, 0.0)
    assert np.all(d.xc_f[:, 1].max(axis=1) < d.att_f[:, 0]) and np.all(d.xc_b[:, 1] < d.att_b[:, 0])  # hidden
    assert np.all(link > 0)
    it = sim.iteration_time_s
    assert np.abs(sim.phases["kv_exchange"]).max() <= 1e-12 * it and np.abs(sim.phases["wait"]).max() <= 1e-12 * it
    _, slowed, _ = _hidden_exchange(node8, 0.2)
    assert np.all(
        slowed.phases["kv_exchange"] >= 0.2 * 2 * MODEL.layers * 2 * link * (1 - 1e-12)
    )  # at least fwd + bwd once


def test_backward_exchange_slowdown_counts_the_gradients_too(node8):
    """kernels.py's overlap rule on the hidden exchange: per layer and sequence, slowdown × (the
    forward round's bytes in + out, and the backward round's: twice that) over the link."""
    d, sim, link = _hidden_exchange(node8, 0.2)
    want = 0.2 * d.batch * MODEL.layers * (link + 2 * link)
    np.testing.assert_allclose(sim.phases["kv_exchange"], want, rtol=1e-12)


def test_pass_schedule_lists_every_pass(testbed):
    w = Workload(seq_len=32 * 1024, param_sharding="zero3", global_batch=2)
    d = durations(symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4), testbed, MODEL, w)
    steps = pass_schedule(d)
    passes = [s for s in steps if isinstance(s, Pass)]
    assert sum(s.count for s in passes if s.chain == "f") == 2 * MODEL.layers
    assert sum(s.count for s in passes if s.chain == "b") == 2 * MODEL.layers
    assert sum(s.count for s in passes if s.chain == "h") == 2
    assert [s.name for s in steps if isinstance(s, Barrier)] == [
        "gather root + first layer",
        "reduce-scatter last layer + root",
    ]


def test_result_record(testbed):
    w = Workload(seq_len=32 * 1024)
    plan = random_plan(8, w.seq_len, H, HKV, seed=1, block_size=128)
    sim = simulate(plan, testbed, MODEL, w)
    assert sim.paths == {}  # only with trace=True
    assert sim.critical_rank == int(np.argmin(sim.phases["wait"]))
    np.testing.assert_allclose(sim.busy_s + sim.wait_s, sim.iteration_time_s, rtol=1e-15)
    d = json.loads(json.dumps(sim.to_dict()))
    assert set(d["phases"]) == set(PHASES) and d["iteration_time_s"] == sim.iteration_time_s
    assert simulate(plan, testbed, MODEL, w, trace=True).iteration_time_s == sim.iteration_time_s
