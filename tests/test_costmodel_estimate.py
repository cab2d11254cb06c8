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
    """Identical devices: t* = tokens·τ/N + pair-heads·ρ/N + the optimizer step, with the estimate's
    kernel times (attention fwd + 2.5× bwd at eff_attention, loss traffic at HBM bandwidth)."""
    w = wl(64 * 1024, global_batch=2)
    g = node8.devices[0].gpu
    hbm = g.hbm_bandwidth_gbps * 1e9
    tau = 3 * MODEL.linear_flops_per_token / g.matmul_flops + MODEL.vocab * 12.0 / hbm
    rho = 3.5 * 4 * MODEL.head_dim / g.attention_flops
    pair_heads = 2 * MODEL.layers * H * w.seq_len * (w.seq_len + 1) / 2
    opt = MODEL.param_count / 8 * 28.0 / hbm
    t = w.tokens * tau / 8 + pair_heads * rho / 8 + opt
    assert compute_bound(node8, MODEL, w) == pytest.approx(w.tokens / t, rel=1e-12)
    f_lin, f_att = useful_flops(MODEL, w)
    assert f_lin + f_att == pytest.approx(2 * MODEL.training_flops(w.seq_len))
    # the kernel-time bound is below the useful-FLOP one (flash backward, loss, optimizer cost time)
    assert compute_bound(node8, MODEL, w) < w.tokens / (f_lin / (8 * g.matmul_flops) + f_att / (8 * g.attention_flops))


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
@pytest.mark.parametrize("make", [ulysses_plan, lambda d, S, H, HKV: symmetric_plan(d, S, H, HKV, 2, 4), ring_plan])
def test_balanced_plan_without_comm_or_recompute_reaches_the_bound(node8, make, sharding):
    """Even plans on identical GPUs are perfectly balanced: without communication and recompute
    they run exactly at the bound (the bound uses the estimate's own kernel time model)."""
    w = wl(64 * 1024, ac=False, param_sharding=sharding)
    plan = make(range(8), w.seq_len, H, HKV)
    e = estimate(plan, node8, MODEL, w, CostOptions(ignore_comm=True))
    assert e.efficiency_vs_bound == pytest.approx(1.0, rel=1e-9)
    # any communication or recompute moves it below 1
    assert estimate(plan, node8, MODEL, wl(64 * 1024, ac=True, param_sharding=sharding), CostOptions(ignore_comm=True)).efficiency_vs_bound < 0.999
    assert estimate(plan, node8, MODEL, w).efficiency_vs_bound < 0.999


def test_bound_is_kept_by_uneven_plans_on_mixed_gpus(testbed):
    """No plan beats the bound, also on mixed GPUs without any communication."""
    w = wl(64 * 1024, ac=False)
    for seed in range(6):
        plan = random_plan(8, w.seq_len, H, HKV, seed=seed, block_size=128)
        e = estimate(plan, testbed, MODEL, w, CostOptions(ignore_comm=True))
        assert 0 < e.efficiency_vs_bound <= 1 + 1e-12


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


def _layer_windows(e, w):
    """Per rank (C_f, C_b, H_b): one layer's forward / backward compute and the LM head's backward,
    from the estimate's phases (no recompute)."""
    B, Lyr = w.global_batch, MODEL.layers
    lin_f = np.array([r.time_s["linear"] for r in e.ranks]) / (3 * B * Lyr)
    att_f = np.array([r.time_s["attention"] for r in e.ranks]) / (3.5 * B * Lyr)
    head = np.array([r.time_s["lm_head"] for r in e.ranks]) / B
    return lin_f + att_f, 2 * lin_f + 2.5 * att_f, head * 2 / 3


