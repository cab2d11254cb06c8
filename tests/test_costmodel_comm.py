"""Communication volumes and α–β times against brute-force bookkeeping on the plan layout."""

import numpy as np
import pytest

from hexiseq.costmodel.arrays import plan_arrays
from hexiseq.costmodel.comm import alltoall_times, exchange_times, ring_allgather_s, ring_allreduce_s
from hexiseq.plan import random_plan, ring_plan
from hexiseq.specs import Workload, get_model, load_cluster

M8 = get_model("llama3-8b")  # GQA: 32 heads, 8 KV heads


@pytest.fixture(scope="module")
def testbed():
    return load_cluster("testbed-8")


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
            want = rl.num_kv_heads * need * M8.head_dim * 2 * 2
            assert xc["recv_bytes"][rl.rank, j] == pytest.approx(want)
    # every transfer is charged once to its receiver and once to its sender
    assert np.all(xc["recv"][:, 0] == 0) and np.all(xc["send"][:, 0] == 0)
    assert xc["recv"].sum() == pytest.approx(xc["send"].sum())


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
    assert xc["recv"][0, 1] == pytest.approx(2 * L * per_token / nic)
    assert xc["lat"][0, 1] == pytest.approx(10e-6)
    # rank 1 in round 1 receives only the front chunk of group 0, over NVLink 450 GB/s at its achieved fraction
    assert xc["recv_bytes"][1, 1] == L * per_token
    assert xc["recv"][1, 1] == pytest.approx(L * per_token / (450e9 * d0.link_efficiency))


@pytest.mark.parametrize("seed", range(8))
def test_alltoall_bytes_brute_force(testbed, seed):
    S = 2 * 128 * 16
    plan = random_plan(8, S, 32, 8, seed=seed, block_size=128, whole_kv_heads=bool(seed % 2))
    a = plan_arrays(plan, testbed, M8, Workload(seq_len=S))
    t = alltoall_times(a, M8)
    lay = plan.layout()
    d = M8.head_dim
    for r in lay:
        got = 0.0
        for q in lay:  # q sends r the q, k, v of its tokens for r's heads (and r's KV heads, duplicated)
            if q.group == r.group and q.rank != r.rank:
                got += q.num_tokens * (r.num_heads + 2 * r.num_kv_heads) * d * 2
        assert t["in_bytes_recv"][r.rank] == pytest.approx(got)


def test_fine_split_costs_more_alltoall(testbed):
    from hexiseq.plan import Group, Plan

    S = 16384
    aligned = Plan(S, 32, 8, (Group((0, 1), S // 2, (S // 2, S // 2), (16, 16)),), 128)
    fine = Plan(S, 32, 8, (Group((0, 1), S // 2, (S // 2, S // 2), (18, 14)),), 128)
    ta = alltoall_times(plan_arrays(aligned, testbed, M8), M8)
    tf = alltoall_times(plan_arrays(fine, testbed, M8), M8)
    # KV heads: aligned 4 + 4 = 8; fine 5 + 4 = 9 (KV head 4 goes to both ranks)
    kv_a = ta["in_bytes_recv"].sum() - S // 2 * 32 * 128 * 2
    kv_f = tf["in_bytes_recv"].sum() - S // 2 * 32 * 128 * 2
    assert kv_f / kv_a == pytest.approx(9 / 8)


def test_collective_formulas():
    assert ring_allreduce_s(1e9, 1, 1e9, 1e-5) == 0
    assert ring_allreduce_s(8e9, 8, 25e9, 1e-5) == pytest.approx(2 * 7 / 8 * 8e9 / 25e9 + 14e-5)
    assert ring_allgather_s(8e9, 8, 25e9, 1e-5) == pytest.approx(7 / 8 * 8e9 / 25e9 + 7e-5)
