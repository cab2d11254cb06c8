"""The kernel-time model (hexiseq/costmodel/kernels.py): rates from the catalog, work per token and
per pair from the model's shape, every per-unit coefficient, and the attention block model (rows and
causal-tile waste) against the block pairs the executor actually runs (hexiseq/schedule.py)."""

import numpy as np
import pytest
from _costmodel_ref import edge_plan, gpu_with_knobs, random_plans, stack_attention

from hexiseq.costmodel.kernels import (
    CostOptions,
    attention_rows,
    attention_waste,
    layer_work,
    memory_bytes,
    rates,
    work_times,
)
from hexiseq.schedule import CAUSAL, block_pairs, group_segments, needed_segments, packed, rank_rounds
from hexiseq.specs import get_gpu, get_model

H100, A100 = get_gpu("H100-SXM"), get_gpu("A100-80GB")
LLAMA = get_model("llama2-7b")
GPT = get_model("gpt-7b")  # GELU MLP


def test_rates_from_the_catalog():
    r = rates([H100, A100])
    np.testing.assert_array_equal(r.matmul, [989e12 * H100.eff_matmul, 312e12 * A100.eff_matmul])
    np.testing.assert_array_equal(
        r.attention,
        [989e12 * H100.eff_attention * stack_attention(H100), 312e12 * A100.eff_attention * stack_attention(A100)],
    )
    np.testing.assert_array_equal(r.hbm, [3350e9 * H100.eff_hbm, 2039e9 * A100.eff_hbm])
    np.testing.assert_array_equal(r.block_half_keys, [H100.attn_block_half_keys, A100.attn_block_half_keys])
    np.testing.assert_array_equal(r.overlap_slowdown, [H100.overlap_slowdown, A100.overlap_slowdown])


def test_the_per_gpu_knobs_are_profile_fields():
    """Every per-GPU number of the kernel model is a GPUType field that a measured profile may set;
    set, it reaches the rates."""
    from hexiseq.specs.gpus import profile_fields

    knobs = {
        "eff_matmul",
        "eff_attention",
        "eff_hbm",
        "attn_block_half_keys",
        "overlap_slowdown",
        "link_efficiency",
        "nic_efficiency",
    }
    assert knobs <= set(profile_fields())
    g = gpu_with_knobs(A100, eff_hbm=0.8, attn_block_half_keys=256.0, overlap_slowdown=0.1)
    r = rates([g])
    assert r.hbm[0] == 2039e9 * 0.8 and r.block_half_keys[0] == 256 and r.overlap_slowdown[0] == 0.1
    assert r.matmul[0] == rates([A100]).matmul[0]


@pytest.mark.parametrize("model", [LLAMA, get_model("llama3-8b"), GPT, get_model("tiny")], ids=lambda m: m.name)
def test_layer_work_from_the_shape(model):
    h, H, Hkv, d, f = model.hidden, model.heads, model.kv_heads, model.head_dim, model.ffn
    m = 3 if model.mlp == "swiglu" else 2
    w = layer_work(model)
    assert w.pre_flops == 2 * h * (H + 2 * Hkv) * d
    assert w.post_flops == 2 * (H * d * h + m * h * f)
    assert w.pre_flops + w.post_flops == model.linear_flops_per_token_per_layer
    assert w.pair_flops == 4 * d
    mem = memory_bytes(model)
    qk = (H + Hkv) * d
    act_f, act_b = (3 * f, 5 * f) if m == 3 else (2 * f, 3 * f)
    assert mem["pre"] == w.pre_bytes == 2 * (2 * h + 2 * qk)  # norm 1 (read x, write y) + RoPE on q, k (read, write)
    assert mem["post"] == w.post_bytes == 2 * (3 * h + 2 * h + act_f + 3 * h)  # residual, norm 2, activation, residual
    assert mem["pre_bwd"] == w.pre_bytes_bwd == 2 * (3 * h + 2 * qk)
    assert mem["post_bwd"] == w.post_bytes_bwd == 2 * (3 * h + 3 * h + act_b + 3 * h)


def test_llama2_7b_memory_bytes_by_hand():
    # h = 4096, H = H_kv = 32, d = 128, f = 11008; (H + H_kv)·d = 8192
    assert memory_bytes(LLAMA) == {
        "pre": 2 * (8192 + 16384),
        "post": 2 * (8 * 4096 + 3 * 11008),
        "pre_bwd": 2 * (12288 + 16384),
        "post_bwd": 2 * (9 * 4096 + 5 * 11008),
    }


