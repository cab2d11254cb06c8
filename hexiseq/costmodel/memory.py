"""Per-rank peak memory of one training iteration, in bytes.

Notation: P = parameters, R = ranks of the plan, Λ = layers, h = hidden, H / H_kv = query / KV
heads, d = head_dim, f = ffn width, V = vocabulary; per rank: s = shard tokens, η = query heads,
κ = KV heads touched (with duplication for fine splits); its group: n_g = 2·L_g tokens.
Activations are bf16 (2 bytes), softmax statistics fp32.

- model states (mixed-precision AdamW, `ModelSpec.state_bytes`): bf16 weights 2P, bf16 grads 2P,
  fp32 master 4P, Adam moments 8P. "replicated": all of it on every rank; "zero3": /R, plus the
  gathered working set "param_buffers": two layers of bf16 weights (current + prefetch), one
  layer of bf16 gradients before its reduce-scatter, and the larger of embedding / LM head
  (weights + grads, bf16): 2·(3·P_layer + 2·max(P_emb, P_head)).
- activations kept for backward, per layer:
  token side  s·A_tok,  A_tok = 2·(4h + H·d + m·f), m = 3 (SwiGLU: gate, up, gate·up) or 2 (GELU)
              (layer input, norm 1 output, attention output, residual, norm 2 output, MLP);
  head side   A_att = n_g·(2·(2η + 2κ)·d + 4η)   (q, k, v, out in bf16; log-sum-exp in fp32).
  By recompute policy (Workload.recompute; runtime/model.py does the same):
  "none"       Λ·(s·A_tok + A_att).
  "selective"  (the norm + QKV part and the O + MLP part are checkpointed, the attention core is
               not) Λ·(s·2·(h + H·d) + A_att), i.e. per layer the inputs of the two checkpointed
               parts (the layer input and the attention output in token layout) and everything the
               attention backward needs (q, k, v, out in attention layout, η heads × n_g tokens, and
               lse); plus one layer's token side s·A_tok rebuilt during its backward (counted under
               "attention").
  "full"       (the whole block is checkpointed) Λ·s·2h, the layer inputs only; plus the one layer
               being recomputed, s·A_tok + A_att (counted under "attention").
- attention working set of the layer in flight: the gradients dq, dk, dv, dout
  (n_g·(2η + 2κ)·d·2) and the all-to-all send buffer s·(H + 2·H_kv)·d·2.
- kv_buffers: the exchange is double-buffered and the backward sends dK/dV back (bf16, the same
  size as the K/V they belong to): 2·max_j (B_j + B_{j+1}), B_j = bytes received in round j
  (B_k = 0); 0 for one group.
- logits: c·V·6 bytes (bf16 logits + fp32 softmax/gradient), c = s, or min(s, loss_chunk_tokens)
  when V ≥ large_vocab (chunked loss).
- reserved: reserved_fraction × capacity (CUDA context, NCCL buffers, allocator fragmentation).
A rank fits when the sum ≤ capacity.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec, Workload
from .arrays import CostOptions, PlanArrays, recompute_of

BF16 = 2.0
FP32 = 4.0

MEMORY_KEYS = ("weights", "grads", "optimizer", "param_buffers", "activations", "attention", "kv_buffers", "logits", "reserved")


def token_activation_bytes(model: ModelSpec) -> float:
    """A_tok: bytes kept per token per layer on the token side (bf16)."""
    m = 3 if model.mlp == "swiglu" else 2
    return BF16 * (4 * model.hidden + model.heads * model.head_dim + m * model.ffn)


def checkpoint_token_bytes(model: ModelSpec) -> float:
    """Bytes kept per token per layer on the token side with selective checkpointing: the inputs of
    the two checkpointed parts, the layer input (h) and the attention output (H·d), bf16."""
    return BF16 * (model.hidden + model.heads * model.head_dim)


def head_activation_bytes_per_token(model: ModelSpec, eta, kvc):
    """Bytes kept per group token per layer on the head side: q, k, v, out (bf16) + lse (fp32)."""
    return BF16 * (2 * np.asarray(eta) + 2 * np.asarray(kvc)) * model.head_dim + FP32 * np.asarray(eta)


def state_bytes(model: ModelSpec, workload: Workload, ranks: int) -> dict[str, float]:
    """Model-state bytes per rank (weights, grads, optimizer, param_buffers)."""
    sb = model.state_bytes()
    div = ranks if workload.param_sharding == "zero3" else 1
    out = {
        "weights": sb["weights_bf16"] / div,
        "grads": sb["grads_bf16"] / div,
        "optimizer": (sb["master_fp32"] + sb["adam_fp32"]) / div,
        "param_buffers": 0.0,
    }
    if workload.param_sharding == "zero3":
        big = max(model.embedding_params, model.lm_head_params)
        out["param_buffers"] = BF16 * (3 * model.params_per_layer + 2 * big)
    return out


def logits_tokens(s: np.ndarray, model: ModelSpec, options: CostOptions) -> np.ndarray:
    """Tokens whose logits are alive at once."""
    return np.minimum(s, options.loss_chunk_tokens) if model.vocab >= options.large_vocab else s


def kv_buffer_bytes(recv_bytes: np.ndarray) -> np.ndarray:
    """[R] 2·max_j (B_j + B_{j+1}) from the per-round received bytes [R, k] (column 0 = own group)."""
    B = recv_bytes[:, 1:]
    if B.shape[1] == 0:
        return np.zeros(recv_bytes.shape[0])
    nxt = np.concatenate([B[:, 1:], np.zeros((B.shape[0], 1))], axis=1)
    return 2.0 * (B + nxt).max(axis=1)


def memory_bytes(a: PlanArrays, model: ModelSpec, workload: Workload, recv_bytes: np.ndarray, options: CostOptions = CostOptions()) -> dict[str, np.ndarray]:
    """Per-rank bytes by category (MEMORY_KEYS), each an [R] array. `recv_bytes` from comm.exchange_times."""
    R = a.R
    n_g = 2.0 * a.L[a.grp]
    layers = model.layers
    out = {key: np.zeros(R) + v for key, v in state_bytes(model, workload, R).items()}
    tok = a.s * token_activation_bytes(model)
    att = n_g * head_activation_bytes_per_token(model, a.eta, a.kvc)
    grads = n_g * BF16 * (2 * a.eta + 2 * a.kvc) * model.head_dim
    sendbuf = a.s * BF16 * (model.heads + 2 * model.kv_heads) * model.head_dim
    policy = recompute_of(workload)
    if policy == "full":
        out["activations"] = layers * a.s * BF16 * model.hidden
        out["attention"] = tok + att + grads + sendbuf
    elif policy == "selective":
        out["activations"] = layers * (a.s * checkpoint_token_bytes(model) + att)
        out["attention"] = tok + grads + sendbuf
    else:
        out["activations"] = layers * (tok + att)
        out["attention"] = grads + sendbuf
    out["kv_buffers"] = kv_buffer_bytes(recv_bytes)
    out["logits"] = logits_tokens(a.s, model, options) * model.vocab * (BF16 + FP32)
    out["reserved"] = options.reserved_fraction * a.capacity
    return out
