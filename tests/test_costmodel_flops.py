"""Exact FLOP accounting: pair counts against a brute-force causal mask, totals against formulas."""

import numpy as np
import pytest

from hexiseq.costmodel.flops import (
    causal_pairs_between,
    group_pair_matrix,
    needed_kv_tokens,
    pairs_per_rank,
    rank_attention_pairs,
    rank_forward_flops,
    standard_training_flops,
)
from hexiseq.plan import random_plan, ring_plan, symmetric_plan
from hexiseq.specs import get_model, model_catalog

LLAMAS = ["llama3.2-3b", "llama2-7b", "llama3-8b", "llama2-13b", "codellama-34b", "llama2-70b", "llama3-70b"]


def brute_pairs(q: np.ndarray, k: np.ndarray) -> int:
    return int((k[None, :] <= q[:, None]).sum())


def test_interval_pairs_match_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(300):
        qa, ka = rng.integers(0, 60, size=2)
        lq, lk = rng.integers(0, 25, size=2)
        q, k = np.arange(qa, qa + lq), np.arange(ka, ka + lk)
        assert causal_pairs_between(qa, lq, ka, lk) == brute_pairs(q, k)


def test_interval_pairs_three_block_kinds():
    assert causal_pairs_between(100, 10, 0, 50) == 500  # full
    assert causal_pairs_between(0, 10, 100, 50) == 0  # none
    assert causal_pairs_between(7, 16, 7, 16) == 16 * 17 // 2  # causal diagonal


@pytest.mark.parametrize("seed", range(40))
def test_pairs_per_rank_match_brute_force_on_random_uneven_plans(seed):
    rng = np.random.default_rng(seed)
    world = int(rng.integers(1, 7))
    block = int(rng.choice([1, 2, 4]))
    S = 2 * block * int(rng.integers(world, 40))
    plan = random_plan(world, S, 8, 4, seed=seed, block_size=block)
    k = plan.num_groups
    pos = [np.array(plan.group_positions(g)) for g in range(k)]
    got = pairs_per_rank(plan)
    assert got.shape == (plan.world_size, k)
    for r, g in enumerate(plan.group_of_rank):
        for j in range(k):
            h = (g - j) % k
            assert got[r, j] == brute_pairs(pos[g], pos[h]), (seed, r, j)
    # each group's rounds cover the whole causal triangle exactly once
    M = group_pair_matrix(plan)
    assert M.sum() == S * (S + 1) // 2
    L = np.array([grp.chunk_len for grp in plan.groups])
    assert np.array_equal(M.sum(axis=1), L * (S + 1))


@pytest.mark.parametrize("seed", range(15))
def test_needed_kv_tokens_match_brute_force(seed):
    plan = random_plan(5, 2 * 3 * 20, 8, 8, seed=seed, block_size=3)
    pos = [np.array(plan.group_positions(g)) for g in range(plan.num_groups)]
    need = needed_kv_tokens(plan)
    for g in range(plan.num_groups):
        for h in range(plan.num_groups):
            want = 0 if g == h else int((pos[h][None, :] <= pos[g][:, None]).any(axis=0).sum())
            assert need[g, h] == want
            if g != h:  # zigzag: only the front chunk of an earlier group, both chunks of a later one
                assert want == plan.groups[h].chunk_len * (1 if h < g else 2)


def test_rank_pairs_sum_to_heads_times_triangle():
    plan = random_plan(6, 2 * 64 * 10, 32, 8, seed=3, block_size=64)
    S = plan.seq_len
    assert rank_attention_pairs(plan).sum() == 32 * S * (S + 1) // 2


@pytest.mark.parametrize("name", LLAMAS + ["gpt-7b", "tiny"])
def test_rank_flops_sum_to_model_training_flops(name):
    model = get_model(name)
    S = 2 * 128 * 16
    for plan in (
        random_plan(7, S, model.heads, model.kv_heads, seed=1, block_size=128),
        ring_plan(range(4), S, model.heads, model.kv_heads),
    ):
        total = 3.0 * sum(v.sum() for v in rank_forward_flops(plan, model).values())
        assert total == pytest.approx(model.training_flops(S), rel=1e-12)


@pytest.mark.parametrize("name", [m for m, spec in model_catalog().items() if spec.published_params])
def test_param_counts_match_published(name):
    model = get_model(name)
    assert model.param_count == pytest.approx(model.published_params, rel=0.01)


@pytest.mark.parametrize("name", LLAMAS + ["gpt-13b"])
def test_training_flops_match_6_params_tokens_plus_attention(name):
    m = get_model(name)
    S = 32768
    assert m.training_flops(S) == pytest.approx(standard_training_flops(m, S), rel=1e-12)
    if m.has_bias:  # biases are parameters but not matmul FLOPs: only the first form applies
        return
    # the textbook approximation: 6 x (params without input embedding and norms) x tokens + attention
    params = m.param_count - m.embedding_params - (2 * m.layers + 1) * m.norm_params
    if m.tie_embeddings:
        params += m.vocab * m.hidden  # the tied LM head is still a matmul
    attn = 12.0 * m.layers * m.heads * m.head_dim * S * (S + 1) / 2
    assert m.training_flops(S) == pytest.approx(6.0 * params * S + attn, rel=1e-9)


def test_symmetric_plan_pairs_closed_form():
    plan = symmetric_plan(range(8), 8192, 32, 8, cp=4, hp=2)
    L = 8192 // 8
    got = pairs_per_rank(plan)
    assert np.all(got[:, 0] == L * (2 * L + 1))
    assert np.all(got[:, 1:] == 2 * L * L)
