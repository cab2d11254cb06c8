"""The plan file: its strict schema (`PlanFile`, JSON Schema: `hexiseq schema plan`), reading and
writing. `Plan.from_dict / from_json / load / save` (plan.py) go through here.

Two versions are read. Version 1 (`groups` at the top level) is one replica of every group under
ZeRO-3 over all devices: HexiSeq writes it for such plans, so today's files stay as they are.
Version 2 holds `replicas` (each its own groups and sequences per step) and a `sharding` strategy.

The schema checks what each field *is* (integers that are integers, lists of integers, sizes
within the project's limits, a known recompute policy) and names the field by its path
(`groups[1].chunk_len`). Whether the numbers *fit together* (shards summing to the group's tokens,
heads to the model's, chunks to the sequence) is `Plan.validate`'s job, against the cluster,
model and workload the plan is used with.
"""

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass

from .errors import PlanError
from .specs.schema import (
    MAX_BLOCK_SIZE,
    MAX_DEVICES,
    MAX_GLOBAL_BATCH,
    MAX_HEADS,
    MAX_SEQ_LEN,
    STRICT,
    KnownKeys,
    StrictStr,
    count,
    one_of,
    validate,
)
from .specs.workload import RECOMPUTE_POLICIES

SCHEMA_VERSION = 2  # the newest version; plans of one replica under ZeRO-3 over all devices are written as 1
READ_VERSIONS = (1, 2)


class ShardingStage(StrEnum):
    """What of the training state is sharded over the devices (the rest is replicated).
    A `str` enum: `stage == "zero3"` keeps working."""

    REPLICATED = "replicated"  # every device holds parameters, gradients and optimizer states; gradients all-reduced
    ZERO1 = "zero1"  # optimizer states sharded; gradients all-reduced, parameters all-gathered after the update
    ZERO2 = "zero2"  # gradients too: reduce-scattered; parameters gathered once per step, kept across micro-steps
    ZERO3 = "zero3"  # parameters too: re-gathered every micro-step, layer by layer (FSDP)


class ShardingScope(StrEnum):
    """Over which devices a sharded state is split (replicated across the rest: hybrid, HSDP)."""

    ALL = "all"  # every device of the plan
    REPLICA = "replica"  # the devices of one replica; replicas hold copies
    NODE = "node"  # the plan's devices of one node; nodes hold copies


DeviceIndex = count("cluster device index (file order of the cluster the plan was made for)", ge=0, le=MAX_DEVICES - 1)
Tokens = count(
    "tokens of this rank, consecutive in the group order (front chunk, then back chunk)", ge=0, le=MAX_SEQ_LEN
)
Heads = count("query heads of this rank, a contiguous range", ge=0, le=MAX_HEADS)


@dataclass(frozen=True, config=STRICT)
class GroupFile(KnownKeys):
    """One HP group of a plan file, in ring order."""

    devices: Annotated[list[DeviceIndex], Field(min_length=1, description="its devices, in rank order")]
    chunk_len: count(
        "length of each of the group's two zigzag chunks (a multiple of block_size)", unit="tokens", le=MAX_SEQ_LEN
    )
    shards: Annotated[
        list[Tokens], Field(description="s_r per rank: tokens held outside attention (sum = 2 x chunk_len)")
    ]
    heads: Annotated[
        list[Heads], Field(description="η_r per rank: query heads held during attention (sum = num_heads)")
    ]


class PlanMeta(BaseModel):
    """Free-form notes of the planner (kept as they are), with the keys HexiSeq reads checked."""

    model_config = ConfigDict(extra="allow", frozen=True)

    recompute: (
        one_of(RECOMPUTE_POLICIES, "the recompute policy the plan was made for (hexiseq plan writes it)") | None
    ) = None


@dataclass(frozen=True, config=STRICT)
class ReplicaFile(KnownKeys):
    """One data-parallel replica of a version-2 plan file: its own ring of groups over the whole sequence."""

    groups: Annotated[list[GroupFile], Field(min_length=1, description="the replica's HP groups in ring order")]
    sequences: (
        count("sequences this replica processes per step (the replicas' sum is the global batch)", le=MAX_GLOBAL_BATCH)
        | None
    ) = None  # absent: a lone replica processing the workload's global batch


@dataclass(frozen=True, config=STRICT)
class ShardingFile(KnownKeys):
    """The plan's parameter-sharding strategy."""

    stage: one_of(tuple(ShardingStage), "replicated | zero1 | zero2 | zero3: what is sharded")
    scope: one_of(tuple(ShardingScope), "all | replica | node: over which devices (hybrid: copies across)") = "all"


