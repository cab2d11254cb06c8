"""Everything one rank needs to run attention under a Plan, derived once from (Plan, rank).

- HP group tables for the ragged all-to-all: every peer's token count and (KV) head range.
- The zigzag segments of the rank's group and the local causal block pairs.
- The cross-group KV exchange: k-1 rounds; in round j group i receives from group i-j. Within a
  round rank r receives, from every rank of the source group that *owns* KV heads r needs, just the
  intersection ("sub-rings"). KV heads duplicated by a fine GQA split are owned by the first rank
  of the group that holds them, so each KV head travels once per round and its gradient returns
  to exactly one copy. Only the source-group segments that some query of the receiver can see are
  sent; every block pair's mask comes from global positions (`kernels.block_mask`).

`derive_context` is pure (no torch.distributed); `build_context` checks the world against the
plan before any collective, then creates the HP subgroups.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import PlanError
from ..plan import Plan, RankLayout
from .kernels import NONE, block_mask

Range = tuple[int, int]


@dataclass(frozen=True)
class Segment:
    """A run of consecutive global positions and where it sits in a buffer (first row)."""

    start: int
    length: int
    row: int


@dataclass(frozen=True)
class BlockPair:
    """One kernel call: query rows of the group buffer against key rows of a K/V buffer."""

    q_rows: Range
    k_rows: Range
    kind: str
    offset: int


@dataclass(frozen=True)
class Transfer:
    """One K/V message: `src` sends KV heads `kv_heads` of the source group's `rows` (group-order
    rows, packed in this order; `tokens` in all) to `dst`. Its gradient travels back the same way."""

    src: int
    dst: int
    kv_heads: Range
    rows: tuple[Range, ...]
    tokens: int

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


@dataclass(frozen=True)
class Round:
    """Round j of the exchange as seen by one rank."""

    index: int
    src_group: int
    dst_group: int
    recv: tuple[Transfer, ...]  # sorted by KV head: concatenated they cover this rank's KV heads
    send: tuple[Transfer, ...]
    key_tokens: int  # rows of the received K/V buffer
    pairs: tuple[BlockPair, ...]


@dataclass
class RankContext:
    """One rank's view of a Plan. Built once; attention reads only this."""

    plan: Plan
    rank: int
    layout: RankLayout
    layouts: tuple[RankLayout, ...]
    group: int
    group_ranks: tuple[int, ...]
    token_counts: tuple[int, ...]  # s_p of every peer of the HP group (group order)
    head_ranges: tuple[Range, ...]  # query heads of every peer
    kv_ranges: tuple[Range, ...]  # KV heads every peer needs (may overlap with a fine GQA split)
    owned_kv: Range  # KV heads whose cross-group traffic this rank serves
    segments: tuple[Segment, ...]  # the group's front and back chunk, rows in group order
    local_pairs: tuple[BlockPair, ...]
    rounds: tuple[Round, ...]
    kv_index: tuple[int, ...]  # local KV head of each local query head
    gqa_aligned: bool  # query heads map onto whole KV heads (no expansion needed)
    hp_group: Any = field(default=None, repr=False)  # ProcessGroup of the HP group (None if size 1)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def index_in_group(self) -> int:
        return self.layout.index_in_group

    @property
    def group_tokens(self) -> int:
        return self.plan.groups[self.group].tokens

    @property
    def peers(self) -> tuple[int, ...]:
        """Every rank this rank exchanges K/V with (either direction), sorted."""
        return tuple(sorted({t.src for r in self.rounds for t in r.recv} | {t.dst for r in self.rounds for t in r.send}))


def _cut(a: Range, b: Range) -> Range | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def group_segments(plan: Plan, g: int) -> tuple[Segment, ...]:
    (f0, b0), L = plan.chunk_starts()[g], plan.groups[g].chunk_len
    return (Segment(f0, L, 0), Segment(b0, L, L))


def _pairs(q_segs: tuple[Segment, ...], k_segs: tuple[Segment, ...]) -> tuple[BlockPair, ...]:
    out = []
    for qs in q_segs:
        for ks in k_segs:
            kind, off = block_mask(qs.start, qs.length, ks.start, ks.length)
            if kind != NONE:
                out.append(BlockPair((qs.row, qs.row + qs.length), (ks.row, ks.row + ks.length), kind, off))
    return tuple(out)


def needed_segments(plan: Plan, src: int, dst: int) -> tuple[Segment, ...]:
    """Segments of group `src` (rows in src's group order) that some query of group `dst` can see.
    With the zigzag layout: an earlier group's front chunk, or both chunks of a later group."""
    q_segs = group_segments(plan, dst)
    return tuple(s for s in group_segments(plan, src) if any(block_mask(q.start, q.length, s.start, s.length)[0] != NONE for q in q_segs))


