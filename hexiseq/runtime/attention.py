"""Exact asymmetric CP x HP attention: the function and module a model calls.

plan_attention(q, k, v, ctx):
  1. ragged all-to-all inside the HP group (my tokens, all heads -> group tokens, my heads);
  2. `_ExchangeAttention`: the group's zigzag chunks against themselves, then k-1 rounds in which
     K/V of the other groups arrive over sub-rings (batched async P2P; round j+1 is in flight while
     round j is computed); partial results merged with the log-sum-exp rule in fp32. Its backward
     fetches the rounds again, and sends each remote block's dK/dV back to the rank that owns it;
  3. the reverse all-to-all.
Even plans take exactly the same path; every size comes from the RankContext (i.e. the Plan).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import PlanError
from ..schedule import BlockPair, Round
from .comm import P2PBatch, gather_heads, scatter_qkv
from .groups import RankContext
from .kernels import acc_dtype, local_attention, local_attention_backward, merge_


def _heads(t: Tensor, first: int, rng: tuple[int, int]) -> Tensor:
    return t[:, rng[0] - first : rng[1] - first]


def _rows(t: Tensor, rows: tuple[tuple[int, int], ...]) -> Tensor:
    return t[rows[0][0] : rows[0][1]] if len(rows) == 1 else torch.cat([t[a:b] for a, b in rows])


def _post_fetch(ctx: RankContext, rd: Round, k: Tensor, v: Tensor) -> P2PBatch:
    """Post round `rd`'s K/V messages: send my owned heads to the next groups, receive from the
    previous ones. One flat message per transfer: K rows then V rows (sizes from the plan)."""
    batch, k0, tag = P2PBatch(ctx.rank_offset), ctx.layout.kv_head_range[0], 2 * rd.index
    for t in rd.send:
        batch.send(torch.cat([_rows(_heads(x, k0, t.kv_heads), t.rows).reshape(-1) for x in (k, v)]), t.dst, tag)
    for t in rd.recv:
        batch.recv(k.new_empty(t.tokens * t.num_kv_heads * (k.shape[2] + v.shape[2])), t.src, tag)
    return batch.start()


def _unpack(rd: Round, bufs: list[Tensor], dk: int, dv: int) -> tuple[Tensor, Tensor]:
    """Received messages (sorted by KV head) -> K, V of the source group's needed rows, my KV heads."""
    ks, vs = [], []
    for t, b in zip(rd.recv, bufs):
        n = t.tokens * t.num_kv_heads
        ks.append(b[: n * dk].view(t.tokens, t.num_kv_heads, dk))
        vs.append(b[n * dk :].view(t.tokens, t.num_kv_heads, dv))
    return torch.cat(ks, 1), torch.cat(vs, 1)


