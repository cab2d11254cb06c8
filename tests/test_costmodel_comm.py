"""Communication volumes and α–β times (hexiseq/costmodel/comm.py) against brute-force bookkeeping on
the plan layout, and the equality of issue #11: the bytes the cost model charges per sender, per
receiver and per round equal the executor's transfer tables (`schedule.rank_rounds`)."""

import numpy as np
import pytest
from _costmodel_ref import edge_plan, executor_bytes, neutral, on_devices, random_plans

from hexiseq.costmodel.arrays import link_matrices, plan_arrays
from hexiseq.costmodel.comm import (
    a2a_in_bytes,
    a2a_out_bytes,
    alltoall_times,
    collective_link,
    exchange_times,
    intra_group_pairs,
    kv_bytes,
    param_collectives,
)
from hexiseq.costmodel.durations import coefficients, evaluate
from hexiseq.links import ring_allgather_s, ring_allreduce_s
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan
from hexiseq.schedule import rank_rounds
from hexiseq.specs import ClusterSpec, ModelSpec, Workload, get_model, load_cluster

M8 = get_model("llama3-8b")  # GQA: 32 heads, 8 KV heads


@pytest.fixture(scope="module")
def sim32():
    return load_cluster("sim-32")


# ------------------------------------------------------------------------------ the KV exchange


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("whole", [True, False])
def test_exchange_bytes_brute_force(testbed, seed, whole):
    """Every receiver gets each KV head it touches exactly once, for the tokens its group needs;
    bytes sent = bytes received in every round."""
    S = 2 * 128 * 24
    plan = random_plan(8, S, 32, 8, seed=seed, block_size=128, whole_kv_heads=whole)
    a = plan_arrays(plan, testbed, M8, Workload(seq_len=S))
    xc = exchange_times(a, M8)
    lay = plan.layout()
    pos = [np.array(plan.group_positions(g)) for g in range(plan.num_groups)]
    k = plan.num_groups
    for rl in lay:
        g = rl.group
        for j in range(1, k):
            h = (g - j) % k
            need = int((pos[h][None, :] <= pos[g][:, None]).any(axis=0).sum())
            want = rl.kv_heads * need * M8.head_dim * 2 * 2
            assert xc["recv_bytes"][rl.rank, j] == pytest.approx(want, rel=1e-15)
    # every transfer is charged once to its receiver and once to its sender
    assert np.all(xc["recv"][:, 0] == 0) and np.all(xc["send"][:, 0] == 0)
    assert xc["recv"].sum() == pytest.approx(xc["send"].sum(), rel=1e-12)
    assert xc["recv_bytes"].sum() == xc["send_bytes"].sum()


def _exchange_cases():
    """(plan, cluster name, model name): random uneven plans with fine GQA splits and ranks without
    heads or tokens, on all or a part of the cluster, for MHA and GQA models."""
    out = [(p, "testbed-8", "llama3-8b") for p in random_plans(8, 8, 32, 8, blocks=24, block_size=128)]
    out += [
        (on_devices(p, list(range(31, 31 - 2 * p.world_size, -2))), "sim-32", "llama3.2-3b")  # gq = 3
        for p in random_plans(6, 12, 24, 8, blocks=30, block_size=64, seed0=50)
    ]
    out += [
        (on_devices(p, [7, 0, 5, 2, 4, 3]), "testbed-8", "llama2-7b")  # MHA
        for p in random_plans(4, 6, 32, 32, blocks=12, block_size=128, seed0=80)
    ]
    return out


EXCHANGE_CASES = _exchange_cases()


