"""The step of a joint plan (costmodel/step.py): the paper's setting is the replay's iteration bit
for bit; a hybrid replica's micro-steps are its own replay; the synchronisation terms and the
strategies' model states as the module docs write them."""

from dataclasses import replace

import numpy as np
import pytest

from hexiseq import Plan, PlanError, Sharding, ShardingStage, Workload, random_plan, ring_plan, symmetric_plan
from hexiseq.costmodel import CostOptions, estimate, simulate
from hexiseq.costmodel.arrays import link_matrices
from hexiseq.costmodel.memory import sharded_state_bytes
from hexiseq.costmodel.step import estimate_step, lockstep_sets, lockstep_time, replica_lines, shard_groups
from hexiseq.links import ring_allgather_s, ring_allreduce_s
from hexiseq.specs import GIB, get_model, load_cluster

MODEL = get_model("gpt-7b")
H, HKV = MODEL.heads, MODEL.kv_heads
S = 16384
TESTBED = load_cluster("testbed-8")


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("policy", ["none", "full"])
def test_one_replica_over_all_devices_is_the_replay_bit_for_bit(sharding, batch, policy):
    w = Workload(seq_len=S, global_batch=batch, activation_checkpointing=policy, param_sharding=sharding)
    plans = [ring_plan(range(8), S, H, HKV), symmetric_plan(range(8), S, H, HKV, cp=2, hp=4)]
    plans += [random_plan(8, S, H, HKV, seed=seed, block_size=128) for seed in range(3)]
    for p in plans:
        got = estimate_step(replace(p, sharding=Sharding(sharding)), TESTBED, MODEL, w)
        want = estimate(p, TESTBED, MODEL, w)
        assert got.step_time_s == want.iteration_time_s
        assert got.replicas[0].memory_gib == pytest.approx(max(r.memory_gib for r in want.ranks), rel=1e-12)
        assert got.fits == want.fits


def _pair(seqs=(5, 3), stage="zero3", scope="replica"):
    a, b = ring_plan(range(4), S, H, HKV), symmetric_plan(range(4, 8), S, H, HKV, cp=2, hp=2)
    return Plan.joint([a, b], list(seqs), Sharding(stage, scope), name="pair")


def test_hybrid_replicas_are_their_own_replays_plus_the_copies_allreduce():
    j = _pair()
    w = Workload(seq_len=S, global_batch=8, activation_checkpointing="full")
    st = estimate_step(j, TESTBED, MODEL, w)
    bw, lat = link_matrices(TESTBED)
    across = bw[:4, 4:]  # every copy pair crosses the node boundary
    link = float(across.min()), float(lat[:4, 4:].max())
    P_layer = MODEL.params_per_layer
    P_root = MODEL.param_count - MODEL.layers * P_layer
    xr, xr_root = (ring_allreduce_s(2.0 * p / 4, 2, *link) for p in (P_layer, P_root))
    assert st.sync_s["copies_allreduce"] == pytest.approx(MODEL.layers * xr + xr_root)
    assert st.sync_s["regather"] == 0.0
    for i, rep in enumerate(st.replicas):
        alone = replace(j.replica(i), replicas=())
        own = simulate(alone, TESTBED, MODEL, replace(w, global_batch=rep.sequences)).iteration_time_s
        # the copies' all-reduce runs in the last micro-step's backward: at least its exposed tail, at most all of it
        assert own + xr + xr_root <= rep.time_s + rep.optimizer_s <= own + MODEL.layers * xr + xr_root + 1e-9
        assert rep.micro_step_s * rep.sequences == pytest.approx(rep.time_s)
    slowest = max(r.time_s for r in st.replicas)
    assert st.step_time_s == pytest.approx(slowest + max(r.optimizer_s for r in st.replicas))
    assert st.tokens_per_s == pytest.approx(8 * S / st.step_time_s)
    assert "replica 1: 4x A100-80GB; 3 sequences" in st.summary()