def test_replicated_vs_zero3_param_comm(testbed):
    """Per-layer collectives prefetched / bucketed behind the rank's own compute (estimate.py)."""
    S, B, Lyr = 32 * 1024, 4, MODEL.layers
    plan = symmetric_plan(range(8), S, H, HKV, 2, 4)
    bw, lat = 25e9, 10e-6  # the testbed's slowest link (the NIC) and its latency
    layer = 2 * MODEL.params_per_layer
    root = 2 * (MODEL.param_count - Lyr * MODEL.params_per_layer)
    ag, ag_root = 7 / 8 * layer / bw + 7 * lat, 7 / 8 * root / bw + 7 * lat
    ar, ar_root = 2 * ag, 2 * ag_root
    w = wl(S, ac=False, param_sharding="replicated", global_batch=B)
    r = estimate(plan, testbed, MODEL, w)
    _, c_b, _ = _layer_windows(r, w)
    rc = np.array([x.time_s["param_comm"] for x in r.ranks])
    np.testing.assert_allclose(rc, (Lyr - 1) * np.maximum(0, ar - c_b) + ar + ar_root, rtol=1e-9)
    assert np.all(rc < Lyr * ar + ar_root)  # something is hidden: the old, unoverlapped charge is higher
    w = wl(S, ac=False, param_sharding="zero3", global_batch=B)
    z = estimate(plan, testbed, MODEL, w)
    c_f, c_b, h_b = _layer_windows(z, w)
    fwd = ag_root + ag + (Lyr - 1) * np.maximum(0, ag - c_f)
    bwd = np.maximum(0, ag - h_b) + (Lyr - 1) * np.maximum(0, 2 * ag - c_b) + ag + ag_root
    zc = np.array([x.time_s["param_comm"] for x in z.ranks])
    np.testing.assert_allclose(zc, B * (fwd + bwd), rtol=1e-9)
    assert np.all(zc < B * (3 * (Lyr * ag + ag_root)))
    assert np.all(zc > 0)


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_long_sequences_hide_the_per_layer_collectives(testbed, sharding):
    """At 256K every layer's compute outlasts its collectives: only the unhidden ones remain (the
    first gathers and the last reduce-scatter / bucket), the same on every rank."""
    w = wl(256 * 1024, param_sharding=sharding, global_batch=2)
    plan = symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4)
    e = estimate(plan, testbed, MODEL, w)
    layer = 2 * MODEL.params_per_layer
    root = 2 * (MODEL.param_count - MODEL.layers * MODEL.params_per_layer)
    ag, ag_root = 7 / 8 * layer / 25e9 + 7 * 10e-6, 7 / 8 * root / 25e9 + 7 * 10e-6
    want = 2 * (2 * ag_root + 2 * ag) if sharding == "zero3" else 2 * ag + 2 * ag_root
    for r in e.ranks:
        assert r.time_s["param_comm"] == pytest.approx(want, rel=1e-9)


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


@pytest.mark.parametrize("ac", [False, True, "full"])
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
    w = wl(S, ac=("none", "selective", "full")[seed % 3])
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
    w = wl(128 * 1024, ac=("none", "selective", "full")[seed % 3])
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


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
@pytest.mark.parametrize("S", [8 * 1024, 256 * 1024])
def test_linear_form_exact_with_overlapped_param_collectives(h100x16, sharding, S):
    """The overlap terms max(0, comm - window) are exact affine pieces: node-aligned even plans on
    two nodes (slow NIC: short sequences expose the collectives, long ones hide them)."""
    w = wl(S, param_sharding=sharding, global_batch=2)
    lf_exposed = False
    for plan in (ulysses_plan(range(16), S, H, HKV), symmetric_plan(range(16), S, H, HKV, 2, 8)):
        busy, mem = _busy_and_memory(plan, h100x16, w)
        lf = _lf(plan, h100x16, w)
        t, m = lf.evaluate(plan)
        np.testing.assert_allclose(t, busy, rtol=1e-9)
        np.testing.assert_allclose(m, mem, rtol=1e-9)
        v = lf.variables(plan)
        # the overlap term: all subset sums of the slots, the first piece the empty sum (0)
        over = [term for term in lf.time_terms[0] if not term[0].coef and term[0].const == 0 and len(term) > 1]
        assert len(over) == 1 and len(over[0]) == (8 if sharding == "zero3" else 2)
        lf_exposed |= max(p.evaluate(v) for p in over[0]) > 0
    assert lf_exposed == (S == 8 * 1024)


