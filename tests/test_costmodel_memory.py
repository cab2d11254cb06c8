"""The per-rank memory model (hexiseq/costmodel/memory.py): every category per recompute policy
against the module doc's formulas written out by hand, the K/V receive buffers from the executor's
transfer tables, the chunked loss, and sharded vs replicated model states."""

import numpy as np
import pytest
from _costmodel_ref import executor_bytes, on_devices, random_plans

from hexiseq.costmodel import CostOptions
from hexiseq.costmodel.durations import durations
from hexiseq.costmodel.memory import (
    MEMORY_KEYS,
    MemoryTerms,
    checkpoint_token_bytes,
    kv_buffer_bytes,
    memory_bytes,
    memory_terms,
    token_activation_bytes,
)
from hexiseq.costmodel.policy import RULES
from hexiseq.plan import Group, Plan, ring_plan, symmetric_plan, ulysses_plan
from hexiseq.specs import GIB, Workload, get_model, load_cluster

MODEL = get_model("llama2-7b")
H, HKV = MODEL.heads, MODEL.kv_heads


def mem(plan, cluster, model=MODEL, options=CostOptions(), **kw):
    w = Workload(seq_len=plan.seq_len, **kw)
    d = durations(plan, cluster, model, w, options)
    return memory_bytes(d.a, model, w, d.recv_bytes, options)


def by_hand(plan, cluster, model, w, options=CostOptions()) -> dict[str, np.ndarray]:
    """memory.py's doc, rank by rank."""
    lay, R = plan.layout(), plan.world_size
    h, Hq, Hkv, d, f, V, Lyr = (
        model.hidden,
        model.heads,
        model.kv_heads,
        model.head_dim,
        model.ffn,
        model.vocab,
        model.layers,
    )
    m = 3 if model.mlp == "swiglu" else 2
    P = model.param_count
    div = R if w.param_sharding == "zero3" else 1
    A_tok = 2 * (4 * h + Hq * d + m * f)
    recv, _ = executor_bytes(plan, d)
    out = {key: np.zeros(R) for key in MEMORY_KEYS}
    for r, me in enumerate(lay):
        s, eta, kv = me.num_tokens, me.heads, me.kv_heads
        n_g = plan.groups[me.group].tokens
        A_att = n_g * (2 * (2 * eta + 2 * kv) * d + 4 * eta)
        out["weights"][r] = 2 * P / div
        out["grads"][r] = 2 * P / div
        out["optimizer"][r] = 12 * P / div
        if w.param_sharding == "zero3":
            out["param_buffers"][r] = 2 * (
                3 * model.params_per_layer + 2 * max(model.embedding_params, model.lm_head_params)
            )
        grads = n_g * (2 * eta + 2 * kv) * d * 2
        send = s * (Hq + 2 * Hkv) * d * 2
        policy = str(w.recompute)
        if policy == "none":
            out["activations"][r] = Lyr * (s * A_tok + A_att)
            out["attention"][r] = grads + send
        elif policy == "selective":
            out["activations"][r] = Lyr * (s * 2 * (h + Hq * d) + A_att)
            out["attention"][r] = grads + send + s * A_tok
        else:
            out["activations"][r] = Lyr * s * 2 * h
            out["attention"][r] = grads + send + s * A_tok + A_att
        B = list(recv[r, 1:]) + [0.0]
        out["kv_buffers"][r] = 2 * max(B[j] + B[j + 1] for j in range(len(B) - 1)) if len(B) > 1 else 0.0
        # a large vocabulary's loss runs in chunks: a whole chunk is charged (linear; the runtime holds
        # min(s, chunk), so at most one chunk too much for a shard below it)
        out["logits"][r] = (options.loss_chunk_tokens if V >= options.large_vocab else s) * V * 6
        out["reserved"][r] = options.reserved_fraction * cluster.devices[me.device].gpu.memory_gib * GIB
    return out


def _cases():
    out = []
    for i, p in enumerate(random_plans(6, 8, 32, 8, blocks=32, block_size=128)):
        out.append((p, "testbed-8", "llama3-8b", ("none", "selective", "full")[i % 3], ("zero3", "replicated")[i % 2]))
    for i, p in enumerate(random_plans(3, 6, 32, 32, blocks=24, block_size=128, seed0=20)):
        out.append(
            (on_devices(p, [7, 5, 3, 1, 0, 2]), "testbed-8", "gpt-7b", ("full", "none", "selective")[i], "zero3")
        )
    for i, p in enumerate(random_plans(3, 9, 24, 8, blocks=24, block_size=128, seed0=40)):
        out.append(
            (
                on_devices(p, list(range(0, 27, 3))),
                "sim-32",
                "llama3.2-3b",
                ("selective", "full", "none")[i],
                "replicated",
            )
        )
    return out


CASES = _cases()


