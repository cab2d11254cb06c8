"""The Plan: how one sequence and the attention heads are split over the devices.

Vocabulary (docs/architecture.md: the Plan is the one object every part speaks):

- The plan's **groups** are HP (Ulysses) groups in **ring order** g = 0..k-1. A group is a
  list of cluster device indices; the plan's **ranks** are those devices numbered in order,
  group by group (rank 0 = first device of group 0). Devices of the cluster that appear in no
  group are left out of the run.
- The sequence of S tokens is cut into 2k **zigzag chunks**: group g owns chunk g and chunk
  2k-1-g, both of length L_g (`chunk_len`), a multiple of `block_size`. So the sequence reads
  L_0, L_1, ..., L_{k-1}, L_{k-1}, ..., L_1, L_0 and Σ 2·L_g = S. A group's n_g = 2·L_g tokens,
  in *group order*, are its front chunk followed by its back chunk.
- **Token shards**: rank r of group g holds s_r consecutive tokens of the group order
  (Σ s_r = n_g); a shard may straddle the front/back boundary, then it has two global ranges.
- **Head ranges**: rank r holds the contiguous query heads [h_r, h_r + η_r) (Σ η_r = H) for
  all n_g tokens of its group during attention. With GQA the KV heads it needs are those its
  query heads map to (query head h uses KV head h // (H / H_kv)).
- **Replicas** (data parallelism): `Plan.replicas` cuts the groups into consecutive runs; replica
  i owns the next `Replica.groups` groups (its own ring: its chunks cover the whole sequence) and
  processes `Replica.sequences` sequences per step. `replicas == ()` is one replica of every group
  processing the workload's global batch. Global ranks run replica by replica, group by group.
- **Sharding**: one strategy for the whole plan (`Sharding`: what is sharded, over which devices).

Everything here is pure bookkeeping on integers; no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import PlanError, SpecError
from .planfile import SCHEMA_VERSION, ShardingScope, ShardingStage, parse_plan, plan_kwargs
from .rounding import even_split, largest_remainder
from .specs.files import parse_json, read_json, write_text_atomic
from .specs.identity import fingerprint_mismatch

if TYPE_CHECKING:  # pragma: no cover
    from .specs import ClusterSpec, ModelSpec, Workload


@dataclass(frozen=True)
class Group:
    """One HP group: its devices (in rank order), zigzag chunk length, token shards and head counts."""

    devices: tuple[int, ...]
    chunk_len: int
    shards: tuple[int, ...]
    heads: tuple[int, ...]

    def __post_init__(self) -> None:
        for key in ("devices", "shards", "heads"):
            object.__setattr__(self, key, tuple(int(x) for x in getattr(self, key)))
        object.__setattr__(self, "chunk_len", int(self.chunk_len))

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def tokens(self) -> int:
        """n_g: the group's tokens (front + back chunk)."""
        return 2 * self.chunk_len


@dataclass(frozen=True)
class RankLayout:
    """What one rank holds. Ranges are half-open [start, end) in global coordinates."""

    rank: int
    device: int
    group: int
    index_in_group: int
    token_ranges: tuple[tuple[int, int], ...]  # the rank's shard (1 or 2 ranges; empty if s_r = 0)
    group_token_ranges: tuple[tuple[int, int], tuple[int, int]]  # the group's front and back chunk
    shard_offset: int  # where the shard starts in the group order
    head_range: tuple[int, int]
    kv_head_range: tuple[int, int]  # KV heads its query heads touch (empty if no heads)

    @property
    def num_tokens(self) -> int:
        return sum(b - a for a, b in self.token_ranges)

    @property
    def heads(self) -> int:
        """η_r: the query heads this rank holds during attention (`Plan.heads[rank]`; `Plan.num_heads` is H)."""
        return self.head_range[1] - self.head_range[0]

    @property
    def kv_heads(self) -> int:
        """The KV heads its query heads touch."""
        return self.kv_head_range[1] - self.kv_head_range[0]

    def token_indices(self) -> list[int]:
        return [t for a, b in self.token_ranges for t in range(a, b)]


@dataclass(frozen=True)
class Replica:
    """One data-parallel replica: the next `groups` consecutive groups of the plan (in ring order)
    and the `sequences` it processes per step (gradient accumulation inside the replica)."""

    groups: int
    sequences: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", int(self.groups))
        object.__setattr__(self, "sequences", int(self.sequences))