@pytest.mark.parametrize(
    "plan,cluster_name,model_name",
    EXCHANGE_CASES,
    ids=[f"{c}-{m}-{p.name}-{p.group_sizes}" for p, c, m in EXCHANGE_CASES],
)
def test_model_bytes_per_sender_and_round_equal_the_executor_tables(plan, cluster_name, model_name):
    """Issue #11: for every rank and round, the bytes the cost model charges (comm.exchange_times,
    and the durations' linear forms at the plan) as receiver and as sender equal the sum over the
    executor's transfers (`rank_rounds`) of KV heads × tokens × 2 (K, V) × head_dim × 2 bytes; the
    link seconds are those bytes over each transfer's own link."""
    cluster, model = load_cluster(cluster_name), get_model(model_name)
    w = Workload(seq_len=plan.seq_len)
    a = plan_arrays(plan, cluster, model, w)
    recv, send = executor_bytes(plan, model.head_dim)
    xc = exchange_times(a, model)
    np.testing.assert_array_equal(xc["recv_bytes"], recv)
    np.testing.assert_array_equal(xc["send_bytes"], send)
    # link seconds and latency per transfer, from the executor's transfers and the devices they join
    bw, lat = link_matrices(cluster)
    dev = plan.rank_devices
    R, k = plan.world_size, plan.num_groups
    r_s, s_s, alpha = np.zeros((R, k)), np.zeros((R, k)), np.zeros((R, k))
    for r in range(R):
        for rd in rank_rounds(plan, r):
            for t in rd.recv:
                r_s[r, rd.index] += t.num_kv_heads * t.tokens * 2 * model.head_dim * 2 / bw[dev[t.src], dev[r]]
                alpha[r, rd.index] = max(alpha[r, rd.index], lat[dev[t.src], dev[r]])
            for t in rd.send:
                s_s[r, rd.index] += t.num_kv_heads * t.tokens * 2 * model.head_dim * 2 / bw[dev[r], dev[t.dst]]
                alpha[r, rd.index] = max(alpha[r, rd.index], lat[dev[r], dev[t.dst]])
    np.testing.assert_allclose(xc["recv"], r_s, rtol=1e-13, atol=0)
    np.testing.assert_allclose(xc["send"], s_s, rtol=1e-13, atol=0)
    np.testing.assert_array_equal(xc["lat"], alpha)
    # the durations' linear forms (what the replay and the planner's model use) at the plan's point
    d = evaluate(coefficients(a, model, w), a.s, a.L)
    np.testing.assert_allclose(d.recv_bytes, recv, rtol=1e-15, atol=0)
    np.testing.assert_allclose(d.xc_f[:, 1:, 0] - d.c.x_lat[:, 1:], r_s[:, 1:], rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(d.xc_f[:, 1:, 1] - d.c.x_lat[:, 1:], s_s[:, 1:], rtol=1e-13, atol=1e-300)
    np.testing.assert_array_equal(d.c.x_lat, alpha)
    np.testing.assert_allclose(d.link, r_s + s_s, rtol=1e-13, atol=0)


def test_the_edge_plan_bytes_equal_the_executor_tables():
    """The hand-made plan with every edge case (ranks without heads / tokens, fine GQA splits)."""
    plan = edge_plan()
    model = ModelSpec("edge", layers=2, hidden=48, heads=6, kv_heads=2, ffn=64, vocab=100)  # head_dim 8
    cluster = ClusterSpec.from_nodes("c6", [("A100-80GB", 3, 25), ("H100-SXM", 3, 50)])
    a = plan_arrays(plan, cluster, model, Workload(seq_len=plan.seq_len, block_size=2))
    recv, send = executor_bytes(plan, model.head_dim)
    xc = exchange_times(a, model)
    np.testing.assert_array_equal(xc["recv_bytes"], recv)
    np.testing.assert_array_equal(xc["send_bytes"], send)
    assert recv[2].sum() == send[2].sum() == 0  # rank 2 has no heads: no exchange
    assert recv[0].sum() > 0  # rank 0 has heads but no tokens: it still attends every group's keys


def test_ring_exchange_times(testbed):
    S = 8 * 2 * 1024
    m = get_model("llama2-7b")
    plan = ring_plan(range(8), S, m.heads, m.kv_heads)
    a = plan_arrays(plan, testbed, m, Workload(seq_len=S))
    xc = exchange_times(a, m)
    L = S // 16
    per_token = m.kv_heads * m.head_dim * 2 * 2
    # rank 0 (ring position 0) in round 1 receives both chunks of group 7 (an A100 on the other
    # node): over the NIC at its achieved fraction (the catalog's nic_efficiency of the two ends)
    d0, d7 = testbed.devices[0].gpu, testbed.devices[7].gpu
    nic = 25e9 * min(d0.nic_efficiency, d7.nic_efficiency)
    assert xc["recv_bytes"][0, 1] == 2 * L * per_token
    assert xc["recv"][0, 1] == pytest.approx(2 * L * per_token / nic, rel=1e-12)
    assert xc["lat"][0, 1] == pytest.approx(10e-6, rel=1e-12)
    # rank 1 in round 1 receives only the front chunk of group 0, over NVLink 450 GB/s at its achieved fraction
    assert xc["recv_bytes"][1, 1] == L * per_token
    assert xc["recv"][1, 1] == pytest.approx(L * per_token / (450e9 * d0.link_efficiency), rel=1e-12)
    # and in round 1 it sends to group 2, which comes after it and so needs only its front chunk
    assert xc["send_bytes"][1, 1] == L * per_token


def test_one_group_exchanges_nothing(testbed):
    m = get_model("llama2-7b")
    plan = symmetric_plan(range(8), 16384, m.heads, m.kv_heads, cp=1, hp=8)
    xc = exchange_times(plan_arrays(plan, testbed, m), m)
    assert xc["recv"].shape == (8, 1) and not any(v.any() for v in xc.values())


# ------------------------------------------------------------------------------ all-to-all


@pytest.mark.parametrize("seed", range(8))
def test_alltoall_bytes_and_times_brute_force(testbed, seed):
    S = 2 * 128 * 16
    plan = on_devices(
        random_plan(8, S, 32, 8, seed=seed, block_size=128, whole_kv_heads=bool(seed % 2)), [3, 6, 0, 1, 7, 2, 5, 4]
    )
    a = plan_arrays(plan, testbed, M8, Workload(seq_len=S))
    t = alltoall_times(a, M8)
    lay = plan.layout()
    d = M8.head_dim
    bw, lat = link_matrices(testbed)
    for r in lay:
        want = dict.fromkeys(("in_send", "in_recv", "out_send", "out_recv", "lat", "in_bytes_recv"), 0.0)
        for q in lay:  # q sends r the q, k, v of its tokens for r's heads (and r's KV heads, duplicated)
            if q.group != r.group or q.rank == r.rank:
                continue
            link = bw[r.device, q.device]
            want["in_bytes_recv"] += q.num_tokens * (r.heads + 2 * r.kv_heads) * d * 2
            want["in_recv"] += q.num_tokens * (r.heads + 2 * r.kv_heads) * d * 2 / link
            want["in_send"] += r.num_tokens * (q.heads + 2 * q.kv_heads) * d * 2 / link
            want["out_send"] += q.num_tokens * r.heads * d * 2 / link  # r's heads' output for q's tokens
            want["out_recv"] += r.num_tokens * q.heads * d * 2 / link
            want["lat"] = max(want["lat"], lat[r.device, q.device])  # every member takes part, even without bytes
        for key, v in want.items():
            assert t[key][r.rank] == pytest.approx(v, rel=1e-12, abs=0), key


def test_fine_split_costs_more_alltoall(testbed):
    S = 16384
    aligned = Plan(S, 32, 8, (Group((0, 1), S // 2, (S // 2, S // 2), (16, 16)),), 128)
    fine = Plan(S, 32, 8, (Group((0, 1), S // 2, (S // 2, S // 2), (18, 14)),), 128)
    ta = alltoall_times(plan_arrays(aligned, testbed, M8), M8)
    tf = alltoall_times(plan_arrays(fine, testbed, M8), M8)
    # KV heads: aligned 4 + 4 = 8; fine 5 + 4 = 9 (KV head 4 goes to both ranks)
    kv_a = ta["in_bytes_recv"].sum() - S // 2 * 32 * 128 * 2
    kv_f = tf["in_bytes_recv"].sum() - S // 2 * 32 * 128 * 2
    assert kv_f / kv_a == pytest.approx(9 / 8, rel=1e-12)


def test_byte_functions_by_hand():
    assert a2a_in_bytes(10, 3, 1, 128) == 10 * (3 + 2) * 128 * 2
    assert a2a_out_bytes(10, 3, 128) == 10 * 3 * 128 * 2
    assert kv_bytes(7, 64) == 7 * 2 * 64 * 2
    x = np.array([1.0, 2.0])  # they broadcast over arrays (and optimization-model expressions)
    np.testing.assert_array_equal(a2a_in_bytes(x, x, x, 8), x * 3 * x * 16)


def test_intra_group_pairs():
    plan = Plan(16, 2, 1, (Group((0, 1, 2), 4, (3, 3, 2), (1, 1, 0)), Group((3,), 4, (8,), (2,))), block_size=1)
    cl = ClusterSpec.from_nodes("c4", [("A100-80GB", 4, 25)])
    m = ModelSpec("m", layers=1, hidden=16, heads=2, kv_heads=1, ffn=16, vocab=10)
    src, dst = intra_group_pairs(plan_arrays(plan, cl, m))
    assert list(zip(src.tolist(), dst.tolist())) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


# ------------------------------------------------------------------------------ collectives


def test_collective_formulas():
    assert ring_allreduce_s(1e9, 1, 1e9, 1e-5) == 0
    assert ring_allreduce_s(8e9, 8, 25e9, 1e-5) == pytest.approx(2 * 7 / 8 * 8e9 / 25e9 + 14e-5, rel=1e-12)
    assert ring_allgather_s(8e9, 8, 25e9, 1e-5) == pytest.approx(7 / 8 * 8e9 / 25e9 + 7e-5, rel=1e-12)
    assert ring_allgather_s(8e9, 1, 25e9, 1e-5) == 0
    assert collective_link(np.full((1, 1), np.inf), np.zeros((1, 1))) == (float("inf"), 0.0)


@pytest.mark.parametrize("sharding", ["zero3", "replicated"])
def test_param_collectives_over_the_slowest_link(testbed, sharding):
    """One global ring over the slowest link among the plan's devices (testbed: the 25 GB/s NIC at
    the catalog's nic_efficiency, 10 us; on one node: NVLink at its link_efficiency)."""
    m = get_model("llama2-7b")
    w = Workload(seq_len=16384, param_sharding=sharding)
    layer, root = 2 * m.params_per_layer, 2 * (m.param_count - m.layers * m.params_per_layer)
    gpus = [d.gpu for d in testbed.devices]
    nic = 25e9 * min(g.nic_efficiency for g in gpus)
    assert nic < min(g.link_bandwidth_gbps * 1e9 * g.link_efficiency for g in gpus)  # the NIC is the slowest link
    a = plan_arrays(symmetric_plan(range(8), 16384, m.heads, m.kv_heads, 2, 4), testbed, m, w)
    p = param_collectives(a.bw, a.lat, m, w)
    assert p.sharding == sharding
    if sharding == "zero3":
        assert p.ag_layer == p.rs_layer == pytest.approx(7 / 8 * layer / nic + 7 * 10e-6, rel=1e-12)
        assert p.ag_root == p.rs_root == pytest.approx(7 / 8 * root / nic + 7 * 10e-6, rel=1e-12)
        assert p.ar_layer == p.ar_root == 0
    else:
        assert p.ar_layer == pytest.approx(2 * 7 / 8 * layer / nic + 14 * 10e-6, rel=1e-12)
        assert p.ar_root == pytest.approx(2 * 7 / 8 * root / nic + 14 * 10e-6, rel=1e-12)
        assert p.ag_layer == p.rs_layer == 0
    # on one node (the H100s) the ring runs over NVLink
    nvlink = 450e9 * testbed.devices[0].gpu.link_efficiency
    a4 = plan_arrays(symmetric_plan(range(4), 16384, m.heads, m.kv_heads, 2, 2), testbed, m, w)
    p4 = param_collectives(a4.bw, a4.lat, m, w)
    if sharding == "zero3":
        assert p4.ag_layer == pytest.approx(3 / 4 * layer / nvlink + 3 * 3e-6, rel=1e-12)
    else:
        assert p4.ar_layer == pytest.approx(2 * 3 / 4 * layer / nvlink + 6 * 3e-6, rel=1e-12)


def test_link_matrices_from_the_cluster(testbed):
    """Same node: the GPU link; across nodes: the NIC; each at the catalog's achieved fraction
    (link_efficiency inside a node, nic_efficiency across, the lower of the two ends); at neutral
    fractions (1, set here) the line rates."""
    bw, lat = link_matrices(testbed)
    h100, a100 = testbed.devices[0].gpu, testbed.devices[4].gpu
    assert bw[0, 1] == pytest.approx(450e9 * h100.link_efficiency, rel=1e-15)
    assert bw[4, 5] == pytest.approx(300e9 * a100.link_efficiency, rel=1e-15)
    assert bw[0, 4] == bw[4, 0] == pytest.approx(25e9 * min(h100.nic_efficiency, a100.nic_efficiency), rel=1e-15)
    assert np.isinf(bw[2, 2])
    assert lat[0, 1] == pytest.approx(3e-6) and lat[0, 7] == pytest.approx(10e-6) and lat[3, 3] == 0
    assert not bw.flags.writeable
    line, _ = link_matrices(neutral(testbed))
    assert line[0, 1] == 450e9 and line[4, 5] == 300e9 and line[0, 4] == 25e9 and np.isinf(line[2, 2])
    # the two ends' NIC fractions differ: the transfer reaches the lower one
    uneven = testbed.with_profile({"H100-SXM": {"nic_efficiency": 0.5}, "A100-80GB": {"nic_efficiency": 0.8}})
    bw2, _ = link_matrices(uneven)
    assert bw2[0, 4] == bw2[4, 0] == pytest.approx(25e9 * 0.5, rel=1e-15)
    assert bw2[0, 1] == bw[0, 1] and bw2[4, 5] == bw[4, 5]  # inside a node the NIC fraction plays no part
