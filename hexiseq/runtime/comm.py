"""Communication only: the differentiable ragged all-to-all of an HP group and batched async P2P.

The split tables come from `groups.RankContext`; nothing here looks at world_size. Everything
uneven goes through `all_to_all_single` with per-rank split sizes (the list all-to-all of gloo
refuses uneven shapes), on flat buffers packed peer by peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from . import emulation

if TYPE_CHECKING:  # pragma: no cover
    from .groups import RankContext


class _RaggedAllToAll(torch.autograd.Function):
    """all_to_all_single on a flat tensor; the backward is the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        return _all_to_all(dy, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> Tensor:
    """The exchange itself; over an emulated link (runtime/emulation.py) each peer's part carries its
    post time and the exchange is held to the link's time."""
    links = None
    if emulation.active() is not None:
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        links = emulation.a2a_links(ranks, in_splits, out_splits)
    if links is None:
        y = x.new_empty(sum(out_splits))
        dist.all_to_all_single(y, x.contiguous(), out_splits, in_splits, group=group)
        return y
    xs, ins, outs = links.pack(x.contiguous())
    y = x.new_empty(sum(outs))
    dist.all_to_all_single(y, xs, outs, ins, group=group)
    return links.unpack(y)


def ragged_all_to_all(x: Tensor, in_splits: Sequence[int], out_splits: Sequence[int], group: Any = None) -> Tensor:
    """Send x[sum(in_splits[:p]) : ...+in_splits[p]] to peer p of `group`; receive out_splits[p]
    elements from peer p, concatenated in peer order. x is flat. Differentiable."""
    return _RaggedAllToAll.apply(x.reshape(-1), list(map(int, out_splits)), list(map(int, in_splits)), group)


def scatter_qkv(q: Tensor, k: Tensor, v: Tensor, ctx: RankContext) -> tuple[Tensor, Tensor, Tensor]:
    """(my tokens, all heads) -> (group tokens in group order, my heads), q, k and v in ONE exchange.

    q [s_r, H, d], k/v [s_r, H_kv, d]  ->  q [n_g, η_r, d], k/v [n_g, kv_r, d], where kv_r are the
    KV heads my query heads use. KV heads shared by several peers (fine GQA split) are sent to each
    of them; autograd of the slicing sums their gradients back."""
    if ctx.hp_group is None:  # a one-rank group already holds everything
        return q, k, v
    (h0, h1), (k0, k1) = ctx.layout.head_range, ctx.layout.kv_head_range
    dq, dk, dv = q.shape[2], k.shape[2], v.shape[2]
    parts, in_splits = [], []
    for (a, b), (c, e) in zip(ctx.head_ranges, ctx.kv_ranges):
        parts += [q[:, a:b].reshape(-1), k[:, c:e].reshape(-1), v[:, c:e].reshape(-1)]
        in_splits.append(q.shape[0] * ((b - a) * dq + (e - c) * (dk + dv)))
    out_splits = [s * ((h1 - h0) * dq + (k1 - k0) * (dk + dv)) for s in ctx.token_counts]
    y = ragged_all_to_all(torch.cat(parts), in_splits, out_splits, ctx.hp_group)
    qs, ks, vs, pos = [], [], [], 0
    for s in ctx.token_counts:  # each peer's block: its s tokens of q, then of k, then of v
        for dst, width, d in ((qs, h1 - h0, dq), (ks, k1 - k0, dk), (vs, k1 - k0, dv)):
            dst.append(y[pos : pos + s * width * d].view(s, width, d))
            pos += s * width * d
    return torch.cat(qs), torch.cat(ks), torch.cat(vs)


def gather_heads(y: Tensor, ctx: RankContext) -> Tensor:
    """(group tokens, my heads) -> (my tokens, all heads): the inverse of the q part of scatter_qkv."""
    if ctx.hp_group is None:
        return y
    eta, d = y.shape[1], y.shape[2]
    starts = [0]
    for s in ctx.token_counts:
        starts.append(starts[-1] + s)
    in_splits = [s * eta * d for s in ctx.token_counts]
    s_me = ctx.layout.num_tokens
    out_splits = [s_me * (b - a) * d for a, b in ctx.head_ranges]
    x = torch.cat([y[a:b].reshape(-1) for a, b in zip(starts, starts[1:])])
    z = ragged_all_to_all(x, in_splits, out_splits, ctx.hp_group)
    blocks, pos = [], 0
    for (a, b), n in zip(ctx.head_ranges, out_splits):
        blocks.append(z[pos : pos + n].view(s_me, b - a, d))
        pos += n
    return torch.cat(blocks, dim=1)


# --------------------------------------------------------------------------- point to point


class P2PBatch:
    """Async sends/receives posted together (`batch_isend_irecv`); `wait()` returns the receive
    buffers in the order they were added. Tags keep two messages between one pair apart. Under an
    emulation with emulated links (runtime/emulation.py) messages over those links carry their post
    time and `wait()` holds until the emulated link would have delivered them."""

    def __init__(self, rank_offset: int = 0) -> None:
        # peers are named in the plan's numbering; `rank_offset` maps them to the world's (a replica's
        # ranks start at its first global rank)
        self.offset = rank_offset
        self.ops: list[dist.P2POp] = []
        self.recv_bufs: list[Tensor] = []
        self.works: list[Any] = []
        self.links = emulation.p2p_links()

    def send(self, t: Tensor, peer: int, tag: int) -> None:
        t, peer = t.contiguous(), peer + self.offset
        if self.links is not None:
            t = self.links.send(t, peer)
        self.ops.append(dist.P2POp(dist.isend, t, peer, tag=tag))

    def recv(self, t: Tensor, peer: int, tag: int) -> Tensor:
        peer += self.offset
        buf = self.links.recv(t, peer) if self.links is not None else t
        self.ops.append(dist.P2POp(dist.irecv, buf, peer, tag=tag))
        if buf is not t:
            t = buf[: t.numel()].view(t.shape)
        self.recv_bufs.append(t)
        return t

    def start(self) -> P2PBatch:
        if self.ops:
            if self.links is not None:
                self.links.post()
            self.works = dist.batch_isend_irecv(self.ops)
        return self

    def wait(self) -> list[Tensor]:
        for w in self.works:
            w.wait()
        if self.works and self.links is not None:
            self.links.complete()
        self.works = []
        return self.recv_bufs