@dataclass(frozen=True)
class Sharding:
    """The plan's parameter-sharding strategy: `stage` (what is sharded: replicated, zero1, zero2,
    zero3) over `scope` (all devices, or hybrid: inside each replica or each node, copies across).
    The default, ZeRO-3 over all devices, is the paper's setting."""

    stage: ShardingStage = ShardingStage.ZERO3
    scope: ShardingScope = ShardingScope.ALL

    def __post_init__(self) -> None:
        for key, kind in (("stage", ShardingStage), ("scope", ShardingScope)):
            value = getattr(self, key)
            try:
                object.__setattr__(self, key, kind(value))
            except ValueError:
                raise PlanError(
                    f"sharding {key} must be one of {', '.join(repr(str(x)) for x in kind)}, got {value!r}"
                ) from None

    @property
    def is_default(self) -> bool:
        """ZeRO-3 over all devices (what a version-1 plan file means)."""
        return self == Sharding()

    def describe(self) -> str:
        """In words: 'zero3 over all devices', 'zero2 inside each replica (hybrid)', 'replicated'."""
        if self.stage is ShardingStage.REPLICATED:
            return "replicated"
        where = {
            "all": "over all devices",
            "replica": "inside each replica (hybrid)",
            "node": "inside each node (hybrid)",
        }
        return f"{self.stage} {where[self.scope]}"


DEFAULT_SHARDING = Sharding()


def _cumsum(xs: Iterable[int]) -> list[int]:
    out, acc = [0], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