class _ExchangeAttention(torch.autograd.Function):
    """q [n_g, η_r, d], k/v [n_g, kv_r, d] (group tokens, my heads) -> out [n_g, η_r, d]."""

    @staticmethod
    def forward(fctx: Any, q: Tensor, k: Tensor, v: Tensor, ctx: RankContext, scale: float | None) -> Tensor:
        n, hq, _ = q.shape
        fctx.ctx, fctx.scale = ctx, scale
        acc = acc_dtype(q.dtype)
        out = torch.zeros(n, hq, v.shape[2], dtype=acc, device=q.device)
        lse = torch.full((hq, n), float("-inf"), dtype=acc, device=q.device)
        if hq:
            expand = _expander(ctx, q.device)
            fetch = _post_fetch(ctx, ctx.rounds[0], k, v) if ctx.rounds else None
            _attend(ctx.local_pairs, q, expand(k), expand(v), out, lse, scale)  # overlaps round 1
            for i, rd in enumerate(ctx.rounds):
                bufs = fetch.wait()
                fetch = _post_fetch(ctx, ctx.rounds[i + 1], k, v) if i + 1 < len(ctx.rounds) else None
                if rd.recv:
                    kr, vr = _unpack(rd, bufs, k.shape[2], v.shape[2])
                    _attend(rd.pairs, q, expand(kr), expand(vr), out, lse, scale)
        fctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype)

    @staticmethod
    def backward(fctx: Any, dout: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = fctx.saved_tensors
        ctx, scale = fctx.ctx, fctx.scale
        acc = acc_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
        if q.shape[1]:
            dout = dout.contiguous()
            expand, reduce = _expander(ctx, q.device), _reducer(ctx, q.device)
            fetch = _post_fetch(ctx, ctx.rounds[0], k, v) if ctx.rounds else None
            a, b = _attend_backward(ctx.local_pairs, dout, q, expand(k), expand(v), out, lse, scale, dq)
            dk += reduce(a)
            dv += reduce(b)
            returning: tuple[Round, P2PBatch] | None = None
            for i, rd in enumerate(ctx.rounds):
                bufs = fetch.wait()
                fetch = _post_fetch(ctx, ctx.rounds[i + 1], k, v) if i + 1 < len(ctx.rounds) else None
                a = b = None
                if rd.recv:
                    kr, vr = _unpack(rd, bufs, k.shape[2], v.shape[2])
                    a, b = _attend_backward(rd.pairs, dout, q, expand(kr), expand(vr), out, lse, scale, dq)
                    a, b = reduce(a), reduce(b)
                grads = _post_grads(ctx, rd, a, b, k.shape[2] + v.shape[2], q.device, acc)
                if returning is not None:
                    _accumulate(ctx, *returning, dk, dv)
                returning = (rd, grads)
            if returning is not None:
                _accumulate(ctx, *returning, dk, dv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def _post_grads(
    ctx: RankContext,
    rd: Round,
    dk: Tensor | None,
    dv: Tensor | None,
    width: int,
    device: torch.device,
    acc: torch.dtype,
) -> P2PBatch:
    """Send the dK/dV of the blocks I received in round `rd` back to their owners (in the accumulation
    dtype, so the owner sums k-1 contributions without bf16 rounding); receive those of the K/V I sent."""
    batch, k0, tag = P2PBatch(ctx.rank_offset), ctx.layout.kv_head_range[0], 2 * rd.index + 1
    for t in rd.recv:
        batch.send(
            torch.cat([_heads(dk, k0, t.kv_heads).reshape(-1), _heads(dv, k0, t.kv_heads).reshape(-1)]), t.src, tag
        )
    for t in rd.send:
        batch.recv(torch.empty(t.tokens * t.num_kv_heads * width, dtype=acc, device=device), t.dst, tag)
    return batch.start()


def _accumulate(ctx: RankContext, rd: Round, batch: P2PBatch, dk: Tensor, dv: Tensor) -> None:
    """Add the dK/dV that the receivers of my round-`rd` K/V computed into my own gradients."""
    k0 = ctx.layout.kv_head_range[0]
    bufs = batch.wait()
    for t, buf in zip(rd.send, bufs):
        n = t.tokens * t.num_kv_heads
        gk = buf[: n * dk.shape[2]].view(t.tokens, t.num_kv_heads, dk.shape[2])
        gv = buf[n * dk.shape[2] :].view(t.tokens, t.num_kv_heads, dv.shape[2])
        row = 0
        for a, b in t.rows:
            _heads(dk, k0, t.kv_heads)[a:b] += gk[row : row + b - a]
            _heads(dv, k0, t.kv_heads)[a:b] += gv[row : row + b - a]
            row += b - a


def _expander(ctx: RankContext, device: torch.device):
    """K/V heads as the kernel wants them: as-is when query heads map onto whole KV heads, else one
    KV head per query head (a fine GQA split whose range starts or ends inside a KV head's group)."""
    if ctx.gqa_aligned:
        return lambda t: t
    idx = torch.tensor(ctx.kv_index, dtype=torch.long, device=device)
    return lambda t: t.index_select(1, idx)


def _reducer(ctx: RankContext, device: torch.device):
    """Inverse of `_expander` for gradients: sum the per-query-head copies into their KV head."""
    if ctx.gqa_aligned:
        return lambda g: g
    idx = torch.tensor(ctx.kv_index, dtype=torch.long, device=device)
    hk = ctx.layout.kv_heads
    return lambda g: g.new_zeros(g.shape[0], hk, g.shape[2]).index_add_(1, idx, g)


def _attend(
    pairs: tuple[BlockPair, ...], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float | None
) -> None:
    for p in pairs:
        (qa, qb), (ka, kb) = p.q_rows, p.k_rows
        merge_(out[qa:qb], lse[:, qa:qb], *local_attention(q[qa:qb], k[ka:kb], v[ka:kb], p.kind, p.offset, scale))


def _attend_backward(
    pairs: tuple[BlockPair, ...],
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    scale: float | None,
    dq: Tensor,
) -> tuple[Tensor, Tensor]:
    dk = torch.zeros(k.shape, dtype=acc_dtype(q.dtype), device=q.device)
    dv = torch.zeros(v.shape, dtype=acc_dtype(q.dtype), device=q.device)
    for p in pairs:
        (qa, qb), (ka, kb) = p.q_rows, p.k_rows
        a, b, c = local_attention_backward(
            dout[qa:qb], q[qa:qb], k[ka:kb], v[ka:kb], out[qa:qb], lse[:, qa:qb], p.kind, p.offset, scale
        )
        dq[qa:qb] += a
        dk[ka:kb] += b
        dv[ka:kb] += c
    return dk, dv


def plan_attention(q: Tensor, k: Tensor, v: Tensor, ctx: RankContext, scale: float | None = None) -> Tensor:
    """Causal attention of this rank's token shard under the plan.

    q [s_r, H, d], k and v [s_r, H_kv, d]: the rank's tokens in `ctx.layout.token_indices()` order,
    all heads. Returns out [s_r, H, d]: the rows of dense causal attention over the whole sequence.
    Differentiable w.r.t. q, k, v. Every rank of the plan must call it (it communicates), also
    ranks with no tokens (s_r = 0) or no heads, and must take part in the backward.
    """
    plan, s = ctx.plan, ctx.layout.num_tokens
    if (
        q.dim() != 3
        or q.shape[:2] != (s, plan.num_heads)
        or k.shape[:2] != (s, plan.num_kv_heads)
        or v.shape[:2] != k.shape[:2]
    ):
        raise PlanError(
            f"rank {ctx.rank}: plan {plan.name!r} expects q [{s}, {plan.num_heads}, d] and "
            f"k, v [{s}, {plan.num_kv_heads}, d]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    qg, kg, vg = scatter_qkv(q, k, v, ctx)
    return gather_heads(_ExchangeAttention.apply(qg, kg, vg, ctx, scale), ctx)


class PlanAttention(nn.Module):
    """`plan_attention` as a module: forward(q, k, v) for this rank's shard; no parameters."""

    def __init__(self, ctx: RankContext, scale: float | None = None) -> None:
        super().__init__()
        self.ctx, self.scale = ctx, scale

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return plan_attention(q, k, v, self.ctx, self.scale)

    def extra_repr(self) -> str:
        lay = self.ctx.layout
        return f"rank={self.ctx.rank}, group={self.ctx.group}, tokens={lay.num_tokens}, heads={lay.head_range}"