def packed(segs: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """The same segments with rows renumbered as they lie in a message (concatenated in order)."""
    out, row = [], 0
    for s in segs:
        out.append(Segment(s.start, s.length, row))
        row += s.length
    return tuple(out)


def owned_kv_ranges(plan: Plan, g: int, layouts: list[RankLayout] | tuple[RankLayout, ...] | None = None) -> list[Range]:
    """Disjoint KV head ranges of the ranks of group g (first holder owns a duplicated head)."""
    lay = layouts or plan.layout()
    out, cursor = [], 0
    for r in plan.group_ranks(g):
        k0, k1 = lay[r].kv_head_range
        own = (max(k0, cursor), k1) if k1 > max(k0, cursor) else (cursor, cursor)
        cursor = max(cursor, k1)
        out.append(own)
    return out


def exchange_rounds(plan: Plan, rank: int, layouts: list[RankLayout] | tuple[RankLayout, ...] | None = None) -> tuple[Round, ...]:
    """The k-1 rounds of the cross-group K/V exchange for `rank`."""
    lay = layouts or plan.layout()
    k, me = plan.num_groups, lay[rank]
    owned = {g: owned_kv_ranges(plan, g, lay) for g in range(k)}
    rounds = []
    for j in range(1, k):
        src, dst = (me.group - j) % k, (me.group + j) % k
        recv_segs = needed_segments(plan, src, me.group)
        recv_rows = tuple((s.row, s.row + s.length) for s in recv_segs)
        recv = []
        if me.num_heads:
            for r2, own in zip(plan.group_ranks(src), owned[src]):
                cut = _cut(own, me.kv_head_range)
                if cut:
                    recv.append(Transfer(r2, rank, cut, recv_rows, sum(s.length for s in recv_segs)))
        send_segs = needed_segments(plan, me.group, dst)
        send_rows = tuple((s.row, s.row + s.length) for s in send_segs)
        my_own = owned[me.group][me.index_in_group]
        send = []
        for r2 in plan.group_ranks(dst):
            cut = _cut(my_own, lay[r2].kv_head_range) if lay[r2].num_heads else None
            if cut:
                send.append(Transfer(rank, r2, cut, send_rows, sum(s.length for s in send_segs)))
        pairs = _pairs(group_segments(plan, me.group), packed(recv_segs)) if recv else ()
        rounds.append(Round(j, src, dst, tuple(sorted(recv, key=lambda t: t.kv_heads)), tuple(send),
                            sum(s.length for s in recv_segs), pairs))
    return tuple(rounds)


def derive_context(plan: Plan, rank: int) -> RankContext:
    """All tables of `rank` under `plan` (pure; no process group is touched)."""
    lay = tuple(plan.layout())
    if not 0 <= rank < len(lay):
        raise PlanError(f"rank {rank} is not in plan {plan.name!r} (ranks 0..{len(lay) - 1})")
    me = lay[rank]
    ranks = plan.group_ranks(me.group)
    gq = plan.num_heads // plan.num_kv_heads
    h0, h1 = me.head_range
    kv_index = tuple(h // gq - me.kv_head_range[0] for h in range(h0, h1))
    return RankContext(
        plan=plan, rank=rank, layout=me, layouts=lay, group=me.group, group_ranks=ranks,
        token_counts=tuple(lay[r].num_tokens for r in ranks),
        head_ranges=tuple(lay[r].head_range for r in ranks),
        kv_ranges=tuple(lay[r].kv_head_range for r in ranks),
        owned_kv=owned_kv_ranges(plan, me.group, lay)[me.index_in_group],
        segments=group_segments(plan, me.group),
        local_pairs=_pairs(group_segments(plan, me.group), group_segments(plan, me.group)),
        rounds=exchange_rounds(plan, rank, lay),
        kv_index=kv_index,
        gqa_aligned=h0 % gq == 0 and h1 % gq == 0,
    )


def world_violations(plan: Plan, rank: int, world_size: int) -> list[str]:
    """Why this world cannot run this plan (empty when it can). Local: no communication."""
    v = list(plan.validate())
    if world_size != plan.world_size:
        v.append(f"plan {plan.name!r} has {plan.world_size} ranks (HP groups of sizes {list(plan.group_sizes)}) "
                 f"but the torch.distributed world has {world_size} processes")
    if not 0 <= rank < world_size:
        v.append(f"rank {rank} is outside the world of {world_size}")
    return v


def plan_fingerprint(plan: Plan) -> int:
    """A 62-bit digest of the plan's JSON, equal on every rank that holds the same plan."""
    return int.from_bytes(hashlib.sha256(plan.to_json(indent=None).encode()).digest()[:8], "little") >> 2


def build_context(plan: Plan, rank: int | None = None, *, timeout_s: float = 60.0) -> RankContext:
    """Check the running world against the plan (PlanError before any collective), create the HP
    subgroups (every rank calls new_group for every multi-rank group, in plan order), and check
    that all ranks hold the same plan. Call on every rank after the default group exists."""
    if not dist.is_available() or not dist.is_initialized():
        raise PlanError("build_context needs an initialized torch.distributed default process group")
    world, rank = dist.get_world_size(), dist.get_rank() if rank is None else rank
    if rank != dist.get_rank():
        raise PlanError(f"build_context was given rank {rank} but this process is rank {dist.get_rank()}")
    bad = world_violations(plan, rank, world)
    if bad:
        raise PlanError(f"plan {plan.name!r} cannot run on this world (rank {rank}):", bad)
    ctx = derive_context(plan, rank)
    for g in range(plan.num_groups):
        ranks = list(plan.group_ranks(g))
        if len(ranks) > 1:
            pg = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
            if g == ctx.group:
                ctx.hp_group = pg
    # Same plan everywhere? Gathered by all, so every rank raises the same error together.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor([plan_fingerprint(plan)], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    prints = [int(t.item()) for t in every]
    if len(set(prints)) > 1:
        differ = [r for r, f in enumerate(prints) if f != prints[rank]]
        raise PlanError(f"ranks hold different plans: rank {rank} (plan {plan.name!r}) disagrees with ranks {differ}")
    return ctx
