"""Everything one rank needs to run attention under a Plan, derived once from (Plan, rank).

- HP group tables for the ragged all-to-all: every peer's token count and (KV) head range.
- The zigzag segments of the rank's group and the local causal block pairs.
- The cross-group KV exchange: this rank's view of `hexiseq.schedule` (the one exchange schedule,
  which the cost model counts too): k-1 rounds, in round j group i receives from group i-j, each
  rank just the KV-head intersections it needs ("sub-rings"); every block pair's mask comes from
  global positions (`schedule.block_mask`).

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
from ..schedule import BlockPair, Range, Round, Segment, block_pairs, group_segments, owned_kv_ranges, rank_rounds


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
    rank_offset: int = 0  # global rank of the plan's rank 0 (a data-parallel replica's first rank)

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
        return tuple(
            sorted({t.src for r in self.rounds for t in r.recv} | {t.dst for r in self.rounds for t in r.send})
        )


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
        plan=plan,
        rank=rank,
        layout=me,
        layouts=lay,
        group=me.group,
        group_ranks=ranks,
        token_counts=tuple(lay[r].num_tokens for r in ranks),
        head_ranges=tuple(lay[r].head_range for r in ranks),
        kv_ranges=tuple(lay[r].kv_head_range for r in ranks),
        owned_kv=owned_kv_ranges(plan, me.group, lay)[me.index_in_group],
        segments=group_segments(plan, me.group),
        local_pairs=block_pairs(group_segments(plan, me.group), group_segments(plan, me.group)),
        rounds=rank_rounds(plan, rank, lay),
        kv_index=kv_index,
        gqa_aligned=h0 % gq == 0 and h1 % gq == 0,
    )


def world_violations(plan: Plan, rank: int, world_size: int) -> list[str]:
    """Why this world cannot run this plan (empty when it can). Local: no communication."""
    v = list(plan.validate())
    if world_size != plan.world_size:
        v.append(
            f"plan {plan.name!r} has {plan.world_size} ranks (HP groups of sizes {list(plan.group_sizes)}) "
            f"but the torch.distributed world has {world_size} processes"
        )
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