@pytest.mark.parametrize(
    "plan,cluster_name,model_name,policy,sharding",
    CASES,
    ids=[f"{c}-{m}-{p.name}-{pol}-{sh}" for p, c, m, pol, sh in CASES],
)
def test_every_category_by_hand(plan, cluster_name, model_name, policy, sharding):
    cluster, model = load_cluster(cluster_name), get_model(model_name)
    w = Workload(seq_len=plan.seq_len, activation_checkpointing=policy, param_sharding=sharding)
    got = mem(plan, cluster, model, activation_checkpointing=policy, param_sharding=sharding)
    want = by_hand(plan, cluster, model, w)
    assert list(got) == list(MEMORY_KEYS)
    for key in MEMORY_KEYS:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-13, atol=0, err_msg=key)


def test_memory_terms_are_the_affine_categories():
    """memory_terms: const + c_s·s + c_w·(η·L_g) + c_u·(κ·L_g), the same numbers memory_bytes uses."""
    w = Workload(seq_len=65536, activation_checkpointing="selective")
    terms = memory_terms(MODEL, w, 8)
    assert set(terms) == {"weights", "grads", "optimizer", "param_buffers", "activations", "attention", "logits"}
    assert terms["logits"] == MemoryTerms(c_s=MODEL.vocab * 6)  # a small vocabulary: all logits of the shard
    big = get_model("llama3-8b")
    assert memory_terms(big, w, 8)["logits"] == MemoryTerms(const=2048 * big.vocab * 6)
    assert memory_terms(big, w, 8, options=CostOptions(loss_chunk_tokens=512))["logits"] == MemoryTerms(
        const=512 * big.vocab * 6
    )
    assert memory_terms(big, w, 8, options=CostOptions(large_vocab=10**6))["logits"] == MemoryTerms(c_s=big.vocab * 6)
    assert terms["weights"] == MemoryTerms(const=2 * MODEL.param_count / 8)
    t = terms["activations"]
    assert t.c_s == MODEL.layers * checkpoint_token_bytes(MODEL) and t.const == 0
    assert t(10, 3, 2) == pytest.approx(t.c_s * 10 + t.c_w * 3 + t.c_u * 2, rel=1e-15)
    # per unit w = η·L_g: q and out (bf16) and the lse (fp32) of n_g = 2·L_g tokens
    assert t.c_w == MODEL.layers * 2 * (2 * 2 * MODEL.head_dim + 4)
    assert memory_terms(MODEL, w, 8, RULES["full"])["activations"] == MemoryTerms(c_s=MODEL.layers * 2 * MODEL.hidden)


def test_model_states_replicated_and_sharded(testbed):
    plan = symmetric_plan(range(8), 32768, H, HKV, 2, 4)
    P = MODEL.param_count
    rep = mem(plan, testbed, param_sharding="replicated")
    z3 = mem(plan, testbed, param_sharding="zero3")
    assert rep["weights"][0] + rep["grads"][0] + rep["optimizer"][0] == pytest.approx(16 * P, rel=1e-15)
    assert rep["param_buffers"][0] == 0
    assert z3["weights"][0] + z3["grads"][0] + z3["optimizer"][0] == pytest.approx(16 * P / 8, rel=1e-15)
    assert z3["param_buffers"][0] == pytest.approx(
        2 * (3 * MODEL.params_per_layer + 2 * MODEL.vocab * MODEL.hidden), rel=1e-15
    )
    for key in ("activations", "attention", "kv_buffers", "logits", "reserved"):
        np.testing.assert_array_equal(rep[key], z3[key])  # sharding moves only the states


def test_token_activations_llama2_7b_by_hand():
    # per token per layer, bf16: x, norm1, attn out, residual, norm2 (5 x 4096) + gate, up, act (3 x 11008)
    assert token_activation_bytes(MODEL) == 2 * (5 * 4096 + 3 * 11008)
    assert checkpoint_token_bytes(MODEL) == 2 * (4096 + 4096)
    gpt = get_model("gpt-7b")  # GELU: up and act
    assert token_activation_bytes(gpt) == 2 * (5 * 4096 + 2 * gpt.ffn)


