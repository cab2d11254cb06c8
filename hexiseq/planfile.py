"""The plan file: its strict schema (`PlanFile`, JSON Schema: `hexiseq schema plan`), reading and
writing. `Plan.from_dict / from_json / load / save` (plan.py) go through here.

The schema checks what each field *is* (integers that are integers, lists of integers, sizes
within the project's limits, a known recompute policy) and names the field by its path
(`groups[1].chunk_len`). Whether the numbers *fit together* (shards summing to the group's tokens,
heads to the model's, chunks to the sequence) is `Plan.validate`'s job, against the cluster,
model and workload the plan is used with.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass

from .errors import PlanError
from .specs.schema import (
    MAX_BLOCK_SIZE,
    MAX_DEVICES,
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

SCHEMA_VERSION = 1

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
class PlanFile(KnownKeys):
    """A plan file (`hexiseq plan --out`): an asymmetric CP x HP layout for one sequence."""

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


_PLAN_FILE = TypeAdapter(PlanFile)


def parse_plan(d: Any, where: str = "plan") -> PlanFile:
    """A plan dict checked against the schema; PlanError listing every problem by field path."""
    if not isinstance(d, dict):
        raise PlanError(f"{where} must be a JSON object, got {type(d).__name__}")
    version = d.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise PlanError(f"{where} has schema_version {version!r}; this HexiSeq reads schema_version {SCHEMA_VERSION}")
    return validate(_PLAN_FILE, d, where, error=PlanError)


def plan_kwargs(f: PlanFile) -> dict[str, Any]:
    """Keyword arguments of `Plan(...)` from a checked plan file (groups as dicts of tuples)."""
    return {
        "seq_len": f.seq_len,
        "num_heads": f.num_heads,
        "num_kv_heads": f.num_kv_heads,
        "groups": tuple(
            {"devices": tuple(g.devices), "chunk_len": g.chunk_len, "shards": tuple(g.shards), "heads": tuple(g.heads)}
            for g in f.groups
        ),
        "block_size": f.block_size,
        "name": f.name,
        "cluster": f.cluster,
        "model": f.model,
        "meta": {k: v for k, v in f.meta.model_dump().items() if not (k == "recompute" and v is None)},
    }


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of plan files."""
    return _PLAN_FILE.json_schema()
