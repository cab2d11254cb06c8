"""Exact FLOP accounting for a Plan.

Units: pairs are counts of (query, key) token pairs for ONE head in ONE layer; FLOPs are
floating-point operations (a multiply-add = 2 FLOPs).

Attention (causal mask, query position t sees key position u iff u <= t)
-------------------------------------------------------------------------
For a block of queries [qa, qa+Lq) against keys [ka, ka+Lk) the number of visible pairs is

    Σ_{t=qa}^{qa+Lq-1} clip(t - ka + 1, 0, Lk) = P(qa+Lq-ka) - P(qa-ka),
    P(x) = m(m+1)/2 + (x - m)·Lk,  m = min(max(x, 0), Lk)         (closed form, no loop)

which is Lq·Lk (full block), L(L+1)/2 (diagonal causal block) or 0 (masked block) for the
zigzag chunks, and correct for any interval. Group g owns chunks [f_g, f_g+L_g) and
[b_g, b_g+L_g) (`Plan.chunk_starts`); `group_pair_matrix(plan)[g, h]` sums the 4 chunk pairs
of g's queries against h's keys. For the zigzag layout this is 2·L_g·L_h for h != g and
L_g·(2·L_g + 1) for h = g, so a group's row sums to L_g·(S + 1).

Round j of the cross-group KV exchange: group g attends to the K/V of group (g - j) mod k
(round 0 = its own K/V). Rank r of group g computes η_r heads over all n_g = 2·L_g tokens of
its group, so its pairs in round j are η_r · M[g, (g - j) mod k] (`pairs_per_rank` gives the
per-head number).

Forward FLOPs
-------------
- attention: 4·d per pair per head per layer (Q·K^T and P·V, 2·d each; softmax ignored)
  (`ModelSpec.attention_flops_per_pair`);
- linear layers per token per layer: 2·(h·H·d + 2·h·H_kv·d + H·d·h + m·h·f) with m = 3 (SwiGLU)
  or 2 (GELU) (`ModelSpec.linear_flops_per_token_per_layer`); norms, RoPE, activations ignored;
- LM head per token: 2·h·V. The loss (softmax + cross entropy) is elementwise and charged as
  memory traffic in the time model, not as FLOPs.
Useful training FLOPs = 3 × forward (backward = 2 × forward); recompute is not counted.
Summed over the ranks of any valid plan this equals `ModelSpec.training_flops(S)`.
"""

from __future__ import annotations

import numpy as np

from ..plan import Plan
from ..specs import ModelSpec


def causal_pairs_between(q_start, q_len, k_start, k_len) -> np.ndarray:
    """Visible (query, key) pairs of query block [q_start, q_start+q_len) vs key block
    [k_start, k_start+k_len) under the causal mask (key <= query). Broadcasts; int64; exact."""
    qa = np.asarray(q_start, dtype=np.int64)
    lq = np.asarray(q_len, dtype=np.int64)
    ka = np.asarray(k_start, dtype=np.int64)
    lk = np.asarray(k_len, dtype=np.int64)

    def P(x: np.ndarray) -> np.ndarray:  # Σ_{i=1}^{x} clip(i, 0, lk)
        x = np.maximum(x, 0)
        m = np.minimum(x, lk)
        return m * (m + 1) // 2 + (x - m) * lk

    return P(qa + lq - ka) - P(qa - ka)


def _chunks(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    starts = np.array(plan.chunk_starts(), dtype=np.int64).reshape(-1, 2)
    lens = np.array([g.chunk_len for g in plan.groups], dtype=np.int64)
    return starts[:, 0], starts[:, 1], lens


def group_pair_matrix(plan: Plan) -> np.ndarray:
    """[k, k] int64: pairs per head per layer of group g's queries against group h's keys."""
    f, b, L = _chunks(plan)
    k = len(L)
    # The 2k chunks are disjoint intervals, so a block of two different chunks is either full (the
    # key chunk ends before the query chunk starts) or empty; only a chunk against itself is a
    # causal triangle. Count the full blocks, then add the own chunks' triangles on the diagonal.
    full = np.zeros((k, k), dtype=np.int64)
    for qs in (f, b):
        for ks in (f, b):
            full += ks[None, :] + L[None, :] <= qs[:, None]
    out = full * (L[:, None] * L[None, :])
    idx = np.arange(k)
    for s in (f, b):
        out[idx, idx] += causal_pairs_between(s, L, s, L)
    return out


def needed_kv_tokens(plan: Plan) -> np.ndarray:
    """[k, k] int64: tokens of group h's K/V that group g needs (some query of g attends to them).

    A key u of h is needed iff u <= the last query position of g (the end of g's back chunk),
    since that query sees every earlier key. Zigzag: L_h for h before g in the ring, 2·L_h after.
    The diagonal (own K/V) is not transferred and is set to 0.
    """
    f, b, L = _chunks(plan)
    last_q = b + L - 1  # last position of each group
    need = np.zeros((len(L), len(L)), dtype=np.int64)
    for ks in (f, b):
        need += np.clip(last_q[:, None] - ks[None, :] + 1, 0, L[None, :])
    np.fill_diagonal(need, 0)
    return need


def rounds_source(k: int) -> np.ndarray:
    """[k, k] int: src[g, j] = the group whose K/V group g uses in round j = (g - j) mod k."""
    g = np.arange(k)
    return (g[:, None] - g[None, :]) % k


def pairs_per_rank(plan: Plan) -> np.ndarray:
    """[R, k] int64: exact query-key pairs per head per layer that rank r computes in round j of the
    exchange (round 0 = own group). Rank r's pairs in round j are heads_r × this value."""
    k = plan.num_groups
    M = group_pair_matrix(plan)
    per_group = M[np.arange(k)[:, None], rounds_source(k)]  # [k, rounds]
    return per_group[np.array(plan.group_of_rank, dtype=np.int64)]


def rank_attention_pairs(plan: Plan) -> np.ndarray:
    """[R] float: pairs over all heads and rounds for one layer: η_r · L_g · (S+1) for zigzag plans."""
    return np.array(plan.heads, dtype=np.float64) * pairs_per_rank(plan).sum(axis=1)


def rank_forward_flops(plan: Plan, model: ModelSpec) -> dict[str, np.ndarray]:
    """Forward FLOPs of one sequence per rank, split into 'linear' (layers), 'lm_head', 'attention'."""
    s = np.array(plan.shards, dtype=np.float64)
    return {
        "linear": s * model.layers * model.linear_flops_per_token_per_layer,
        "lm_head": s * model.lm_head_flops_per_token,
        "attention": rank_attention_pairs(plan) * model.layers * model.attention_flops_per_pair,
    }


def standard_training_flops(model: ModelSpec, seq_len: int) -> float:
    """The textbook count: 6 · (non-embedding matmul params + LM head) · tokens + causal attention
    12 · layers · H · d · S(S+1)/2 (fwd 4·d per pair, ×3 for training). Independent of ModelSpec's
    FLOP helpers; used as a cross-check."""
    m = model
    matmul_params = m.layers * (m.attn_params_per_layer + m.mlp_params_per_layer) + m.vocab * m.hidden
    if m.has_bias:  # biases are additions, not matmul FLOPs
        matmul_params -= m.layers * ((m.heads + 2 * m.kv_heads) * m.head_dim + m.hidden + m.ffn + m.hidden)
    return 6.0 * matmul_params * seq_len + 12.0 * m.layers * m.heads * m.head_dim * seq_len * (seq_len + 1) / 2