def test_zero1_inside_one_device_replicas_pays_the_copies_allreduce():
    """ZeRO-1 inside replicas of one device each: its shard groups have one rank (no reduction inside),
    so the whole gradient reduction is the all-reduce across the copies; the replay charges it (it was
    dropped when only the in-group reduction switched the reduction passes on)."""
    one = [ring_plan([d], S, H, HKV) for d in (0, 4)]  # an H100 and an A100: the copies cross the nodes
    w = Workload(seq_len=S, global_batch=2, activation_checkpointing="full")
    z1_plan = Plan.joint(one, [1, 1], Sharding("zero1", "replica"))
    z1 = estimate_step(z1_plan, TESTBED, MODEL, w)
    bw, lat = link_matrices(TESTBED)
    link = float(bw[0, 4]), float(lat[0, 4])
    P_layer = MODEL.params_per_layer
    P_root = MODEL.param_count - MODEL.layers * P_layer
    xr, xr_root = (ring_allreduce_s(2.0 * p, 2, *link) for p in (P_layer, P_root))
    for i, rep in enumerate(z1.replicas):
        own = simulate(replace(z1_plan.replica(i), replicas=()), TESTBED, MODEL, replace(w, global_batch=1))
        # at least the exposed tail of the copies' all-reduce is on the replica's time
        assert rep.time_s + rep.optimizer_s >= own.iteration_time_s + xr + xr_root - 1e-9


def test_zero1_reduces_gradients_as_replicated_whatever_its_scope():
    """The executor's ZeRO-1 all-reduces whole gradients over every rank, as the replicated strategy
    does, and shards only the optimizer step (runtime/sharding.py, runtime/zero1.py): its replicas'
    micro-steps are replicated's under every scope, no copies' all-reduce is added, its optimizer
    step is shorter. (Charged as a reduce-scatter inside each node plus a shard all-reduce across
    them, a one-replica plan of cpu-4 under ZeRO-1 inside each node was predicted 1.2% faster than
    replicated and measured 4.3% slower: bench_dp at S = 4,096, 2026-12-07.)"""
    w = Workload(seq_len=S, global_batch=8, activation_checkpointing="full")
    rep = estimate_step(_pair(stage="replicated", scope="all"), TESTBED, MODEL, w)
    for scope in ("all", "replica", "node"):
        z1 = estimate_step(_pair(stage="zero1", scope=scope), TESTBED, MODEL, w)
        assert z1.sync_s["copies_allreduce"] == 0.0, scope
        for a, b in zip(z1.replicas, rep.replicas):
            assert a.time_s == pytest.approx(b.time_s, rel=1e-12), scope
            assert a.optimizer_s < b.optimizer_s, scope


def test_regather_of_zero1_and_zero2_and_no_sync_without_communication():
    w = Workload(seq_len=S, global_batch=8, activation_checkpointing="full")
    bw, lat = link_matrices(TESTBED)
    for stage in ("zero1", "zero2"):
        st = estimate_step(_pair(stage=stage, scope="all"), TESTBED, MODEL, w)
        ag = ring_allgather_s(2.0 * MODEL.param_count, 8, float(bw.min()), float(lat.max()))
        assert st.sync_s["regather"] == pytest.approx(ag) and st.sync_s["copies_allreduce"] == 0.0
    free = estimate_step(_pair(), TESTBED, MODEL, w, CostOptions(ignore_comm=True))
    assert free.sync_s["copies_allreduce"] == free.sync_s["regather"] == 0.0


