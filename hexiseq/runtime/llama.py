"""A Llama-family decoder written for one device: RMSNorm, RoPE, GQA, SwiGLU, tied or untied embeddings.

Deliberately free of parallel logic (torchtitan / nanoGPT style). Two hooks let
`hexiseq.runtime.parallel` run it under a Plan without touching this file:

- **Explicit positions.** `forward(tokens, positions)` takes the *global* position of every token,
  so a rank that holds a non-contiguous shard (zigzag chunks) rotates q/k exactly as the full
  sequence on one device would.
- **Pluggable attention.** Every layer calls `self.attn_fn(q, k, v)` on one sequence:
  q [s, H, d], k/v [s, H_kv, d] -> [s, H, d]. The default is dense causal SDPA over the tokens
  given (which must then be the whole sequence in order); the parallel wrapper swaps in the
  distributed attention with `set_attention`.

One sequence at a time (no batch dimension): long-context training processes one long sequence per
step, and the distributed attention works on one sequence. Parameter names follow Hugging Face's
`LlamaForCausalLM` (minus its `model.` prefix) so checkpoints map one to one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..errors import SpecError
from ..specs import DEFAULT_NORM_EPS, ModelSpec, RecomputePolicy, recompute_policy
from .kernels import acc_dtype

AttentionFn = Callable[[Tensor, Tensor, Tensor], Tensor]
IGNORE_INDEX = -100  # label of a position that has none (the last token of the sequence)


@dataclass(frozen=True)
class LlamaConfig:
    """Shapes and constants of the model. `rope_scaling` is Hugging Face's dict (only "llama3" or none)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    head_dim: int = 0  # 0 -> hidden // heads
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    norm_eps: float = DEFAULT_NORM_EPS
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise SpecError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise SpecError(f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.head_dim % 2:
            raise SpecError(f"head_dim must be even for RoPE, got {self.head_dim}")
        kind = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if kind not in ("default", "llama3"):
            raise SpecError(f"rope scaling {kind!r} is not supported (supported: none/default, llama3)")

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> LlamaConfig:
        """The runtime config of a ModelSpec (the one bridge: catalog entries and Hugging Face configs
        both come as ModelSpecs); GPT-style specs (GELU, LayerNorm) are refused."""
        if spec.mlp != "swiglu" or spec.norm != "rmsnorm":
            raise SpecError(
                f"model {spec.name!r} is {spec.mlp}/{spec.norm}; the executor runs Llama-family models (swiglu/rmsnorm)"
            )
        return cls(
            vocab=spec.vocab,
            hidden=spec.hidden,
            layers=spec.layers,
            heads=spec.heads,
            kv_heads=spec.kv_heads,
            ffn=spec.ffn,
            head_dim=spec.head_dim,
            rope_theta=float(spec.rope_theta),
            rope_scaling=dict(spec.rope_scaling) if spec.rope_scaling else None,
            norm_eps=float(spec.norm_eps),
            tie_embeddings=spec.tie_embeddings,
        )

    def to_spec(self, name: str) -> ModelSpec:
        """The ModelSpec of this config (for the planner and the cost model): `from_spec`'s inverse."""
        return ModelSpec(
            name=name,
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn=self.ffn,
            vocab=self.vocab,
            mlp="swiglu",
            norm="rmsnorm",
            tie_embeddings=self.tie_embeddings,
            rope_theta=self.rope_theta,
            head_dim=self.head_dim,
            norm_eps=self.norm_eps,
            rope_scaling=dict(self.rope_scaling) if self.rope_scaling else None,
        )


def dense_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention of one whole sequence: q [S, H, d], k/v [S, H_kv, d] -> [S, H, d]."""
    # A batch dimension of 1: with 3-D inputs SDPA on CPU takes its slow math path (5x slower at 2K tokens).
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)[0]
    return out.transpose(0, 1)


def rope_inv_freq(cfg: LlamaConfig) -> Tensor:
    """Inverse frequencies of RoPE (fp32), with Llama 3's long-context rescaling when configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)  # long wavelengths: slow down
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = torch.where(medium, blended, scaled)
    return inv


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [s, heads, d]; cos/sin [s, d]. Hugging Face's half-rotation convention (no weight permutation)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalize in fp32 (as Llama does) so bf16 runs keep the statistic accurate; fp64 stays fp64.
        xf = x.to(acc_dtype(x.dtype))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)
        self.attn_fn: AttentionFn = dense_causal_attention

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project (normed) hidden states [s, hidden] to q [s, H, d], k/v [s, H_kv, d], RoPE applied."""
        s = x.shape[0]
        q = apply_rope(self.q_proj(x).view(s, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(s, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(s, self.kv_heads, self.head_dim)
        return q, k, v

    def project_out(self, out: Tensor) -> Tensor:
        """The O projection of the attention output [s, H, d] -> [s, hidden]."""
        return self.o_proj(out.reshape(out.shape[0], self.heads * self.head_dim))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return self.project_out(self.attn_fn(*self.qkv(x, cos, sin)))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def pre_attention(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Norm + QKV projection + RoPE: the layer input -> q, k, v."""
        return self.self_attn.qkv(self.input_layernorm(x), cos, sin)

    def post_attention(self, x: Tensor, out: Tensor) -> Tensor:
        """O projection + residual + norm + MLP + residual: (layer input, attention output) -> layer output."""
        x = x + self.self_attn.project_out(out)
        return x + self.mlp(self.post_attention_layernorm(x))

    def _plain(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return self.post_attention(x, self.self_attn.attn_fn(*self.pre_attention(x, cos, sin)))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, recompute: RecomputePolicy = RecomputePolicy.NONE) -> Tensor:
        """`recompute` is the activation checkpointing policy (Workload.recompute):

        - "selective": the parts before and after the attention core are checkpointed separately
          (only their inputs are kept and they are recomputed in backward), while the attention core
          runs outside them. It keeps q, k, v, out and lse for its own backward anyway, so the
          distributed attention (all-to-alls, KV exchange) runs once in forward and once in backward,
          never again, and no collective is replayed inside a checkpoint.
        - "full": the whole block is one checkpoint: only its input is kept and backward runs the
          block's forward again, the attention and its collectives included. Every rank checkpoints
          the same blocks, so the replayed collectives run in the same order everywhere.
        - "none": everything is kept.
        This is what the cost model charges (costmodel/estimate.py, memory.py)."""
        if recompute == RecomputePolicy.FULL:
            return checkpoint(self._plain, x, cos, sin, use_reentrant=False)
        if recompute != RecomputePolicy.SELECTIVE:
            return self._plain(x, cos, sin)
        q, k, v = checkpoint(self.pre_attention, x, cos, sin, use_reentrant=False)
        out = self.self_attn.attn_fn(q, k, v)
        return checkpoint(self.post_attention, x, out, use_reentrant=False)


