"""The analytic estimate, the compute bound and the planner's linear form."""

import json

import numpy as np
import pytest

from hexiseq.costmodel import PHASES, CostOptions, compute_bound, estimate, linear_form, useful_flops
from hexiseq.costmodel.bound import min_compute_time
from hexiseq.costmodel.estimate import components, phase_times
from hexiseq.costmodel.memory import memory_bytes
from hexiseq.errors import PlanError
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.specs import ClusterSpec, Workload, get_model

MODEL = get_model("llama2-7b")
H, HKV = MODEL.heads, MODEL.kv_heads


@pytest.fixture(scope="module")
def node8():
    return ClusterSpec.from_nodes("h100x8", [("H100-SXM", 8, 50)])


@pytest.fixture(scope="module")
def h100x16():
    return ClusterSpec.from_nodes("h100x16", [("H100-SXM", 8, 50), ("H100-SXM", 8, 50)])


def wl(S=128 * 1024, **kw):
    return Workload(seq_len=S, activation_checkpointing=kw.pop("ac", True), **kw)


def even_plans(n, S, devices=None):
    devs = list(devices if devices is not None else range(n))
    out = [ring_plan(devs, S, H, HKV), ulysses_plan(devs, S, H, HKV)]
    for cp in (2, 4):
        if n % cp == 0 and n // cp > 1 and H % (n // cp) == 0:
            out.append(symmetric_plan(devs, S, H, HKV, cp, n // cp))
    return out


# ---------------------------------------------------------------- structure of an Estimate


def test_estimate_fields_and_json(testbed):
    w = wl()
    e = estimate(symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4), testbed, MODEL, w, simulate=True)
    d = json.loads(json.dumps(e.to_dict()))
    for key in ("iteration_time_s", "tokens_per_s", "model_flops", "bound_tokens_per_s", "efficiency_vs_bound", "fits", "ranks", "mfu", "critical_rank", "critical_phase", "oom", "simulated_time_s"):
        assert key in d
    r0 = d["ranks"][0]
    for key in ("rank", "device", "gpu", "time_s", "memory_gib", "capacity_gib", "memory_breakdown_gib"):
        assert key in r0
    assert set(r0["time_s"]) == set(PHASES)
    assert e.model_flops == pytest.approx(MODEL.training_flops(w.seq_len))
    assert e.tokens_per_s == pytest.approx(w.seq_len / e.iteration_time_s)
    assert e.iteration_time_s == pytest.approx(max(r.busy_s for r in e.ranks))
    for r in e.ranks:
        assert sum(r.time_s.values()) == pytest.approx(r.busy_s)
        assert r.idle_s >= -1e-9
        assert sum(r.memory_breakdown_gib.values()) == pytest.approx(r.memory_gib)
    assert e.mfu == pytest.approx(e.model_flops / e.iteration_time_s / (testbed.peak_pflops * 1e15))
    assert e.simulated_time_s >= e.iteration_time_s * (1 - 1e-12)


def test_bad_plan_is_a_plan_error(testbed):
    plan = ring_plan(range(8), 8192, 16, 16)  # wrong head count for llama2-7b
    with pytest.raises(PlanError, match="heads"):
        estimate(plan, testbed, MODEL, wl(8192))


# ---------------------------------------------------------------- balance and critical path


@pytest.mark.parametrize("S", [64 * 1024, 256 * 1024])
def test_homogeneous_even_plans_are_balanced(node8, S):
    """On one node of identical GPUs every even layout keeps every rank busy (no idle)."""
    w = wl(S)
    for plan in even_plans(8, S):
        e = estimate(plan, node8, MODEL, w)
        busy = np.array([r.busy_s for r in e.ranks])
        assert np.ptp(busy) <= 1e-9 * busy.max(), plan.name


def test_homogeneous_two_nodes_node_aligned_groups_balanced(h100x16):
    w = wl(256 * 1024)
    for plan in (ulysses_plan(range(16), w.seq_len, H, HKV), symmetric_plan(range(16), w.seq_len, H, HKV, 2, 8)):
        busy = np.array([r.busy_s for r in estimate(plan, h100x16, MODEL, w).ranks])
        assert np.ptp(busy) <= 1e-9 * busy.max(), plan.name


def test_even_is_best_on_homogeneous_moving_tokens_hurts(node8):
    S = 128 * 1024
    w = wl(S)
    even = symmetric_plan(range(8), S, H, HKV, 4, 2)
    base = estimate(even, node8, MODEL, w).iteration_time_s
    L = S // 8
    for delta in (128, 1024):
        groups = list(even.groups)
        groups[0] = Group(groups[0].devices, L + delta, (L + delta,) * 2, groups[0].heads)
        groups[1] = Group(groups[1].devices, L - delta, (L - delta,) * 2, groups[1].heads)
        moved = Plan(S, H, HKV, tuple(groups), 128, "moved")
        assert estimate(moved, node8, MODEL, w).iteration_time_s > base


def test_h100_a100_even_plan_critical_path_is_an_a100(testbed):
    w = wl()
    for plan in even_plans(8, w.seq_len):
        e = estimate(plan, testbed, MODEL, w)
        assert e.ranks[e.critical_rank].gpu == "A100-80GB", plan.name
        assert e.critical_phase in PHASES
        # the H100s idle: they finish their equal share early
        assert min(r.idle_s for r in e.ranks if r.gpu == "H100-SXM") > 0.2 * e.iteration_time_s


def test_uneven_split_beats_even_on_mixed_cluster(testbed):
    S = 128 * 1024
    w = wl(S)
    even = estimate(symmetric_plan(range(8), S, H, HKV, 2, 4), testbed, MODEL, w)
    L0 = int(S / 2 * 0.72) // 128 * 128
    L1 = S // 2 - L0
    uneven = Plan(S, H, HKV, (Group((0, 1, 2, 3), L0, [L0 // 2] * 4, [8] * 4), Group((4, 5, 6, 7), L1, [L1 // 2] * 4, [8] * 4)), 128, "uneven")
    e = estimate(uneven, testbed, MODEL, w)
    assert e.iteration_time_s < 0.7 * even.iteration_time_s
    assert e.efficiency_vs_bound > even.efficiency_vs_bound


# ---------------------------------------------------------------- bound


def test_bound_homogeneous_closed_form(node8):
    w = wl(64 * 1024, global_batch=2)
    f_lin, f_att = useful_flops(MODEL, w)
    g = node8.devices[0].gpu
    t = f_lin / (8 * g.matmul_flops) + f_att / (8 * g.attention_flops)
    assert compute_bound(node8, MODEL, w) == pytest.approx(w.tokens / t, rel=1e-12)
    assert f_lin + f_att == pytest.approx(2 * MODEL.training_flops(w.seq_len))


def test_bound_lp_against_brute_force():
    """Two devices: the sorted-split solution equals a grid search over every work split."""
    rng = np.random.default_rng(0)
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


def test_efficiency_never_exceeds_bound(testbed):
    w = wl(64 * 1024, ac=False)
    for seed in range(8):
        plan = random_plan(8, w.seq_len, H, HKV, seed=seed, block_size=128)
        e = estimate(plan, testbed, MODEL, w)
        assert 0 < e.efficiency_vs_bound < 1
        assert e.bound_tokens_per_s == pytest.approx(compute_bound(testbed, MODEL, w))


# ---------------------------------------------------------------- knobs


def test_recompute_costs_time_and_saves_memory(testbed):
    S = 64 * 1024
    plan = symmetric_plan(range(8), S, H, HKV, 2, 4)
    a, b = estimate(plan, testbed, MODEL, wl(S, ac=False)), estimate(plan, testbed, MODEL, wl(S, ac=True))
    assert b.iteration_time_s > a.iteration_time_s
    assert max(r.memory_gib for r in b.ranks) < max(r.memory_gib for r in a.ranks)
    assert all(r.time_s["recompute"] == 0 for r in a.ranks)


def test_global_batch_scales_micro_steps(testbed):
    S = 32 * 1024
    plan = symmetric_plan(range(8), S, H, HKV, 2, 4)
    e1 = estimate(plan, testbed, MODEL, wl(S, global_batch=1))
    e4 = estimate(plan, testbed, MODEL, wl(S, global_batch=4))
    opt = e1.ranks[e1.critical_rank].time_s["optimizer"]
    assert e4.iteration_time_s == pytest.approx(4 * (e1.iteration_time_s - opt) + opt, rel=1e-9)
    assert e4.model_flops == pytest.approx(4 * e1.model_flops)


def test_replicated_vs_zero3_param_comm(testbed):
    S = 32 * 1024
    plan = symmetric_plan(range(8), S, H, HKV, 2, 4)
    z = estimate(plan, testbed, MODEL, wl(S, param_sharding="zero3", global_batch=4))
    r = estimate(plan, testbed, MODEL, wl(S, param_sharding="replicated", global_batch=4))
    # zero3: 3 collectives of 2P bytes per micro-step; replicated: one all-reduce (2x) per iteration
    zc, rc = z.ranks[0].time_s["param_comm"], r.ranks[0].time_s["param_comm"]
    bytes_per_s = 25e9
    assert rc == pytest.approx(2 * 7 / 8 * 2 * MODEL.param_count / bytes_per_s + 2 * 7 * 10e-6)
    assert zc > 4 * 3 * 7 / 8 * 2 * MODEL.param_count / bytes_per_s


def test_ignore_comm_leaves_only_compute(testbed):
    plan = random_plan(8, 64 * 1024, H, HKV, seed=5, block_size=128)
    e = estimate(plan, testbed, MODEL, wl(64 * 1024), CostOptions(ignore_comm=True))
    for r in e.ranks:
        assert r.time_s["alltoall"] == r.time_s["kv_exchange"] == r.time_s["param_comm"] == 0


def test_profile_overrides_efficiency(testbed):
    w = wl(64 * 1024)
    plan = symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4)
    slow = testbed.with_profile({"A100-80GB": {"eff_attention": 0.3}})
    assert estimate(plan, slow, MODEL, w).iteration_time_s > estimate(plan, testbed, MODEL, w).iteration_time_s


# ---------------------------------------------------------------- linear form


def _busy_and_memory(plan, cluster, w):
    c = components(plan, cluster, MODEL, w)
    return sum(phase_times(c).values()), sum(memory_bytes(c.a, MODEL, w, c.recv_bytes).values())


def _lf(plan, cluster, w, fixed=True):
    heads = [list(g.heads) for g in plan.groups] if fixed else None
    return linear_form(cluster, MODEL, w, [list(g.devices) for g in plan.groups], heads)


@pytest.mark.parametrize("ac", [False, True])
def test_linear_form_exact_for_symmetric_plans_on_uniform_links(node8, ac):
    """Same links for every pair and equal rounds: the affine pieces reproduce the estimate exactly."""
    w = wl(128 * 1024, ac=ac)
    for plan in even_plans(8, w.seq_len):
        busy, mem = _busy_and_memory(plan, node8, w)
        t, m = _lf(plan, node8, w).evaluate(plan)
        np.testing.assert_allclose(t, busy, rtol=1e-9)
        np.testing.assert_allclose(m, mem, rtol=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_linear_form_exact_for_one_group_uneven(testbed, seed):
    """One group (no exchange): everything is affine in s and L with fixed heads."""
    rng = np.random.default_rng(seed)
    S = 64 * 1024
    w = wl(S, ac=bool(seed % 2))
    shards = rng.multinomial(S - 8 * 128, np.ones(8) / 8) + 128
    heads = rng.multinomial(H - 8, np.ones(8) / 8) + 1
    plan = Plan(S, H, HKV, (Group(tuple(range(8)), S // 2, tuple(shards), tuple(heads)),), 128, "one-group")
    busy, mem = _busy_and_memory(plan, testbed, w)
    t, m = _lf(plan, testbed, w).evaluate(plan)
    np.testing.assert_allclose(t, busy, rtol=1e-9)
    np.testing.assert_allclose(m, mem, rtol=1e-9)


def test_linear_form_is_lower_bound_for_even_chunks_on_mixed_links(testbed):
    """With even chunks (a_last exact) each rank's affine time is ≤ the estimate: the form keeps
    only the extreme overlap regimes of the exchange and bounds Σ max(recv, send) from below."""
    w = wl(128 * 1024)
    for plan in even_plans(8, w.seq_len):
        busy, _ = _busy_and_memory(plan, testbed, w)
        t, _ = _lf(plan, testbed, w).evaluate(plan)
        assert np.all(t <= busy * (1 + 1e-9))
        assert np.all(t >= 0.9 * busy)
        assert t.max() == pytest.approx(busy.max(), rel=1e-9)  # the critical rank is exact


@pytest.mark.parametrize("seed", range(8))
def test_linear_form_close_on_random_uneven_plans(testbed, seed):
    """Uneven plans: per rank within 25% (middle overlap regimes, L̄ for the last round), iteration
    time (max) within 10%; memory exact (llama2-7b: no chunked loss). Free heads (κ = η/gq, slowest
    link, no self-share) stay within 50% per rank."""
    w = wl(128 * 1024, ac=bool(seed % 2))
    plan = random_plan(8, w.seq_len, H, HKV, seed=seed, block_size=128)
    busy, mem = _busy_and_memory(plan, testbed, w)
    t, m = _lf(plan, testbed, w).evaluate(plan)
    assert np.all(np.abs(t / busy - 1) < 0.25)
    assert t.max() == pytest.approx(busy.max(), rel=0.10)
    np.testing.assert_allclose(m, mem, rtol=1e-9)
    tf, mf = _lf(plan, testbed, w, fixed=False).evaluate(plan)
    assert np.all(np.abs(tf / busy - 1) < 0.5)
    assert np.all(np.abs(mf / mem - 1) < 0.05)


def test_linear_form_pieces_and_keys(testbed):
    w = wl(64 * 1024)
    plan = symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4)
    free = _lf(plan, testbed, w, fixed=False)
    keys = {k[0] for terms in free.time_terms for term in terms for p in term for k in p.coef}
    assert keys <= {"s", "L", "w", "wx", "eta"} and {"s", "w", "wx"} <= keys
    fixed = _lf(plan, testbed, w)
    keys = {k[0] for terms in fixed.time_terms for term in terms for p in term for k in p.coef}
    assert keys == {"s", "L"}
    v = fixed.variables(plan)
    for r in range(plan.world_size):
        pieces = fixed.time_pieces(r)
        t_r = sum(max(p.evaluate(v) for p in term) for term in fixed.time_terms[r])
        assert max(p.evaluate(v) for p in pieces) == pytest.approx(t_r)
    assert len(fixed.capacity_bytes) == plan.world_size
    with pytest.raises(PlanError):
        fixed.variables(ring_plan(range(8), w.seq_len, H, HKV))


def test_plan_on_a_subset_of_the_cluster(testbed):
    """Devices left out take no part; MFU still counts the whole cluster's peak."""
    w = wl(64 * 1024)
    plan = symmetric_plan([4, 5, 6, 7], w.seq_len, H, HKV, 2, 2)
    e = estimate(plan, testbed, MODEL, w, simulate=True)
    assert [r.device for r in e.ranks] == [4, 5, 6, 7]
    assert all(r.gpu == "A100-80GB" for r in e.ranks)
    assert e.mfu == pytest.approx(e.model_flops / e.iteration_time_s / (testbed.peak_pflops * 1e15))
    lf = linear_form(testbed, MODEL, w, [[4, 5], [6, 7]], [[16, 16], [16, 16]])
    t, _ = lf.evaluate(plan)
    busy, _ = _busy_and_memory(plan, testbed, w)
    np.testing.assert_allclose(t, busy, rtol=1e-9)  # symmetric on uniform (one-node) links: exact