def test_shard_groups_per_scope():
    j = _pair(scope="node")
    assert [g.tolist() for g in shard_groups(j, TESTBED)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [g.tolist() for g in shard_groups(_pair(scope="all"), TESTBED)] == [list(range(8))]
    assert [g.tolist() for g in shard_groups(_pair(stage="replicated", scope="all"), TESTBED)] == [list(range(8))]


def test_replicas_joined_by_a_zero2_or_zero3_shard_group_run_in_lockstep():
    """Under zero3 over all devices the 5 + 3 sequences of the pair run 5 micro-steps in step: the
    first three take the slower replica's micro-step, the last two the other's: the faster replica
    waits in the first three, the other through two empty ones (runtime/sharding.py). Under zero3
    inside each replica: no lockstep."""
    w = Workload(seq_len=S, global_batch=8, activation_checkpointing="full")
    j = _pair(scope="all")
    lines = replica_lines(j, TESTBED, MODEL, w)
    a, b = (ln.per_sequence_s for ln in lines)
    want = max(ln.fixed_s for ln in lines) + 3 * max(a, b) + 2 * a
    assert lockstep_time(lines, [5, 3]) == pytest.approx(want, rel=1e-12)
    st = estimate_step(j, TESTBED, MODEL, w)
    opt = max(r.optimizer_s for r in st.replicas)
    assert st.step_time_s == pytest.approx(want + st.sync_s["regather"] + opt, rel=1e-9)
    own = [r.time_s for r in st.replicas]
    assert st.step_time_s > max(own) + opt  # the independent replicas' step would be shorter
    for r in st.replicas:
        assert r.time_s + r.waiting_s == pytest.approx(want, rel=1e-9)
    assert min(r.waiting_s for r in st.replicas) > 0.0  # each waits: for the slower, then through empty ones
    assert "waiting in lockstep" in st.summary()
    alone = estimate_step(_pair(scope="replica"), TESTBED, MODEL, w)
    assert all(r.waiting_s == 0.0 for r in alone.replicas)


@pytest.mark.parametrize(
    "stage, scope, want",
    [
        ("zero3", "node", [[0, 1, 2]]),  # r1 spans both nodes: it joins r0 and r2
        ("zero2", "node", [[0, 1, 2]]),
        ("zero3", "replica", [[0], [1], [2]]),
        ("zero1", "all", [[0], [1], [2]]),  # nothing collective before the step's end
        ("replicated", "all", [[0], [1], [2]]),
    ],
)
def test_lockstep_sets_follow_the_shard_groups(stage, scope, want):
    reps = [ring_plan(devs, S, H, HKV) for devs in ((0, 1), (2, 3, 4, 5), (6, 7))]
    j = Plan.joint(reps, [2, 1, 1], Sharding(stage, scope))
    assert lockstep_sets(j, shard_groups(j, TESTBED)) == want


def test_strategy_memory_orders_and_formulas():
    P = MODEL.param_count
    rep, z1, z2, z3 = (
        sharded_state_bytes(MODEL, ShardingStage(s), 8) for s in ("replicated", "zero1", "zero2", "zero3")
    )
    assert rep["weights"] == z1["weights"] == z2["weights"] == 2 * P and z3["weights"] == 2 * P / 8
    assert rep["optimizer"] == 12 * P and z1["optimizer"] == z2["optimizer"] == z3["optimizer"] == 12 * P / 8
    assert z1["grads"] == 2 * P and z2["grads"] == z3["grads"] == 2 * P / 8
    total = [sum(x.values()) for x in (rep, z1, z2, z3)]
    assert total == sorted(total, reverse=True)
    w = Workload(seq_len=S, global_batch=8, activation_checkpointing="full")
    mems = [
        estimate_step(_pair(stage=s, scope="all"), TESTBED, MODEL, w).replicas[0].memory_gib
        for s in ("zero1", "zero2", "zero3")
    ]
    assert mems == sorted(mems, reverse=True)
    per = np.array(mems) * GIB
    assert per[0] - per[1] == pytest.approx(
        2 * P * (1 - 1 / 8) - 2 * (MODEL.params_per_layer + max(MODEL.embedding_params, MODEL.lm_head_params))
    )


def test_batch_shares_must_sum_to_the_global_batch():

    with pytest.raises(PlanError, match="global batch is 4"):
        estimate_step(_pair(), TESTBED, MODEL, Workload(seq_len=S, global_batch=4))


def test_the_replay_refuses_plans_of_several_replicas():
    w = Workload(seq_len=S, global_batch=8)
    for judge in (estimate, simulate):
        with pytest.raises(PlanError, match="2 data-parallel replicas: time its step with"):
            judge(_pair(), TESTBED, MODEL, w)


def test_replica_lines_shared_across_strategies_are_each_strategys_own_replay():
    """The cache's shared layer passes, durations and memory give every strategy the lines (and
    step times) a fresh replay gives, bit for bit, and a full replay's iteration time."""
    from hexiseq.costmodel.durations import durations
    from hexiseq.costmodel.simulate import layer_chains, simulate_durations
    from hexiseq.costmodel.step import replica_lines, step_time
    from hexiseq.planner import STRATEGIES

    w = Workload(seq_len=S, global_batch=8, activation_checkpointing="selective")
    cache: dict = {}
    for sharding in STRATEGIES:
        j = replace(_pair(), sharding=sharding)
        shared = replica_lines(j, TESTBED, MODEL, w, cache=cache)
        assert shared == replica_lines(j, TESTBED, MODEL, w)
        assert step_time(j, TESTBED, MODEL, shared, cache=cache) == step_time(j, TESTBED, MODEL, shared)
    p = symmetric_plan(range(8), S, H, HKV, cp=2, hp=4)
    d1 = durations(p, TESTBED, MODEL, replace(w, global_batch=1))
    d3 = durations(p, TESTBED, MODEL, replace(w, global_batch=3))
    full = simulate_durations(d3)
    quick = simulate_durations(d3, chains=layer_chains(d1), phases=False)
    assert quick.iteration_time_s == full.iteration_time_s and quick.passes == full.passes
    assert not quick.phases
    with pytest.raises(ValueError):
        simulate_durations(d3, trace=True, chains=layer_chains(d1))