class Llama(nn.Module):
    """The decoder. `forward` returns the final normed hidden states; `logits` / `chunked_loss_sum` finish."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.recompute = RecomputePolicy.NONE

    @property
    def recompute(self) -> RecomputePolicy:
        """The recompute policy of training forwards: NONE, SELECTIVE or FULL (see `Block.forward`)."""
        return self._recompute

    @recompute.setter
    def recompute(self, value: RecomputePolicy | str) -> None:
        self._recompute = recompute_policy(value, allow_auto=False, owner="model")

    def init_weights(self, seed: int = 0, std: float = 0.02) -> Llama:
        """Deterministic random weights (normal(0, std) matrices, unit norms) from `seed`."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():  # named_parameters skips the tied duplicate
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
        return self

    def set_attention(self, fn: AttentionFn) -> None:
        """Route every layer's attention through `fn` (q [s,H,d], k/v [s,H_kv,d] -> [s,H,d])."""
        for layer in self.layers:
            layer.self_attn.attn_fn = fn

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin [s, head_dim] for global positions, computed in fp32 then cast."""
        angles = positions.to(self.inv_freq.device, torch.float32)[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(
        self, tokens: Tensor, positions: Tensor | None = None, labels: Tensor | None = None, loss_chunk: int = 4096
    ) -> Tensor:
        """tokens [s] (one sequence or one shard), positions [s] global -> hidden states [s, hidden].

        With `labels` [s] it returns instead the *sum* of the next-token loss over these rows
        (chunked; see `chunked_loss_sum`). Computing the loss inside forward keeps the LM head
        weight in its unsharded form when the model is wrapped by FSDP.
        """
        if positions is None:
            positions = torch.arange(tokens.shape[0], device=tokens.device)
        x = self.embed_tokens(tokens)
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        cos, sin = self.rope(positions, dtype)
        recompute = self.recompute if torch.is_grad_enabled() else RecomputePolicy.NONE
        for layer in self.layers:
            # Through the module call (checkpoints inside it) so that FSDP's hooks on the block still fire.
            x = layer(x, cos, sin, recompute)
        hidden = self.norm(x)
        if labels is None:
            return hidden
        return chunked_loss_sum(hidden, self.lm_head.weight, labels, loss_chunk)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)


def shift_labels(tokens: Tensor) -> Tensor:
    """Next-token labels of a whole sequence: label[t] = tokens[t+1]; the last position has none."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:-1] = tokens[1:]
    return labels


def _ce_sum(h: Tensor, weight: Tensor, labels: Tensor) -> Tensor:
    logits = F.linear(h, weight)
    logits = logits.to(acc_dtype(logits.dtype))  # softmax statistics in fp32 even under bf16 autocast
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_loss_sum(hidden: Tensor, weight: Tensor, labels: Tensor, chunk: int = 4096) -> Tensor:
    """Sum of next-token cross-entropy over `hidden` rows, `chunk` rows of logits at a time.

    Each chunk is checkpointed: backward recomputes its logits instead of keeping them, so the
    [s, vocab] logits of a long shard never sit in memory whole (one chunk at a time, forward and
    backward). Always returns a tensor connected to `hidden` and `weight`, also for an empty shard,
    so that backward still runs through the layers (and their collectives) on every rank.
    """
    if chunk <= 0:
        raise ValueError(f"loss chunk must be positive, got {chunk}")
    if hidden.shape[0] == 0:
        return (hidden.sum() + weight.sum()) * 0.0
    total = hidden.new_zeros((), dtype=acc_dtype(hidden.dtype))
    for i in range(0, hidden.shape[0], chunk):
        h, y = hidden[i : i + chunk], labels[i : i + chunk]
        if torch.is_grad_enabled() and h.shape[0] > 0:
            total = total + checkpoint(_ce_sum, h, weight, y, use_reentrant=False)
        else:
            total = total + _ce_sum(h, weight, y)
    return total


def reference_loss(model: Llama, tokens: Tensor, loss_chunk: int = 4096) -> Tensor:
    """Mean next-token loss of one whole sequence on one device (the numeric reference)."""
    labels = shift_labels(tokens)
    count = (labels != IGNORE_INDEX).sum().clamp(min=1)
    return model(tokens, labels=labels, loss_chunk=loss_chunk) / count
