"""Data-parallel replicas of a joint plan: the process groups, from one description.

A joint plan is a list of one-replica plans (each with its own uneven CP x HP layout, ranks from
0) run side by side: global ranks run replica by replica, group by group, so replica i owns the
ranks [start_i, start_i + size_i) and its plan's rank r is global rank start_i + r. Each replica
processes its own number of sequences per step; a sharding strategy (runtime/sharding.py) says how
parameters, gradients and optimizer states are split over the devices.

`ReplicaLayout` is that description (picklable, pure); `build_joint_context` creates every
process group from it, on every rank in the same order (new_group is collective over the world):
each replica's HP groups (today's, offset by the replica's first rank), then the sharding's groups.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import PlanError
from ..plan import Plan
from .groups import RankContext, derive_context, world_violations

STAGES = ("replicated", "zero1", "zero2", "zero3")
SCOPES = ("all", "replica", "node")


def runs_as_replicas(plan: Plan) -> bool:
    """Does `plan` run under its own sharding (a version-2 plan: replicas, or a sharding other than
    the default)? A version-1 plan runs as one replica, replicated or FSDP2 as the run's options say."""
    return bool(plan.replicas) or not plan.sharding.is_default


@dataclass(frozen=True)
class ReplicaLayout:
    """The runtime's view of a joint plan: one-replica `plans` (ranks from 0 each), the `sequences`
    each processes per step, and the sharding `stage` over `scope` ("all" devices, each "replica",
    each "node"). `rank_nodes`: the node of every global rank (needed by scope "node" only)."""

    plans: tuple[Plan, ...]
    sequences: tuple[int, ...]
    stage: str = "replicated"
    scope: str = "all"
    rank_nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", tuple(p if isinstance(p, Plan) else Plan.from_dict(p) for p in self.plans))
        object.__setattr__(self, "sequences", tuple(int(n) for n in self.sequences))
        object.__setattr__(self, "stage", str(self.stage))
        object.__setattr__(self, "scope", str(self.scope))
        bad = self.violations()
        if bad:
            raise PlanError("the replicas cannot run:", bad)

    def violations(self) -> list[str]:
        """Why these replicas cannot run together (empty when they can)."""
        v = []
        if not self.plans or len(self.plans) != len(self.sequences):
            v.append(f"one sequence count per replica: {len(self.plans)} replicas, sequences {list(self.sequences)}")
        if any(n <= 0 for n in self.sequences):
            v.append(f"every replica processes at least one sequence per step, got {list(self.sequences)}")
        if self.plans and len({(p.seq_len, p.num_heads, p.num_kv_heads) for p in self.plans}) > 1:
            v.append("the replicas are plans for different sequence lengths or head counts")
        if self.stage not in STAGES:
            v.append(f"sharding stage {self.stage!r} is not one of {', '.join(STAGES)}")
        if self.scope not in SCOPES:
            v.append(f"sharding scope {self.scope!r} is not one of {', '.join(SCOPES)}")
        if self.scope == "node" and len(self.rank_nodes) != self.world_size:
            v.append(
                f"sharding inside each node needs the node of every rank ({self.world_size}), got {self.rank_nodes}"
            )
        return v

    @classmethod
    def single(cls, plan: Plan, sequences: int = 1, stage: str = "replicated", scope: str = "all") -> ReplicaLayout:
        """One replica: today's runs."""
        return cls((plan,), (sequences,), stage, scope)

    @classmethod
    def from_plan(cls, plan: Plan, global_batch: int, rank_nodes: tuple[int, ...] = ()) -> ReplicaLayout:
        """A Plan with `replicas` and `sharding` (plan file schema 2); a plan without them is one
        replica of all groups processing `global_batch`, its sharding the plan's (default ZeRO-3)."""
        count = getattr(plan, "num_replicas", 1)
        sharding = getattr(plan, "sharding", None)
        stage, scope = (str(sharding.stage), str(sharding.scope)) if sharding is not None else ("zero3", "all")
        if count == 1:
            return cls(
                (plan.replica(0) if hasattr(plan, "replica") else plan,), (global_batch,), stage, scope, rank_nodes
            )
        plans = tuple(plan.replica(i) for i in range(count))
        return cls(plans, tuple(plan.sequences_of(global_batch)), stage, scope, rank_nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plans": [p.to_dict() for p in self.plans],
            "sequences": list(self.sequences),
            "stage": self.stage,
            "scope": self.scope,
            "rank_nodes": list(self.rank_nodes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaLayout:
        return cls(tuple(Plan.from_dict(p) for p in d["plans"]), tuple(d["sequences"]), d["stage"], d["scope"],
                   tuple(d.get("rank_nodes", ())))  # fmt: skip

    @property
    def num_replicas(self) -> int:
        return len(self.plans)

    @property
    def starts(self) -> tuple[int, ...]:
        """Global rank of each replica's rank 0."""
        out, acc = [], 0
        for p in self.plans:
            out.append(acc)
            acc += p.world_size
        return tuple(out)

    @property
    def world_size(self) -> int:
        return sum(p.world_size for p in self.plans)

    @property
    def global_batch(self) -> int:
        return sum(self.sequences)

    def replica_ranks(self, i: int) -> range:
        return range(self.starts[i], self.starts[i] + self.plans[i].world_size)

    def replica_of(self, rank: int) -> int:
        for i in range(self.num_replicas):
            if rank in self.replica_ranks(i):
                return i
        raise PlanError(f"rank {rank} is in no replica (the replicas hold ranks 0..{self.world_size - 1})")

    def first_sequence(self, i: int) -> int:
        """Replica i processes the step's sequences [first_sequence(i), first_sequence(i) + sequences[i])
        of the global batch, in order (so the data of a step does not depend on the replicas)."""
        return sum(self.sequences[:i])

    def shard_sets(self) -> tuple[tuple[int, ...], ...]:
        """The disjoint rank sets inside which the sharded states are split (copies across sets)."""
        if self.stage == "replicated" or self.scope == "all":
            return (tuple(range(self.world_size)),)
        if self.scope == "replica":
            return tuple(tuple(self.replica_ranks(i)) for i in range(self.num_replicas))
        nodes = sorted(set(self.rank_nodes))
        return tuple(tuple(r for r, n in enumerate(self.rank_nodes) if n == node) for node in nodes)

    def fingerprint(self) -> int:
        """A 62-bit digest, equal on every rank that holds the same replicas (plans, shares, sharding)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


@dataclass
class JointContext:
    """One rank's view of the replicas: its replica, its plan context (ranks in the replica's numbering,
    `ctx.rank_offset` = the replica's first global rank) and the whole layout."""

    layout: ReplicaLayout
    rank: int
    replica: int
    ctx: RankContext

    @property
    def sequences(self) -> int:
        """Sequences this rank's replica processes per step."""
        return self.layout.sequences[self.replica]


def derive_joint_context(layout: ReplicaLayout, rank: int) -> JointContext:
    """The tables of global `rank` (pure; no process group is touched)."""
    i = layout.replica_of(rank)
    start = layout.starts[i]
    ctx = derive_context(layout.plans[i], rank - start)
    ctx.rank_offset = start
    return JointContext(layout, rank, i, ctx)


def build_joint_context(layout: ReplicaLayout, rank: int | None = None, *, timeout_s: float = 60.0) -> JointContext:
    """Check the world against the replicas (PlanError before any collective), create every replica's
    HP groups (all ranks, replica by replica, group by group) and check that all ranks hold the same
    replicas. The sharding's groups come after, from `sharding.make_strategy`."""
    if not dist.is_available() or not dist.is_initialized():
        raise PlanError("build_joint_context needs an initialized torch.distributed default process group")
    world = dist.get_world_size()
    rank = dist.get_rank() if rank is None else rank
    if world != layout.world_size:
        raise PlanError(
            f"the replicas hold {layout.world_size} ranks ({[p.world_size for p in layout.plans]}) "
            f"but the torch.distributed world has {world} processes"
        )
    i = layout.replica_of(rank)
    bad = world_violations(layout.plans[i], rank - layout.starts[i], layout.plans[i].world_size)
    if bad:
        raise PlanError(f"replica {i} cannot run (rank {rank}):", bad)
    joint = derive_joint_context(layout, rank)
    for j, (plan, start) in enumerate(zip(layout.plans, layout.starts)):
        for g in range(plan.num_groups):
            ranks = [start + r for r in plan.group_ranks(g)]
            if len(ranks) > 1:
                pg = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
                if j == i and g == joint.ctx.group:
                    joint.ctx.hp_group = pg
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor([layout.fingerprint()], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    prints = [int(t.item()) for t in every]
    if len(set(prints)) > 1:
        differ = [r for r, f in enumerate(prints) if f != prints[rank]]
        raise PlanError(f"ranks hold different replicas: rank {rank} disagrees with ranks {differ}")
    return joint
