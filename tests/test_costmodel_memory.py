"""The per-rank memory model."""

import numpy as np
import pytest

from hexiseq.costmodel import CostOptions, estimate
from hexiseq.costmodel.estimate import components
from hexiseq.costmodel.memory import MEMORY_KEYS, kv_buffer_bytes, memory_bytes, token_activation_bytes
from hexiseq.plan import Group, Plan, random_plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.specs import GIB, Workload, get_model, load_cluster

MODEL = get_model("llama2-7b")
H, HKV = MODEL.heads, MODEL.kv_heads


@pytest.fixture(scope="module")
def testbed():
    return load_cluster("testbed-8")


def mem(plan, cluster, model=MODEL, **kw):
    w = Workload(seq_len=plan.seq_len, **kw)
    c = components(plan, cluster, model, w)
    return memory_bytes(c.a, model, w, c.recv_bytes)


def test_model_states_replicated_and_sharded(testbed):
    plan = symmetric_plan(range(8), 32768, H, HKV, 2, 4)
    P = MODEL.param_count
    rep = mem(plan, testbed, param_sharding="replicated")
    z3 = mem(plan, testbed, param_sharding="zero3")
    assert rep["weights"][0] + rep["grads"][0] + rep["optimizer"][0] == pytest.approx(16 * P)
    assert rep["param_buffers"][0] == 0
    assert z3["weights"][0] + z3["grads"][0] + z3["optimizer"][0] == pytest.approx(16 * P / 8)
    assert z3["param_buffers"][0] == pytest.approx(2 * (3 * MODEL.params_per_layer + 2 * MODEL.vocab * MODEL.hidden))


def test_token_activations_llama2_7b_by_hand():
    # per token per layer, bf16: x, norm1, attn out, residual, norm2 (5 x 4096) + gate, up, act (3 x 11008)
    assert token_activation_bytes(MODEL) == 2 * (5 * 4096 + 3 * 11008)


