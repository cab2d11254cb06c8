"""The step simulator: where it must agree with the estimate, and the waits it adds."""

import numpy as np
import pytest

from hexiseq.costmodel import CostOptions, estimate, simulate
from hexiseq.costmodel.estimate import components, phase_times
from hexiseq.costmodel.simulate import simulate_components
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.specs import ClusterSpec, Workload, get_model, load_cluster

MODEL = get_model("llama2-7b")
H, HKV = MODEL.heads, MODEL.kv_heads


@pytest.fixture(scope="module")
def sim32():
    return load_cluster("sim-32")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_no_communication_is_max_of_compute(testbed, seed, sharding):
    w = Workload(seq_len=64 * 1024, activation_checkpointing=("none", "selective", "full")[seed % 3], param_sharding=sharding, global_batch=1 + seed % 3)
    plan = random_plan(8, w.seq_len, H, HKV, seed=seed, block_size=128)
    opts = CostOptions(ignore_comm=True)
    c = components(plan, testbed, MODEL, w, opts)
    busy = sum(phase_times(c).values())
    s = simulate(plan, testbed, MODEL, w, opts)
    np.testing.assert_allclose(s.finish_s, busy, rtol=1e-12)
    np.testing.assert_allclose(s.wait_s, 0, atol=1e-9)
    assert s.iteration_time_s == pytest.approx(estimate(plan, testbed, MODEL, w, opts).iteration_time_s, rel=1e-12)