@dataclass(frozen=True, config=STRICT)
class PlanFile(KnownKeys):
    """A version-1 plan file (`hexiseq plan --out`): an asymmetric CP x HP layout for one sequence,
    one replica of every group under ZeRO-3 over all devices."""

    schema_version: Literal[1]
    seq_len: count("tokens of the sequence (S)", le=MAX_SEQ_LEN)
    num_heads: count("query heads of the model (H)", le=MAX_HEADS)
    num_kv_heads: count("key/value heads of the model", le=MAX_HEADS)
    groups: Annotated[list[GroupFile], Field(min_length=1, description="HP groups in ring order")]
    block_size: count("chunk alignment", unit="tokens", le=MAX_BLOCK_SIZE) = 128
    name: StrictStr = "plan"
    cluster: Annotated[
        StrictStr, Field(description="name of the cluster the plan was made for (device indices refer to it)")
    ] = ""
    model: StrictStr = ""
    meta: PlanMeta = Field(default_factory=PlanMeta)


@dataclass(frozen=True, config=STRICT)
class PlanFileV2(KnownKeys):
    """A version-2 plan file: data-parallel replicas (disjoint devices, each an asymmetric CP x HP
    layout of the whole sequence and its sequences per step) and one parameter-sharding strategy."""

    schema_version: Literal[2]
    seq_len: count("tokens of the sequence (S)", le=MAX_SEQ_LEN)
    num_heads: count("query heads of the model (H)", le=MAX_HEADS)
    num_kv_heads: count("key/value heads of the model", le=MAX_HEADS)
    replicas: Annotated[list[ReplicaFile], Field(min_length=1, description="data-parallel replicas, in rank order")]
    sharding: ShardingFile = Field(default_factory=lambda: ShardingFile(stage="zero3"))
    block_size: count("chunk alignment", unit="tokens", le=MAX_BLOCK_SIZE) = 128
    name: StrictStr = "plan"
    cluster: Annotated[
        StrictStr, Field(description="name of the cluster the plan was made for (device indices refer to it)")
    ] = ""
    model: StrictStr = ""
    meta: PlanMeta = Field(default_factory=PlanMeta)


_PLAN_FILES = {1: TypeAdapter(PlanFile), 2: TypeAdapter(PlanFileV2)}


def parse_plan(d: Any, where: str = "plan") -> PlanFile | PlanFileV2:
    """A plan dict checked against the schema of its version; PlanError listing every problem by field path."""
    if not isinstance(d, dict):
        raise PlanError(f"{where} must be a JSON object, got {type(d).__name__}")
    version = d.get("schema_version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        raise PlanError(
            f"{where} has schema_version {version!r}; this HexiSeq reads schema_version "
            f"{' and '.join(str(v) for v in READ_VERSIONS)}"
        )
    if version == 2 and "groups" in d:
        raise PlanError(
            f"{where}: a schema_version 2 file holds its groups inside replicas "
            '([{"groups": [...], "sequences": n}, ...]); top-level groups are version 1'
        )
    return validate(_PLAN_FILES[version], d, where, error=PlanError)


def _group_kwargs(groups: list[GroupFile]) -> list[dict[str, Any]]:
    return [
        {"devices": tuple(g.devices), "chunk_len": g.chunk_len, "shards": tuple(g.shards), "heads": tuple(g.heads)}
        for g in groups
    ]


def plan_kwargs(f: PlanFile | PlanFileV2) -> dict[str, Any]:
    """Keyword arguments of `Plan(...)` from a checked plan file: groups as dicts of tuples; for
    version 2 also `replicas` as (groups, sequences) pairs and `sharding` as (stage, scope)."""
    if isinstance(f, PlanFileV2):
        groups = [g for r in f.replicas for g in _group_kwargs(r.groups)]
        lone = len(f.replicas) == 1 and f.replicas[0].sequences is None
        missing = [i for i, r in enumerate(f.replicas) if r.sequences is None]
        if missing and not lone:
            raise PlanError(
                f"replicas[{missing[0]}].sequences is missing: every replica of a plan of {len(f.replicas)} "
                "replicas says how many sequences it processes per step"
            )
        extra: dict[str, Any] = {
            "replicas": () if lone else tuple((len(r.groups), r.sequences) for r in f.replicas),
            "sharding": (ShardingStage(f.sharding.stage), ShardingScope(f.sharding.scope)),
        }
    else:
        groups, extra = _group_kwargs(f.groups), {}
    return {
        "seq_len": f.seq_len,
        "num_heads": f.num_heads,
        "num_kv_heads": f.num_kv_heads,
        "groups": tuple(groups),
        "block_size": f.block_size,
        "name": f.name,
        "cluster": f.cluster,
        "model": f.model,
        "meta": {k: v for k, v in f.meta.model_dump().items() if not (k == "recompute" and v is None)},
        **extra,
    }


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of plan files: version 1 or version 2 (told apart by `schema_version`)."""
    return TypeAdapter(PlanFile | PlanFileV2).json_schema()