def test_activations_scale_with_tokens_and_recompute_saves(testbed):
    S = 65536
    plan = Plan(S, H, HKV, (Group(tuple(range(8)), S // 2, (12288, 12288) + (4096,) * 4 + (12288, 12288), (4,) * 8),), 128)
    no = mem(plan, testbed, activation_checkpointing=False)
    ac = mem(plan, testbed, activation_checkpointing=True)
    s = np.array(plan.shards, dtype=float)
    head_side = S * ((2 * 4 + 2 * 4) * 2 * MODEL.head_dim + 4 * 4)  # q,k,v,out bf16 + lse fp32, 4 heads
    np.testing.assert_allclose(no["activations"], MODEL.layers * (s * token_activation_bytes(MODEL) + head_side))
    # selective checkpointing keeps per layer the layer input and the attention output (token side,
    # 2 x 4096 bf16 for llama2-7b) and the whole attention-layout side (q, k, v, out, lse)
    np.testing.assert_allclose(ac["activations"], MODEL.layers * (s * 2 * (4096 + 4096) + head_side))
    np.testing.assert_allclose(ac["attention"] - no["attention"], s * token_activation_bytes(MODEL))  # one layer rebuilt
    assert np.all(ac["activations"] + ac["attention"] < no["activations"] + no["attention"])
    # full checkpointing keeps only each layer's input (h bf16 per token), plus the one layer being
    # recomputed (token and head side) in the working set
    full = mem(plan, testbed, activation_checkpointing="full")
    np.testing.assert_allclose(full["activations"], MODEL.layers * s * 2 * 4096)
    np.testing.assert_allclose(full["attention"] - no["attention"], s * token_activation_bytes(MODEL) + head_side)
    total = {k: v["activations"] + v["attention"] for k, v in (("none", no), ("selective", ac), ("full", full))}
    assert np.all(total["full"] < total["selective"]) and np.all(total["selective"] < total["none"])
    assert np.all(no["kv_buffers"] == 0)  # one group: no exchange


def test_kv_buffers_double_buffered():
    recv = np.array([[0, 5, 1, 7, 2], [0, 0, 0, 0, 0], [0, 3, 3, 3, 3]], dtype=float)
    np.testing.assert_allclose(kv_buffer_bytes(recv), [2 * 9, 0, 2 * 6])
    assert kv_buffer_bytes(np.zeros((3, 1))).tolist() == [0, 0, 0]


def test_ring_kv_buffers_match_chunk_sizes(testbed):
    S = 8 * 2 * 1024
    plan = ring_plan(range(8), S, H, HKV)
    m = mem(plan, testbed)
    L = S // 16
    kv_bytes_per_token = 2 * H * MODEL.head_dim * 2  # K and V, all heads, bf16
    # the first group needs both chunks of every later group: 2 rounds of 2L tokens in flight, x2 for dK/dV
    assert m["kv_buffers"][0] == pytest.approx(2 * (2 * L + 2 * L) * kv_bytes_per_token)
    # the last group needs only front chunks: L tokens per round
    assert m["kv_buffers"][7] == pytest.approx(2 * (L + L) * kv_bytes_per_token)


def test_chunked_loss_for_large_vocab(testbed):
    big = get_model("llama3-8b")  # vocab 128256 >= large_vocab
    plan = ulysses_plan(range(8), 8 * 16384, big.heads, big.kv_heads)
    m = mem(plan, testbed, model=big)
    assert m["logits"][0] == pytest.approx(CostOptions().loss_chunk_tokens * big.vocab * 6)
    small = mem(ulysses_plan(range(8), 8 * 16384, H, HKV), testbed)
    assert small["logits"][0] == pytest.approx(16384 * MODEL.vocab * 6)


def test_reserved_fraction(testbed):
    m = mem(symmetric_plan(range(8), 32768, H, HKV, 2, 4), testbed)
    np.testing.assert_allclose(m["reserved"], 0.10 * 74.5 * GIB)


def test_estimate_reports_every_oom_rank(testbed):
    S = 512 * 1024
    w = Workload(seq_len=S, activation_checkpointing=False)
    e = estimate(symmetric_plan(range(8), S, H, HKV, 2, 4), testbed, MODEL, w)
    assert not e.fits
    assert {o.rank for o in e.oom} == {r.rank for r in e.ranks if not r.fits} == set(range(8))
    for o in e.oom:
        assert o.shortfall_gib == pytest.approx(o.memory_gib - o.capacity_gib)
        assert "short by" in o.message and o.gpu in o.message
    e2 = estimate(symmetric_plan(range(8), 65536, H, HKV, 2, 4), testbed, MODEL, Workload(seq_len=65536, activation_checkpointing=True))
    assert e2.fits and not e2.oom
    assert set(e2.ranks[0].memory_breakdown_gib) == set(MEMORY_KEYS)


def test_fine_head_split_duplicates_kv(testbed):
    """GQA with a head range that splits a KV head: the rank touches (and holds) both KV heads."""
    m8 = get_model("llama3-8b")  # 32 heads, 8 KV heads (4 query heads each)
    S = 16384
    aligned = Plan(S, 32, 8, (Group((0, 1), S // 2, (S // 2, S // 2), (16, 16)),), 128)
    fine = Plan(S, 32, 8, (Group((0, 1), S // 2, (S // 2, S // 2), (18, 14)),), 128)
    a = mem(aligned, testbed, model=m8)
    f = mem(fine, testbed, model=m8)
    # rank 0: 16 -> 18 heads and 4 -> 5 KV heads; rank 1: 14 heads but still 4 KV heads (8..11, 12..15 -> 3.5 -> 4)
    per_tok = lambda eta, kv: (2 * eta + 2 * kv) * 2 * 128 + 4 * eta  # noqa: E731
    assert f["activations"][0] - a["activations"][0] == pytest.approx(m8.layers * S * (per_tok(18, 5) - per_tok(16, 4)))
    assert f["activations"][1] - a["activations"][1] == pytest.approx(m8.layers * S * (per_tok(14, 4) - per_tok(16, 4)))


def test_random_plans_memory_positive_and_consistent(testbed):
    for seed in range(5):
        plan = random_plan(8, 65536, H, HKV, seed=seed, block_size=128)
        e = estimate(plan, testbed, MODEL, Workload(seq_len=65536, activation_checkpointing=True))
        for r in e.ranks:
            assert all(v >= 0 for v in r.memory_breakdown_gib.values())
            assert r.fits == (r.memory_gib <= r.capacity_gib)