@pytest.mark.parametrize("model", [LLAMA, GPT], ids=lambda m: m.name)
def test_work_times_per_unit(model):
    opts = CostOptions(attn_bwd_factor=2.0, attn_tile=64, loss_bytes_per_logit=10.0, optimizer_bytes_per_param=20.0)
    gpus = [H100, A100, H100]
    w = work_times([gpu_with_knobs(g, attn_block_half_keys=300.0, overlap_slowdown=0.07) for g in gpus], model, opts)
    mm = np.array([g.peak_bf16_tflops * 1e12 * g.eff_matmul for g in gpus])
    at = np.array([g.peak_bf16_tflops * 1e12 * g.eff_attention * stack_attention(g) for g in gpus])
    hbm = np.array([g.hbm_bandwidth_gbps * 1e9 * g.eff_hbm for g in gpus])
    lw, mem = layer_work(model), memory_bytes(model)
    close = lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-15, atol=0)  # noqa: E731
    close(w.pre_matmul, lw.pre_flops / mm)
    close(w.post_matmul, lw.post_flops / mm)
    close(w.pre_memory, mem["pre"] / hbm)
    close(w.post_memory, mem["post"] / hbm)
    close(w.pre_memory_bwd, mem["pre_bwd"] / hbm)
    close(w.post_memory_bwd, mem["post_bwd"] / hbm)
    close(w.pair, 4 * model.head_dim / at)
    close(w.row, 300 * 4 * model.head_dim / at)
    close(w.head, 3 * 2 * model.hidden * model.vocab / mm + model.vocab * 10.0 / hbm)
    close(w.optimizer, 20.0 / hbm)
    close(w.overlap_slowdown, 0.07)
    assert w.attn_bwd_factor == 2.0 and w.tile == 64
    # the derived sums: backward = 2x the matmuls + the backward elementwise kernels
    close(w.pre_fwd, w.pre_matmul + w.pre_memory)
    close(w.post_bwd, 2 * w.post_matmul + w.post_memory_bwd)
    close(w.token_fwd_bwd, 3 * (lw.pre_flops + lw.post_flops) / mm + sum(mem.values()) / hbm)
    assert w.head[0] == w.head[2] and w.head[0] < w.head[1]  # identical devices, identical numbers


def test_short_blocks_run_at_half_rate_at_block_half_keys():
    """The per-row cost: a full block of Lq rows against attn_block_half_keys keys takes twice its
    long-block time (kernels doc), and the row cost is independent of the keys."""
    w = work_times([gpu_with_knobs(A100, attn_block_half_keys=512.0)], LLAMA)
    Lq, eta = 1024, 4

    def block(Lk):
        return eta * (Lq * Lk * w.pair[0] + Lq * w.row[0])

    assert block(512) == pytest.approx(2 * eta * Lq * 512 * w.pair[0], rel=1e-15)
    assert block(8192) / (eta * Lq * 8192 * w.pair[0]) == pytest.approx(1 + 512 / 8192, rel=1e-15)


def test_cost_options_defaults():
    o = CostOptions()
    assert o.attn_bwd_factor == 2.5 and o.attn_tile == 128 and o.reserved_fraction == 0.10
    assert o.loss_chunk_tokens == 2048 and o.large_vocab == 65536 and o.ignore_comm is False


# ------------------------------------------------------------------------------ attention blocks


def _rows_and_waste(pairs, tile):
    """Query rows over a round's block pairs, and the causal blocks' extra pairs (tile/2 per row)."""
    rows = sum(p.q_rows[1] - p.q_rows[0] for p in pairs)
    waste = sum((p.q_rows[1] - p.q_rows[0]) * tile / 2 for p in pairs if p.kind == CAUSAL)
    return rows, waste


@pytest.mark.parametrize(
    "plan", [edge_plan()] + random_plans(8, 6, 8, 4, blocks=12, block_size=2), ids=lambda p: p.name
)
@pytest.mark.parametrize("tile", [128, 16])
def test_attention_rows_and_waste_count_the_block_pairs(plan, tile):
    """attention_rows / attention_waste per round equal the query rows and causal-tile waste of the
    block pairs the executor runs: round 0 its own chunks, round j the K/V it receives."""
    k = plan.num_groups
    for g in range(k):
        L = plan.groups[g].chunk_len
        rows, waste = attention_rows(L, k), attention_waste(L, k, tile)
        assert len(rows) == len(waste) == k
        own = block_pairs(group_segments(plan, g), group_segments(plan, g))
        assert (rows[0], waste[0]) == _rows_and_waste(own, tile)
        for j in range(1, k):
            h = (g - j) % k
            pairs = block_pairs(group_segments(plan, g), packed(needed_segments(plan, h, g)))
            assert (rows[j], waste[j]) == _rows_and_waste(pairs, tile)
    # ... and the same block pairs are the ones in every rank's executor view
    for r, me in enumerate(plan.layout()):
        if me.heads:
            L = plan.groups[me.group].chunk_len
            for rd in rank_rounds(plan, r):
                assert _rows_and_waste(rd.pairs, tile) == (
                    attention_rows(L, k)[rd.index],
                    attention_waste(L, k, tile)[rd.index],
                )


def test_attention_rows_on_arrays():
    L = np.array([3.0, 5.0])
    rows, waste = attention_rows(L, 3), attention_waste(L, 3, 128)
    np.testing.assert_array_equal(rows[0], 3 * L)
    np.testing.assert_array_equal(rows[2], 2 * L)
    np.testing.assert_array_equal(waste[0], 128 * L)
    np.testing.assert_array_equal(waste[1], 0 * L)