def test_activations_scale_with_tokens_and_recompute_saves(testbed):
    S = 65536
    plan = Plan(
        S, H, HKV, (Group(tuple(range(8)), S // 2, (12288, 12288) + (4096,) * 4 + (12288, 12288), (4,) * 8),), 128
    )
    no = mem(plan, testbed, activation_checkpointing="none")
    ac = mem(plan, testbed, activation_checkpointing="selective")
    s = np.array(plan.shards, dtype=float)
    head_side = S * ((2 * 4 + 2 * 4) * 2 * MODEL.head_dim + 4 * 4)  # q,k,v,out bf16 + lse fp32, 4 heads
    np.testing.assert_allclose(
        no["activations"], MODEL.layers * (s * token_activation_bytes(MODEL) + head_side), rtol=1e-15
    )
    # selective checkpointing keeps per layer the layer input and the attention output (token side,
    # 2 x 4096 bf16 for llama2-7b) and the whole attention-layout side (q, k, v, out, lse)
    np.testing.assert_allclose(ac["activations"], MODEL.layers * (s * 2 * (4096 + 4096) + head_side), rtol=1e-15)
    np.testing.assert_allclose(
        ac["attention"] - no["attention"], s * token_activation_bytes(MODEL), rtol=1e-12
    )  # one layer rebuilt
    assert np.all(ac["activations"] + ac["attention"] < no["activations"] + no["attention"])
    # full checkpointing keeps only each layer's input (h bf16 per token), plus the one layer being
    # recomputed (token and head side) in the working set
    full = mem(plan, testbed, activation_checkpointing="full")
    np.testing.assert_allclose(full["activations"], MODEL.layers * s * 2 * 4096, rtol=1e-15)
    np.testing.assert_allclose(
        full["attention"] - no["attention"], s * token_activation_bytes(MODEL) + head_side, rtol=1e-12
    )
    total = {k: v["activations"] + v["attention"] for k, v in (("none", no), ("selective", ac), ("full", full))}
    assert np.all(total["full"] < total["selective"]) and np.all(total["selective"] < total["none"])
    assert np.all(no["kv_buffers"] == 0)  # one group: no exchange


def test_kv_buffers_double_buffered():
    recv = np.array([[0, 5, 1, 7, 2], [0, 0, 0, 0, 0], [0, 3, 3, 3, 3]], dtype=float)
    np.testing.assert_allclose(kv_buffer_bytes(recv), [2 * 9, 0, 2 * 6])
    assert kv_buffer_bytes(np.zeros((3, 1))).tolist() == [0, 0, 0]
    np.testing.assert_allclose(kv_buffer_bytes(np.array([[0.0, 4.0]])), [8.0])  # two groups: one round, B_2 = 0


def test_ring_kv_buffers_match_chunk_sizes(testbed):
    S = 8 * 2 * 1024
    plan = ring_plan(range(8), S, H, HKV)
    m = mem(plan, testbed)
    L = S // 16
    kv_bytes_per_token = 2 * H * MODEL.head_dim * 2  # K and V, all heads, bf16
    # the first group needs both chunks of every later group: 2 rounds of 2L tokens in flight, x2 for dK/dV
    assert m["kv_buffers"][0] == pytest.approx(2 * (2 * L + 2 * L) * kv_bytes_per_token, rel=1e-15)
    # the last group needs only front chunks: L tokens per round
    assert m["kv_buffers"][7] == pytest.approx(2 * (L + L) * kv_bytes_per_token, rel=1e-15)


def test_chunked_loss_for_large_vocab(testbed):
    big = get_model("llama3-8b")  # vocab 128256 >= large_vocab
    plan = ulysses_plan(range(8), 8 * 16384, big.heads, big.kv_heads)
    m = mem(plan, testbed, model=big)
    assert m["logits"][0] == pytest.approx(CostOptions().loss_chunk_tokens * big.vocab * 6, rel=1e-15)
    small = mem(ulysses_plan(range(8), 8 * 16384, H, HKV), testbed)
    assert small["logits"][0] == pytest.approx(16384 * MODEL.vocab * 6, rel=1e-15)
    # a whole chunk is charged, also to a shard below it (conservative, and linear for the planner)
    tiny = Plan(
        8 * 16384,
        big.heads,
        big.kv_heads,
        (Group(tuple(range(8)), 4 * 16384, (1024,) + (16384,) * 6 + (16384 * 2 - 1024,), (4,) * 8),),
        128,
    )
    m = mem(tiny, testbed, model=big)
    np.testing.assert_array_equal(m["logits"], CostOptions().loss_chunk_tokens * big.vocab * 6)
    m = mem(tiny, testbed, model=big, options=CostOptions(large_vocab=10**6))
    np.testing.assert_allclose(m["logits"], np.array(tiny.shards) * big.vocab * 6, rtol=1e-15)


def test_reserved_fraction(testbed):
    plan = symmetric_plan(range(8), 32768, H, HKV, 2, 4)
    np.testing.assert_allclose(mem(plan, testbed)["reserved"], 0.10 * 74.5 * GIB, rtol=1e-15)
    np.testing.assert_allclose(
        mem(plan, testbed, options=CostOptions(reserved_fraction=0.2))["reserved"], 0.2 * 74.5 * GIB, rtol=1e-15
    )


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
    assert f["activations"][0] - a["activations"][0] == pytest.approx(
        m8.layers * S * (per_tok(18, 5) - per_tok(16, 4)), rel=1e-12
    )
    assert f["activations"][1] - a["activations"][1] == pytest.approx(
        m8.layers * S * (per_tok(14, 4) - per_tok(16, 4)), rel=1e-12
    )