def test_no_communication_single_rank_matches_estimate(testbed):
    w = Workload(seq_len=32 * 1024)
    plan = Plan(w.seq_len, H, HKV, (Group((4,), w.seq_len // 2, (w.seq_len,), (H,)),), 128, "single")
    e = estimate(plan, testbed, MODEL, w)
    s = simulate(plan, testbed, MODEL, w)
    assert s.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-12)
    assert e.ranks[0].time_s["alltoall"] == e.ranks[0].time_s["kv_exchange"] == e.ranks[0].time_s["param_comm"] == 0


def test_one_group_even_homogeneous_agrees():
    cluster = ClusterSpec.from_nodes("h100x8", [("H100-SXM", 8, 50)])
    for ac in (False, True, "full"):
        w = Workload(seq_len=128 * 1024, activation_checkpointing=ac)
        plan = ulysses_plan(range(8), w.seq_len, H, HKV)
        e = estimate(plan, cluster, MODEL, w)
        s = simulate(plan, cluster, MODEL, w)
        assert s.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-12)
        np.testing.assert_allclose(s.wait_s, 0, atol=1e-9)


def test_one_group_uneven_waits_at_the_alltoall(testbed):
    """One group, no exchange: the faster ranks wait for the slowest at every all-to-all."""
    w = Workload(seq_len=64 * 1024)
    S = w.seq_len
    plan = Plan(S, H, HKV, (Group(tuple(range(8)), S // 2, (S // 8,) * 8, (4,) * 8),), 128, "u")
    e = estimate(plan, testbed, MODEL, w)
    s = simulate(plan, testbed, MODEL, w)
    assert s.iteration_time_s >= e.iteration_time_s * (1 - 1e-12)  # the A100s never wait: equal up to rounding
    assert s.wait_s[:4].min() > 0  # the H100s wait for the A100s


@pytest.mark.parametrize("seed", range(10))
def test_simulation_never_below_estimate(testbed, seed):
    w = Workload(seq_len=64 * 1024, activation_checkpointing=("none", "selective", "full")[seed % 3], global_batch=1 + seed % 2)
    plan = random_plan(8, w.seq_len, H, HKV, seed=seed, block_size=128)
    e = estimate(plan, testbed, MODEL, w, simulate=True)
    assert e.simulated_time_s >= e.iteration_time_s * (1 - 1e-12)
    c = components(plan, testbed, MODEL, w)
    busy = sum(phase_times(c).values())
    s = simulate_components(c)
    assert np.all(s.finish_s >= busy * (1 - 1e-12))


def test_exchange_coupling_adds_waits(sim32):
    """Ring over mixed links: a group waits for its slower partners, so the replay is longer."""
    w = Workload(seq_len=128 * 1024, activation_checkpointing=True)
    plan = ring_plan(range(32), w.seq_len, H, HKV)
    e = estimate(plan, sim32, MODEL, w)
    s = simulate(plan, sim32, MODEL, w)
    assert s.iteration_time_s > 1.01 * e.iteration_time_s
    assert s.wait_s.max() > 0


@pytest.mark.parametrize("make", [lambda w: ring_plan(range(8), w.seq_len, H, HKV), lambda w: random_plan(8, w.seq_len, H, HKV, seed=3, block_size=128)])
@pytest.mark.parametrize("ac", [True, "full"])
def test_extrapolation_equals_full_replay(testbed, make, ac):
    w = Workload(seq_len=64 * 1024, activation_checkpointing=ac, global_batch=3)
    plan = make(w)
    fast = simulate(plan, testbed, MODEL, w)
    full = simulate(plan, testbed, MODEL, w, extrapolate=False)
    # full checkpointing replays each layer's forward once more before its backward
    assert full.steps_replayed == 3 * (3 if ac == "full" else 2) * MODEL.layers
    assert fast.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    np.testing.assert_allclose(fast.finish_s, full.finish_s, rtol=1e-9)


def test_symmetric_homogeneous_ring_on_one_node_agrees():
    cluster = ClusterSpec.from_nodes("a100x8", [("A100-80GB", 8, 25)])
    w = Workload(seq_len=128 * 1024)
    for plan in (ring_plan(range(8), w.seq_len, H, HKV), symmetric_plan(range(8), w.seq_len, H, HKV, 4, 2)):
        e = estimate(plan, cluster, MODEL, w, simulate=True)
        assert e.simulated_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)


def test_zero3_collectives_couple_every_rank(testbed):
    """The per-layer gathers are global: the fast H100s cannot run ahead of the A100s by more than
    a layer, and the final reduce-scatter is a barrier, so every rank ends its backward together."""
    w = Workload(seq_len=64 * 1024, activation_checkpointing=True, param_sharding="zero3")
    plan = symmetric_plan(range(8), w.seq_len, H, HKV, 2, 4)
    c = components(plan, testbed, MODEL, w)
    s = simulate_components(c)
    e = estimate(plan, testbed, MODEL, w)
    assert s.iteration_time_s >= e.iteration_time_s * (1 - 1e-12)
    np.testing.assert_allclose(s.finish_s - c.optimizer, (s.finish_s - c.optimizer).max(), rtol=1e-12)
    assert s.wait_s[:4].min() > 0.2 * e.iteration_time_s  # the H100s wait


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_balanced_plan_param_collectives_add_no_wait(sharding):
    """Identical ranks issue every collective together: the replay equals the estimate, and the
    replicated all-reduce is charged once per iteration, not per micro-step."""
    cluster = ClusterSpec.from_nodes("h100x16", [("H100-SXM", 8, 50), ("H100-SXM", 8, 50)])
    for S in (16 * 1024, 256 * 1024):  # collectives exposed / hidden
        w = Workload(seq_len=S, activation_checkpointing=True, param_sharding=sharding, global_batch=3)
        plan = symmetric_plan(range(16), S, H, HKV, 2, 8)
        e = estimate(plan, cluster, MODEL, w, simulate=True)
        assert e.simulated_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)
        if sharding == "replicated":
            w1 = Workload(seq_len=S, activation_checkpointing=True, param_sharding=sharding, global_batch=1)
            e1 = estimate(plan, cluster, MODEL, w1)
            assert e.ranks[0].time_s["param_comm"] == pytest.approx(e1.ranks[0].time_s["param_comm"], rel=1e-12)


def test_selective_recompute_in_the_replay(sim32):
    """The replay's recompute is the linear forward only (no exchange, no all-to-all replayed): on a
    multi-group plan over mixed links, turning checkpointing on costs at most the largest per-rank
    recompute phase (the replay is monotone in the durations)."""
    w0 = Workload(seq_len=128 * 1024, activation_checkpointing=False, param_sharding="replicated")
    w1 = Workload(seq_len=128 * 1024, activation_checkpointing=True, param_sharding="replicated")
    plan = symmetric_plan(range(32), w0.seq_len, H, HKV, 4, 8)
    s0, s1 = simulate(plan, sim32, MODEL, w0), simulate(plan, sim32, MODEL, w1)
    e1 = estimate(plan, sim32, MODEL, w1)
    rec = np.array([r.time_s["recompute"] for r in e1.ranks])
    np.testing.assert_allclose(rec, np.array([r.time_s["linear"] for r in e1.ranks]) / 3, rtol=1e-12)
    assert s1.iteration_time_s > s0.iteration_time_s
    assert s1.iteration_time_s - s0.iteration_time_s <= rec.max() * (1 + 1e-9)


def test_full_recompute_replays_the_forward_with_its_waits(sim32):
    """Full checkpointing replays each layer's forward (all-to-alls, KV rounds and their waits) before
    its backward: the replay is longer than with selective recompute by at least the extra
    recompute work of the critical rank, and never below the estimate."""
    ws, wf = (Workload(seq_len=128 * 1024, activation_checkpointing=p, param_sharding="replicated") for p in ("selective", "full"))
    plan = ring_plan(range(32), 128 * 1024, H, HKV)
    es, ef = estimate(plan, sim32, MODEL, ws, simulate=True), estimate(plan, sim32, MODEL, wf, simulate=True)
    extra = np.array([rf.time_s["recompute"] - rs.time_s["recompute"] for rs, rf in zip(es.ranks, ef.ranks)])
    assert extra.min() > 0
    assert ef.simulated_time_s >= es.simulated_time_s + extra.min() * (1 - 1e-9)
    assert ef.simulated_time_s >= ef.iteration_time_s * (1 - 1e-12)