@dataclass(frozen=True)
class Plan:
    """An asymmetric CP x HP layout. The one object every part of HexiSeq speaks."""

    seq_len: int
    num_heads: int
    num_kv_heads: int
    groups: tuple[Group, ...]
    block_size: int = 128
    name: str = "plan"
    cluster: str = ""
    model: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    replicas: tuple[Replica, ...] = ()  # () = one replica of every group, processing the global batch
    sharding: Sharding = DEFAULT_SHARDING

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(g if isinstance(g, Group) else Group(**g) for g in self.groups))
        object.__setattr__(self, "replicas", tuple(r if isinstance(r, Replica) else Replica(*r) for r in self.replicas))
        if not isinstance(self.sharding, Sharding):
            object.__setattr__(self, "sharding", Sharding(*self.sharding))

    # ------------------------------------------------------------------ replicas
    @classmethod
    def joint(
        cls,
        replicas: Sequence[Plan],
        sequences: Sequence[int],
        sharding: Sharding = DEFAULT_SHARDING,
        name: str = "plan",
        meta: dict[str, Any] | None = None,
    ) -> Plan:
        """One plan of data-parallel replicas: replica i is `replicas[i]`'s groups (one-replica plans
        of the same sequence, model and cluster, on disjoint devices), processing `sequences[i]`."""
        if not replicas or len(replicas) != len(sequences):
            raise PlanError(f"a joint plan needs one sequence count per replica: {len(replicas)} replicas, {sequences}")
        first = replicas[0]
        for i, r in enumerate(replicas):
            if r.num_replicas != 1:
                raise PlanError(f"replica {i} of a joint plan is itself a plan of {r.num_replicas} replicas")
            if (r.seq_len, r.num_heads, r.num_kv_heads, r.block_size) != (
                first.seq_len,
                first.num_heads,
                first.num_kv_heads,
                first.block_size,
            ):
                raise PlanError(f"replica {i} is for another sequence or model than replica 0")
        return cls(
            first.seq_len,
            first.num_heads,
            first.num_kv_heads,
            tuple(g for r in replicas for g in r.groups),
            first.block_size,
            name,
            first.cluster,
            first.model,
            dict(meta or {}),
            tuple(Replica(r.num_groups, n) for r, n in zip(replicas, sequences)),
            sharding,
        )

    @property
    def num_replicas(self) -> int:
        return len(self.replicas) or 1

    @cached_property
    def _spans(self) -> tuple[tuple[int, int], ...]:
        """[first, end) group indices of each replica (the last one takes what is left, if any); kept:
        a frozen plan's shape never changes, and the planner asks for it millions of times."""
        if not self.replicas:
            return ((0, self.num_groups),)
        spans, start = [], 0
        for r in self.replicas:
            end = min(start + max(r.groups, 0), self.num_groups)
            spans.append((start, end))
            start = end
        return tuple(spans)

    @cached_property
    def _rank_starts(self) -> tuple[int, ...]:
        """The first global rank of each group, and the world size last."""
        return tuple(_cumsum(g.size for g in self.groups))

    def replica_groups(self, i: int) -> range:
        """Indices (into `groups`) of replica i's groups."""
        a, b = self._spans[i]
        return range(a, b)

    def replica_ranks(self, i: int) -> range:
        """Global ranks of replica i (ranks run replica by replica, group by group)."""
        a, b = self._spans[i]
        return range(self._rank_starts[a], self._rank_starts[b])

    def replica_of_group(self, g: int) -> int:
        """The replica that owns group g."""
        for i, (a, b) in enumerate(self._spans):
            if a <= g < b:
                return i
        raise PlanError(f"group {g} is in no replica of plan {self.name!r}")

    def replica(self, i: int) -> Plan:
        """Replica i as a one-replica plan: its groups, the same device indices, its ranks numbered
        from 0, the plan's sharding kept (a one-replica plan is its own replica 0)."""
        if not 0 <= i < self.num_replicas:
            raise PlanError(f"plan {self.name!r} has {self.num_replicas} replicas; no replica {i}")
        if not self.replicas:
            return self
        a, b = self._spans[i]
        return replace(
            self,
            groups=self.groups[a:b],
            name=self.name if len(self.replicas) == 1 else f"{self.name}.r{i}",
            replicas=(self.replicas[i],),
        )

    def sequences_of(self, global_batch: int) -> tuple[int, ...]:
        """Sequences per step of each replica: the replicas' own counts (which must sum to
        `global_batch`), or (global_batch,) for a plan without replicas."""
        if not self.replicas:
            return (int(global_batch),)
        seqs = tuple(r.sequences for r in self.replicas)
        if sum(seqs) != global_batch:
            raise PlanError(
                f"plan {self.name!r}: its replicas process {sum(seqs)} sequences per step ({list(seqs)}) "
                f"but the global batch is {global_batch}"
            )
        return seqs

    # ------------------------------------------------------------------ shape
    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def world_size(self) -> int:
        return self._rank_starts[-1]

    @cached_property
    def rank_devices(self) -> tuple[int, ...]:
        """Cluster device index of each rank."""
        return tuple(d for g in self.groups for d in g.devices)

    @property
    def group_of_rank(self) -> tuple[int, ...]:
        return tuple(gi for gi, g in enumerate(self.groups) for _ in g.devices)

    @property
    def group_sizes(self) -> tuple[int, ...]:
        return tuple(g.size for g in self.groups)

    def group_ranks(self, g: int) -> tuple[int, ...]:
        start = sum(x.size for x in self.groups[:g])
        return tuple(range(start, start + self.groups[g].size))

    @property
    def shards(self) -> tuple[int, ...]:
        """s_r for every rank."""
        return tuple(s for g in self.groups for s in g.shards)

    @property
    def heads(self) -> tuple[int, ...]:
        """η_r for every rank."""
        return tuple(h for g in self.groups for h in g.heads)

    def chunk_starts(self) -> list[tuple[int, int]]:
        """Global start of (front, back) chunk of every group (in its replica's sequence)."""
        out = []
        for a, b in self._spans:
            front = _cumsum([g.chunk_len for g in self.groups[a:b]])
            out.extend((front[i], self.seq_len - front[i + 1]) for i in range(b - a))
        return out

    # ------------------------------------------------------------------ layout
    def layout(self) -> list[RankLayout]:
        """Every rank's token ranges (in its replica's sequence) and head ranges (index = global rank)."""
        starts = self.chunk_starts()
        gq = self.num_heads // self.num_kv_heads if self.num_kv_heads else 1
        out: list[RankLayout] = []
        rank = 0
        for gi, g in enumerate(self.groups):
            L = g.chunk_len
            f0, b0 = starts[gi]
            group_ranges = ((f0, f0 + L), (b0, b0 + L))
            soff = _cumsum(g.shards)
            hoff = _cumsum(g.heads)
            for i, dev in enumerate(g.devices):
                a, b = soff[i], soff[i + 1]
                ranges = []
                if a < min(b, L):  # part in the front chunk
                    ranges.append((f0 + a, f0 + min(b, L)))
                if b > max(a, L):  # part in the back chunk
                    ranges.append((b0 + max(a, L) - L, b0 + b - L))
                h0, h1 = hoff[i], hoff[i + 1]
                kv = (h0 // gq, -(-h1 // gq)) if h1 > h0 else (0, 0)
                out.append(RankLayout(rank, dev, gi, i, tuple(ranges), group_ranges, a, (h0, h1), kv))
                rank += 1
        return out

    def group_positions(self, g: int) -> list[int]:
        """Global token positions of group g in group order (front chunk, then back chunk)."""
        f0, b0 = self.chunk_starts()[g]
        L = self.groups[g].chunk_len
        return list(range(f0, f0 + L)) + list(range(b0, b0 + L))

    # ------------------------------------------------------------------ checks
    def validate(
        self,
        cluster: ClusterSpec | None = None,
        model: ModelSpec | None = None,
        workload: Workload | None = None,
    ) -> list[str]:
        """Every violation, each with a precise message; empty when the plan is consistent."""
        v: list[str] = []
        H, Hkv = self.num_heads, self.num_kv_heads
        if self.seq_len <= 0:
            v.append(f"seq_len must be positive, got {self.seq_len}")
        if self.block_size <= 0:
            v.append(f"block_size must be positive, got {self.block_size}")
        if H <= 0 or Hkv <= 0:
            v.append(f"num_heads ({H}) and num_kv_heads ({Hkv}) must be positive")
        elif H % Hkv:
            v.append(f"num_heads ({H}) is not divisible by num_kv_heads ({Hkv})")
        if not self.groups:
            v.append("the plan has no groups")
        seen: dict[int, int] = {}
        for gi, g in enumerate(self.groups):
            where = f"group {gi}"
            if g.size == 0:
                v.append(f"{where} has no devices")
                continue
            if len(g.shards) != g.size or len(g.heads) != g.size:
                v.append(f"{where}: {g.size} devices but {len(g.shards)} shards and {len(g.heads)} head counts")
                continue
            if g.chunk_len <= 0:
                v.append(f"{where}: chunk_len must be positive, got {g.chunk_len}")
            elif self.block_size > 0 and g.chunk_len % self.block_size:
                v.append(
                    f"{where}: chunk_len {g.chunk_len} is not a multiple of block_size {self.block_size} "
                    f"(remainder {g.chunk_len % self.block_size})"
                )
            for i, d in enumerate(g.devices):
                if d in seen:
                    v.append(f"{where}: device {d} already appears in group {seen[d]}")
                seen[d] = gi
                if g.shards[i] < 0:
                    v.append(f"{where}, rank {self.group_ranks(gi)[i]} (device {d}): negative shard {g.shards[i]}")
                if g.heads[i] < 0:
                    v.append(f"{where}, rank {self.group_ranks(gi)[i]} (device {d}): negative head count {g.heads[i]}")
                if g.shards[i] == 0 and g.heads[i] == 0:
                    v.append(
                        f"{where}, rank {self.group_ranks(gi)[i]} (device {d}) has no tokens and no heads: "
                        "leave the device out"
                    )
            if sum(g.shards) != g.tokens:
                diff = sum(g.shards) - g.tokens
                v.append(
                    f"{where}: shards sum to {sum(g.shards)} but the group holds {g.tokens} tokens "
                    f"(2 x chunk_len {g.chunk_len}); {'over' if diff > 0 else 'short'} by {abs(diff)}"
                )
            if sum(g.heads) != H:
                diff = sum(g.heads) - H
                v.append(
                    f"{where}: head counts sum to {sum(g.heads)}, expected {H}; "
                    f"{'over' if diff > 0 else 'short'} by {abs(diff)}"
                )
        v.extend(self._replica_violations(workload))
        if cluster is not None:
            recorded = self.meta.get("cluster_fingerprint")
            differs = fingerprint_mismatch(recorded, cluster) if isinstance(recorded, Mapping) else None
            if differs:
                v.append(
                    f"plan {self.name!r} was made for another cluster than {cluster.name!r} ({differs}): its device "
                    "numbers mean other GPUs here; plan this cluster (hexiseq plan --cluster ...)"
                )
            for d in seen:
                if not 0 <= d < cluster.size:
                    v.append(f"device {d} is not in cluster {cluster.name!r} (devices 0..{cluster.size - 1})")
        if model is not None:
            if model.heads != H:
                v.append(f"plan has {H} heads but model {model.name!r} has {model.heads}")
            if model.kv_heads != Hkv:
                v.append(f"plan has {Hkv} KV heads but model {model.name!r} has {model.kv_heads}")
        if workload is not None and workload.seq_len != self.seq_len:
            v.append(f"plan is for seq_len {self.seq_len} but the workload has {workload.seq_len}")
        return v

    def _replica_violations(self, workload: Workload | None) -> list[str]:
        """The replica rules: runs of groups that cover the plan, each replica's chunks covering the
        sequence, positive sequence counts summing to the global batch; a sharding that means something."""
        v: list[str] = []
        many = len(self.replicas) > 1
        if self.replicas:
            held = sum(r.groups for r in self.replicas)
            if held != self.num_groups:
                v.append(f"replicas hold {held} groups but the plan has {self.num_groups}")
            for i, r in enumerate(self.replicas):
                if r.groups <= 0:
                    v.append(f"replica {i} must hold at least one group, got {r.groups}")
                if r.sequences <= 0:
                    v.append(f"replica {i} must process at least one sequence per step, got {r.sequences}")
            if workload is not None and sum(r.sequences for r in self.replicas) != workload.global_batch:
                total = sum(r.sequences for r in self.replicas)
                v.append(
                    f"replicas process {total} sequences per step "
                    f"({' + '.join(str(r.sequences) for r in self.replicas)}) but the workload's global batch is "
                    f"{workload.global_batch}"
                )
        for i, (a, b) in enumerate(self._spans):
            if a == b:
                continue
            total = sum(2 * g.chunk_len for g in self.groups[a:b])
            if total != self.seq_len:
                diff = total - self.seq_len
                v.append(
                    f"{f'replica {i}: ' if many else ''}chunks cover {total} tokens (2 x sum of chunk_len) "
                    f"but seq_len is {self.seq_len}; {'over' if diff > 0 else 'short'} by {abs(diff)}"
                )
        if self.sharding.stage is ShardingStage.REPLICATED and self.sharding.scope is not ShardingScope.ALL:
            v.append(f"sharding: replicated states have no scope; got scope {str(self.sharding.scope)!r} (use 'all')")
        return v

    def check(
        self, cluster: ClusterSpec | None = None, model: ModelSpec | None = None, workload: Workload | None = None
    ) -> Plan:
        """Raise PlanError listing every violation; return self when valid."""
        violations = self.validate(cluster, model, workload)
        if violations:
            raise PlanError(
                f"plan {self.name!r} is invalid ({len(violations)} problem{'s' * (len(violations) > 1)}):", violations
            )
        return self

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The plan file's JSON object: version 1 for a plan without replicas under the default
        sharding (today's files stay as they were), version 2 otherwise."""
        d = asdict(self)
        del d["replicas"], d["sharding"]
        groups = [
            {"devices": list(g.devices), "chunk_len": g.chunk_len, "shards": list(g.shards), "heads": list(g.heads)}
            for g in self.groups
        ]
        if not self.replicas and self.sharding.is_default:
            return {"schema_version": 1, **d, "groups": groups}
        del d["groups"]
        replicas: list[dict[str, Any]] = [
            {"groups": [groups[g] for g in self.replica_groups(i)], "sequences": r.sequences}
            for i, r in enumerate(self.replicas)
        ] or [{"groups": groups}]  # no replicas: one, processing the workload's global batch
        sharding = {"stage": str(self.sharding.stage), "scope": str(self.sharding.scope)}
        head = {k: d.pop(k) for k in ("seq_len", "num_heads", "num_kv_heads")}
        return {"schema_version": SCHEMA_VERSION, **head, "replicas": replicas, "sharding": sharding, **d}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "plan") -> Plan:
        """A Plan from its JSON object, checked against the plan file schema (planfile.py):
        PlanError naming each bad field by its path (`groups[1].chunk_len`)."""
        return cls(**plan_kwargs(parse_plan(d, where)))

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> Plan:
        return cls.from_dict(parse_json(text, where, PlanError), where)

    def save(self, path: Path | str) -> None:
        """Write the plan file whole (temporary file + rename: never a partial file)."""
        try:
            write_text_atomic(path, self.to_json() + "\n")
        except SpecError as e:
            raise PlanError(str(e)) from None

    @classmethod
    def load(cls, path: Path | str) -> Plan:
        return cls.from_dict(read_json(path, "plan file", PlanError), str(path))

    # ------------------------------------------------------------------ resizing
    def scaled(self, seq_len: int, block_size: int = 1) -> Plan:
        """The same groups, devices and head split over a shorter (or longer) sequence, with chunk
        lengths and token shards in the same proportions (largest-remainder rounding, at least one
        block per chunk). Used to check a production plan numerically on a small machine."""
        if block_size <= 0:
            raise PlanError(f"block_size must be positive, got {block_size}")
        if len(self.replicas) > 1:  # each replica's ring scaled on its own
            parts = [self.replica(i).scaled(seq_len, block_size) for i in range(self.num_replicas)]
            joint = Plan.joint(parts, [r.sequences for r in self.replicas], self.sharding, f"{self.name}@{seq_len}")
            return replace(joint, meta={**self.meta, "scaled_from": self.seq_len})
        k = self.num_groups
        blocks = seq_len // (2 * block_size)
        if seq_len % (2 * block_size) or blocks < k:
            raise PlanError(
                f"cannot scale plan {self.name!r} ({k} groups) to {seq_len} tokens with block_size {block_size}: "
                f"need a multiple of {2 * block_size} and at least {2 * k * block_size}"
            )
        chunk_blocks = largest_remainder([g.chunk_len for g in self.groups], blocks, minimum=1)
        groups = []
        for g, cb in zip(self.groups, chunk_blocks):
            n = 2 * cb * block_size
            # A rank that had tokens keeps at least one when the group has room (its code path stays exercised).
            shards = largest_remainder(
                list(g.shards), n, minimum=1 if n >= sum(1 for s in g.shards if s) else 0, skip_zero=True
            )
            groups.append(Group(g.devices, cb * block_size, tuple(shards), g.heads))
        plan = replace(
            self,
            seq_len=seq_len,
            groups=tuple(groups),
            block_size=block_size,
            name=f"{self.name}@{seq_len}",
            meta={**self.meta, "scaled_from": self.seq_len},
        )
        problems = plan.validate()
        if problems:
            raise PlanError(
                f"{seq_len} tokens are too few to keep the shape of plan {self.name!r}; use a longer sequence:",
                problems,
            )
        return plan

    # ------------------------------------------------------------------ display
    def describe(self) -> str:
        """A compact multi-line text of the allocation."""
        lines = [
            f"plan {self.name!r}: S={self.seq_len}, H={self.num_heads} (kv {self.num_kv_heads}), "
            f"{self.num_groups} groups, {self.world_size} ranks"
            + (f", {self.num_replicas} replicas" if len(self.replicas) > 1 else "")
            + ("" if self.sharding.is_default else f", sharding {self.sharding.describe()}")
        ]
        lay = self.layout()
        firsts = {a: i for i, (a, b) in enumerate(self._spans) if a < b and self.replicas}
        for gi, g in enumerate(self.groups):
            if gi in firsts:
                i = firsts[gi]
                rr = self.replica_ranks(i)
                lines.append(
                    f" replica {i}: {self.replicas[i].sequences} sequences per step, ranks {rr.start}..{rr.stop - 1}"
                )
            lines.append(f"  group {gi}: devices {list(g.devices)}, chunk_len {g.chunk_len} ({g.tokens} tokens)")
            for r in self.group_ranks(gi):
                rl = lay[r]
                lines.append(
                    f"    rank {r:>4} dev {rl.device:>4}: tokens {rl.num_tokens:>8} {list(rl.token_ranges)}  "
                    f"heads [{rl.head_range[0]},{rl.head_range[1]})"
                )
        return "\n".join(lines)


# ---------------------------------------------------------------------- symmetric layouts


def symmetric_plan(
    devices: Iterable[int],
    seq_len: int,
    num_heads: int,
    num_kv_heads: int,
    cp: int,
    hp: int,
    block_size: int = 128,
    name: str | None = None,
    cluster: str = "",
    model: str = "",
) -> Plan:
    """A USP/2D grid: `cp` groups of `hp` consecutive devices, even chunks, even shards, even heads.

    cp = N, hp = 1 is Ring attention (zigzag); cp = 1, hp = N is Ulysses.
    Raises PlanError when the sizes do not divide as a symmetric layout needs.
    """
    devs = list(devices)
    if cp <= 0 or hp <= 0 or cp * hp != len(devs):
        raise PlanError(f"symmetric layout cp={cp} x hp={hp} needs {cp * hp} devices, got {len(devs)}")
    if num_heads % hp:
        raise PlanError(f"symmetric layout: {num_heads} heads do not split evenly over hp={hp}")
    unit = 2 * cp * block_size
    if seq_len % unit:
        raise PlanError(f"symmetric layout: seq_len {seq_len} is not a multiple of 2 x cp x block_size = {unit}")
    L = seq_len // (2 * cp)
    groups = tuple(
        Group(tuple(devs[i * hp : (i + 1) * hp]), L, even_split(2 * L, hp), even_split(num_heads, hp))
        for i in range(cp)
    )
    label = name or ("ring" if hp == 1 else "ulysses" if cp == 1 else f"usp-{cp}x{hp}")
    return Plan(seq_len, num_heads, num_kv_heads, groups, block_size, label, cluster, model)


def ring_plan(
    devices: Iterable[int], seq_len: int, num_heads: int, num_kv_heads: int, block_size: int = 128, **kw: Any
) -> Plan:
    """Pure CP: every device its own group, even zigzag chunks."""
    devs = list(devices)
    return symmetric_plan(devs, seq_len, num_heads, num_kv_heads, cp=len(devs), hp=1, block_size=block_size, **kw)


def ulysses_plan(
    devices: Iterable[int], seq_len: int, num_heads: int, num_kv_heads: int, block_size: int = 128, **kw: Any
) -> Plan:
    """Pure HP: one group of all devices, even heads and shards."""
    devs = list(devices)
    return symmetric_plan(devs, seq_len, num_heads, num_kv_heads, cp=1, hp=len(devs), block_size=block_size, **kw)


def random_plan(
    world_size: int,
    seq_len: int,
    num_heads: int,
    num_kv_heads: int,
    seed: int = 0,
    block_size: int = 1,
    whole_kv_heads: bool = False,
    name: str | None = None,
) -> Plan:
    """A random valid uneven plan on devices 0..world_size-1 (for tests and `hexiseq verify`).

    Random group sizes and ring order, random chunk lengths (multiples of `block_size`, at least one
    block each), random token shards and head counts (some may be 0, never both for one rank).
    With `whole_kv_heads`, head counts are multiples of num_heads // num_kv_heads.
    """
    import random

    rng = random.Random(seed)
    if world_size <= 0:
        raise PlanError(f"world_size must be positive, got {world_size}")
    if block_size <= 0:
        raise PlanError(f"block_size must be positive, got {block_size}")
    devices = list(range(world_size))
    rng.shuffle(devices)
    sizes: list[int] = []
    left = world_size
    while left:
        s = rng.randint(1, left)
        sizes.append(s)
        left -= s
    k = len(sizes)
    blocks = seq_len // (2 * block_size)
    if seq_len % (2 * block_size) or blocks < k:
        raise PlanError(
            f"seq_len {seq_len} cannot hold {k} groups of whole blocks of {block_size} "
            f"(need a multiple of {2 * block_size}, >= {2 * k * block_size})"
        )
    cuts = sorted(rng.sample(range(1, blocks), k - 1))
    chunk_blocks = [b - a for a, b in zip([0] + cuts, cuts + [blocks])]
    unit = num_heads // num_kv_heads if whole_kv_heads else 1
    if num_heads % unit:
        raise PlanError(f"{num_heads} heads cannot be split in whole KV heads of {unit}")
    groups = []
    pos = 0
    for size, cb in zip(sizes, chunk_blocks):
        n = 2 * cb * block_size
        for _ in range(100):
            shards = _random_composition(rng, n, size)
            heads = [h * unit for h in _random_composition(rng, num_heads // unit, size)]
            if all(s or h for s, h in zip(shards, heads)):
                break
        else:  # fall back to even splits, always valid
            shards, heads = list(even_split(n, size)), [h * unit for h in even_split(num_heads // unit, size)]
        groups.append(Group(tuple(devices[pos : pos + size]), cb * block_size, tuple(shards), tuple(heads)))
        pos += size
    return Plan(seq_len, num_heads, num_kv_heads, tuple(groups), block_size, name or f"random-{seed}")


def _random_composition(rng: Any, total: int, parts: int) -> list[int]:
    """`total` as an ordered sum of `parts` non-negative integers, uniformly-ish at random."""
    cuts = sorted(rng.randint(0, total) for _ in range(parts - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]
