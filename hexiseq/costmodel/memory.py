"""Per-rank peak memory of one training iteration, in bytes: one home for memory per token.

Notation: P = parameters, R = ranks of the plan, Λ = layers, h = hidden, H / H_kv = query / KV
heads, d = head_dim, f = ffn width, V = vocabulary; per rank: s = shard tokens, η = query heads,
κ = KV heads touched (with duplication for fine splits); its group: n_g = 2·L_g tokens. The head
side is written with w = η·L_g and u = κ·L_g (n_g·η = 2w, n_g·κ = 2u), so every category is
const + c_s·s + c_w·w + c_u·u (`MemoryTerms`), plus the K/V receive buffers and the logits, which
the planner's model takes as pieces. Activations are bf16 (2 bytes), softmax statistics fp32.

- model states (mixed-precision AdamW, `ModelSpec.state_bytes`): bf16 weights 2P, bf16 grads 2P,
  fp32 master 4P, Adam moments 8P. "replicated": all of it on every rank; "zero3": /R, plus the
  gathered working set "param_buffers": two layers of bf16 weights (current + prefetch), one
  layer of bf16 gradients before its reduce-scatter, and the larger of embedding / LM head
  (weights + grads, bf16): 2·(3·P_layer + 2·max(P_emb, P_head)).
- activations kept for backward, per layer:
  token side  s·A_tok,  A_tok = 2·(4h + H·d + m·f), m = 3 (SwiGLU: gate, up, gate·up) or 2 (GELU)
              (layer input, norm 1 output, attention output, residual, norm 2 output, MLP);
  head side   A_att = n_g·(2·(2η + 2κ)·d + 4η)   (q, k, v, out in bf16; log-sum-exp in fp32).
  By the recompute rule's `keep` (policy.py; runtime/llama.py does the same):
  "all"          Λ·(s·A_tok + A_att).
  "checkpoints"  Λ·(s·2·(h + H·d) + A_att): per layer the inputs of the two checkpointed parts (the
                 layer input and the attention output in token layout) and everything the attention
                 backward needs; plus one layer's token side s·A_tok rebuilt during its backward
                 (counted under "attention").
  "inputs"       Λ·s·2h, the layer inputs only; plus the one layer being recomputed, s·A_tok + A_att
                 (counted under "attention").
- attention working set of the layer in flight: the gradients dq, dk, dv, dout
  (n_g·(2η + 2κ)·d·2) and the all-to-all send buffer s·(H + 2·H_kv)·d·2.
- kv_buffers: the exchange is double-buffered and the backward sends dK/dV back (bf16, the same
  size as the K/V they belong to): 2·max_j (B_j + B_{j+1}), B_j = bytes received in round j
  (B_k = 0); 0 for one group.
- logits: c·V·6 bytes (bf16 logits + fp32 softmax/gradient), c = s, or a whole loss chunk
  (loss_chunk_tokens) when V ≥ large_vocab (chunked loss: the runtime holds min(s, chunk); charging
  the chunk keeps the memory linear, conservative by at most one chunk for shards under it).
- reserved: reserved_fraction × capacity (CUDA context, NCCL buffers, allocator fragmentation).
A rank fits when the sum ≤ capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import ShardingStage
from ..specs import ModelSpec, Workload
from .arrays import PlanArrays
from .kernels import BF16, FP32, CostOptions
from .policy import RecomputeRule, rule_of

MEMORY_KEYS = (
    "weights",
    "grads",
    "optimizer",
    "param_buffers",
    "activations",
    "attention",
    "kv_buffers",
    "logits",
    "reserved",
)


@dataclass(frozen=True)
class MemoryTerms:
    """bytes = const + c_s·s + c_w·w + c_u·u for one category (w = η·L_g, u = κ·L_g)."""

    const: float = 0.0
    c_s: float = 0.0
    c_w: float = 0.0
    c_u: float = 0.0

    def __call__(self, s, w, u):
        return self.const + self.c_s * s + self.c_w * w + self.c_u * u


def token_activation_bytes(model: ModelSpec) -> float:
    """A_tok: bytes kept per token per layer on the token side (bf16)."""
    m = 3 if model.mlp == "swiglu" else 2
    return BF16 * (4 * model.hidden + model.heads * model.head_dim + m * model.ffn)


def checkpoint_token_bytes(model: ModelSpec) -> float:
    """Bytes kept per token per layer on the token side with selective checkpointing: the inputs of
    the two checkpointed parts, the layer input (h) and the attention output (H·d), bf16."""
    return BF16 * (model.hidden + model.heads * model.head_dim)


def state_bytes(model: ModelSpec, workload: Workload, ranks: int) -> dict[str, float]:
    """Model-state bytes per rank (weights, grads, optimizer, param_buffers) under the workload's
    sharding ("zero3": sharded over the plan's `ranks`; "replicated")."""
    stage = ShardingStage.ZERO3 if workload.param_sharding == "zero3" else ShardingStage.REPLICATED
    return sharded_state_bytes(model, stage, ranks)


def sharded_state_bytes(model: ModelSpec, stage: ShardingStage, shards) -> dict[str, float]:
    """Model-state bytes per device under a sharding stage, the sharded states split over `shards`
    devices (a number, or an [R] array: each rank's shard group). The one home of the strategies' memory:

    replicated  weights 2P, grads 2P, optimizer 12P on every device
    zero1       optimizer states / n (weights and accumulated gradients whole)
    zero2       gradients / n too, plus one layer's and the larger root unit's bf16 gradients before
                their reduce-scatter: 2·(P_layer + max(P_emb, P_head)); the weights stay gathered (2P)
    zero3       everything / n, plus the gathered working set 2·(3·P_layer + 2·max(P_emb, P_head))
    """
    sb = model.state_bytes()
    opt = sb["master_fp32"] + sb["adam_fp32"]
    big = max(model.embedding_params, model.lm_head_params)
    if stage == ShardingStage.ZERO3:
        return {
            "weights": sb["weights_bf16"] / shards,
            "grads": sb["grads_bf16"] / shards,
            "optimizer": opt / shards,
            "param_buffers": BF16 * (3 * model.params_per_layer + 2 * big),
        }
    out = {"weights": sb["weights_bf16"], "grads": sb["grads_bf16"], "optimizer": opt, "param_buffers": 0.0}
    if stage == ShardingStage.ZERO2:
        out["grads"] = sb["grads_bf16"] / shards
        out["param_buffers"] = BF16 * (model.params_per_layer + big)
    if stage in (ShardingStage.ZERO1, ShardingStage.ZERO2):
        out["optimizer"] = opt / shards
    return out


def memory_terms(
    model: ModelSpec,
    workload: Workload,
    ranks: int,
    rule: RecomputeRule | None = None,
    options: CostOptions = CostOptions(),
) -> dict[str, MemoryTerms]:
    """The affine categories of memory.py's model (all but kv_buffers and reserved)."""
    rule = rule or rule_of(workload)
    d, Lyr = model.head_dim, model.layers
    tok = token_activation_bytes(model)
    # head side per unit of w = η·L_g and u = κ·L_g (n_g = 2·L_g tokens): q, out (2·2d·η), k, v (2·2d·κ), lse (4·η)
    att_w, att_u = 2.0 * (BF16 * 2 * d + FP32), 2.0 * BF16 * 2 * d
    grad_w, grad_u = 2.0 * BF16 * 2 * d, 2.0 * BF16 * 2 * d  # dq, dout and dk, dv of the layer in flight
    send_s = BF16 * (model.heads + 2 * model.kv_heads) * d
    out = {key: MemoryTerms(const=v) for key, v in state_bytes(model, workload, options.shards(ranks)).items()}
    if rule.keep == "inputs":
        out["activations"] = MemoryTerms(c_s=Lyr * BF16 * model.hidden)
        out["attention"] = MemoryTerms(c_s=tok + send_s, c_w=att_w + grad_w, c_u=att_u + grad_u)
    elif rule.keep == "checkpoints":
        out["activations"] = MemoryTerms(c_s=Lyr * checkpoint_token_bytes(model), c_w=Lyr * att_w, c_u=Lyr * att_u)
        out["attention"] = MemoryTerms(c_s=tok + send_s, c_w=grad_w, c_u=grad_u)
    else:
        out["activations"] = MemoryTerms(c_s=Lyr * tok, c_w=Lyr * att_w, c_u=Lyr * att_u)
        out["attention"] = MemoryTerms(c_s=send_s, c_w=grad_w, c_u=grad_u)
    chunked = model.vocab >= options.large_vocab
    out["logits"] = (
        MemoryTerms(const=options.loss_chunk_tokens * logits_bytes_per_token(model))
        if chunked
        else MemoryTerms(c_s=logits_bytes_per_token(model))
    )
    return out


def logits_bytes_per_token(model: ModelSpec) -> float:
    """bf16 logits + fp32 softmax / gradient per alive token."""
    return model.vocab * (BF16 + FP32)


def kv_double_buffer(this_round, next_round):
    """Bytes of the K/V receive buffers while round j runs (module doc): round j's and the prefetched
    round j+1's K/V, and their dK/dV in backward, 2·(B_j + B_{j+1}). The one place the rule is
    written; works on numbers, numpy arrays and optimization-model expressions alike."""
    return 2.0 * (this_round + next_round)


def kv_buffer_bytes(recv_bytes: np.ndarray) -> np.ndarray:
    """[R] 2·max_j (B_j + B_{j+1}) from the per-round received bytes [R, k] (column 0 = own group)."""
    B = recv_bytes[:, 1:]
    if B.shape[1] == 0:
        return np.zeros(recv_bytes.shape[0])
    nxt = np.concatenate([B[:, 1:], np.zeros((B.shape[0], 1))], axis=1)
    return kv_double_buffer(B, nxt).max(axis=1)


def memory_bytes(
    a: PlanArrays, model: ModelSpec, workload: Workload, recv_bytes: np.ndarray, options: CostOptions = CostOptions()
) -> dict[str, np.ndarray]:
    """Per-rank bytes by category (MEMORY_KEYS), each an [R] array. `recv_bytes` from comm.exchange_times."""
    L = a.L[a.grp]
    w, u = a.eta * L, a.kvc * L
    out = {key: np.zeros(a.R) + t(a.s, w, u) for key, t in memory_terms(model, workload, a.R, options=options).items()}
    out["kv_buffers"] = kv_buffer_bytes(recv_bytes)
    out["reserved"] = options.reserved_fraction * a.capacity
    return {key: out[key] for key in MEMORY_KEYS}