@pytest.mark.parametrize("seed", range(4))
def test_selective_recompute_repeats_only_the_linear_forward(testbed, seed):
    """With checkpointing: recompute = one linear forward per layer (linear / 3); attention,
    all-to-all and KV exchange are not repeated, so those phases do not change."""
    S = 64 * 1024
    plan = random_plan(8, S, H, HKV, seed=seed, block_size=128)
    w0, w1 = wl(S, ac=False, param_sharding="replicated"), wl(S, ac=True, param_sharding="replicated")
    a, b = estimate(plan, testbed, MODEL, w0), estimate(plan, testbed, MODEL, w1)
    for ra, rb in zip(a.ranks, b.ranks):
        assert rb.time_s["recompute"] == pytest.approx(rb.time_s["linear"] / 3, rel=1e-12)
        for p in ("linear", "lm_head", "attention", "alltoall", "kv_exchange", "optimizer"):
            assert rb.time_s[p] == pytest.approx(ra.time_s[p], rel=1e-12), p
        # the recompute also widens the window that hides the all-reduce buckets
        assert rb.time_s["param_comm"] <= ra.time_s["param_comm"] + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_full_recompute_repeats_the_whole_forward(testbed, seed):
    """Full checkpointing: recompute = the layer's whole forward again, i.e. the linear forward
    (linear / 3), the attention forward (attention / 3.5), both all-to-alls (alltoall / 2) and the
    forward KV exchange's exposed part; the useful phases do not change. Selective is cheaper."""
    S = 64 * 1024
    plan = random_plan(8, S, H, HKV, seed=seed, block_size=128)
    w0, w1, w2 = (wl(S, ac=p, param_sharding="replicated") for p in ("none", "selective", "full"))
    a, b, f = (estimate(plan, testbed, MODEL, w) for w in (w0, w1, w2))
    c = components(plan, testbed, MODEL, w2)
    from hexiseq.costmodel.estimate import exchange_exposed
    x_f = MODEL.layers * exchange_exposed(c.att, c.xc_f)
    for r, (ra, rb, rf) in enumerate(zip(a.ranks, b.ranks, f.ranks)):
        t = rf.time_s
        assert t["recompute"] == pytest.approx(t["linear"] / 3 + t["attention"] / 3.5 + t["alltoall"] / 2 + x_f[r], rel=1e-12)
        assert t["recompute"] >= rb.time_s["recompute"] > 0
        for p in ("linear", "lm_head", "attention", "alltoall", "kv_exchange", "optimizer"):
            assert t[p] == pytest.approx(ra.time_s[p], rel=1e-12), p
    # the plan communicates and attends, and full's recompute includes that where selective's does not
    assert max(r.time_s["alltoall"] for r in f.ranks) > 0 and max(r.time_s["attention"] for r in f.ranks) > 0
    assert max(rf.time_s["recompute"] - rb.time_s["recompute"] for rb, rf in zip(b.ranks, f.ranks)) > 0
    assert f.iteration_time_s > b.iteration_time_s > a.iteration_time_s
    assert max(r.memory_gib for r in f.ranks) < max(r.memory_gib for r in b.ranks) < max(r.memory_gib for r in a.ranks)


def test_the_cost_model_refuses_auto(testbed):
    """"auto" is the planner's choice, not a policy a time or memory can be given for."""
    from hexiseq.errors import SpecError
    from hexiseq.costmodel.simulate import simulate

    w = Workload(seq_len=32 * 1024, activation_checkpointing="auto")
    plan = symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4)
    for fn in (lambda: estimate(plan, testbed, MODEL, w), lambda: simulate(plan, testbed, MODEL, w),
               lambda: linear_form(testbed, MODEL, w, [list(range(8))])):
        with pytest.raises(SpecError, match="concrete recompute policy"):
            fn()
