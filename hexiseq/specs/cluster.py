"""A cluster: its devices and the network between them (`data/clusters/*.yaml`).

Same node -> the node's GPU link; different nodes -> the slower of the two NICs; an explicit
per-pair override wins over both. The file format is `ClusterFile` (JSON Schema:
`hexiseq schema cluster`, committed in data/schemas/; prose: data/clusters/README.md).

Devices are plain frozen dataclasses built from the validated nodes (a 1024-GPU cluster builds
in about a millisecond); the cluster itself is compared and hashed by identity, so the cost model
can cache per cluster object.
"""

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field, TypeAdapter, ValidationInfo, WithJsonSchema, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from ..errors import SpecError
from .catalog import check_profile, get_gpu, gpu_catalog
from .files import data_path, read_yaml
from .gpus import GPUType
from .schema import (
    MAX_BANDWIDTH_GBPS,
    MAX_DEVICES,
    MAX_LATENCY_US,
    STRICT,
    KnownKeys,
    StrictStr,
    count,
    number,
    spec_class,
    validate,
)
from .slurm import SlurmSection

_BW_WHY = "10 TB/s per direction is more than any link; is the value in bytes/s or Gbit/s instead of GB/s?"
_SIZE_WHY = f"HexiSeq plans clusters of at most {MAX_DEVICES} GPUs"


def _gpu_by_name(value: Any, info: ValidationInfo) -> Any:
    """A GPU type given by its catalog name (the loader's catalog, else the bundled one)."""
    if isinstance(value, GPUType):
        return value
    catalog = (info.context or {}).get("catalog") if isinstance(info.context, Mapping) else None
    try:
        return get_gpu(value, catalog)
    except SpecError as e:
        raise PydanticCustomError("hexiseq", "{reason}", {"reason": str(e)}) from None


def _gpu_names(schema: dict[str, Any]) -> None:
    schema["enum"] = sorted(gpu_catalog())


GpuName = Annotated[
    GPUType,
    BeforeValidator(_gpu_by_name),
    WithJsonSchema({"type": "string", "description": "GPU model: a key of data/gpus.yaml"}),
    Field(json_schema_extra=_gpu_names),
]
NicGbps = number(
    "network bandwidth per GPU out of the node, per direction",
    unit="GB/s",
    gt=0,
    le=MAX_BANDWIDTH_GBPS,
    limit_why=_BW_WHY,
)
LinkGbps = number(
    "intra-node GPU link bandwidth per direction (overrides the GPU type's)",
    unit="GB/s",
    gt=0,
    le=MAX_BANDWIDTH_GBPS,
    limit_why=_BW_WHY,
)
LatencyUs = number("one-message latency", unit="us", gt=0, le=MAX_LATENCY_US)


@spec_class(lambda kw: "node")
@dataclass(frozen=True, config=STRICT)
class NodeSpec(KnownKeys):
    """One node: `count` GPUs of one type behind one NIC each."""

    gpu: GpuName
    count: count("GPUs in the node", le=MAX_DEVICES, limit_why=_SIZE_WHY)
    nic_gbps: NicGbps
    link_bandwidth_gbps: LinkGbps | None = None


@dataclass(frozen=True, config=STRICT)
class NodeEntry(NodeSpec):
    """A `nodes:` entry of a cluster file: a node, possibly standing for several identical ones."""

    repeat: count("how many identical nodes this entry stands for", le=MAX_DEVICES, limit_why=_SIZE_WHY) = 1


@spec_class(lambda kw: "link override")
@dataclass(frozen=True, config=STRICT)
class LinkOverride(KnownKeys):
    """An explicit link between devices `a` and `b` (both directions); wins over the derived one."""

    a: count("device index (devices are numbered in file order, node 0's GPUs first)", ge=0, le=MAX_DEVICES - 1)
    b: count("device index", ge=0, le=MAX_DEVICES - 1)
    bandwidth_gbps: number("bandwidth per direction", unit="GB/s", gt=0, le=MAX_BANDWIDTH_GBPS, limit_why=_BW_WHY)
    latency_us: LatencyUs | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Device:
    """One GPU of a cluster. `index` is its position in the cluster (plans refer to it)."""

    index: int
    gpu: GPUType
    node: int
    local_rank: int
    nic_gbps: float
    link_bandwidth_gbps: float

    @property
    def name(self) -> str:
        return f"n{self.node}.g{self.local_rank}"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.gpu.name})"


def _fail(reason: str) -> PydanticCustomError:
    return PydanticCustomError("hexiseq", "{reason}", {"reason": reason})


@spec_class(lambda kw: f"cluster {kw.get('name', '?')!r}")
@dataclass(frozen=True, eq=False, config=STRICT)
class ClusterSpec(KnownKeys):
    """Devices and the network between them. Build with `ClusterSpec.from_nodes` or `load_cluster`.
    `devices` (a tuple of Device) is derived from the nodes."""

    name: StrictStr
    nodes: Annotated[tuple[NodeSpec, ...], Field(min_length=1)]
    inter_node_latency_us: LatencyUs = 10.0
    overrides: tuple[LinkOverride, ...] = ()
    description: StrictStr = ""

    @model_validator(mode="after")
    def _build_devices(self) -> "ClusterSpec":
        total = sum(node.count for node in self.nodes)
        if total > MAX_DEVICES:
            raise _fail(
                f"its nodes hold {total} GPUs, above the limit of {MAX_DEVICES} ({_SIZE_WHY}); plan a part of it"
            )
        devices = []
        for n, node in enumerate(self.nodes):
            link = float(
                node.link_bandwidth_gbps if node.link_bandwidth_gbps is not None else node.gpu.link_bandwidth_gbps
            )
            nic = float(node.nic_gbps)
            first = len(devices)
            devices.extend([Device(first + i, node.gpu, n, i, nic, link) for i in range(node.count)])
        for k, o in enumerate(self.overrides):
            for end in (o.a, o.b):
                if end >= total:
                    raise _fail(f"overrides[{k}] names device {end}, but devices are 0..{total - 1}")
            if o.a == o.b:
                raise _fail(f"overrides[{k}] links device {o.a} to itself")
        object.__setattr__(self, "devices", tuple(devices))
        return self

    # ---- construction
    @classmethod
    def from_nodes(
        cls,
        name: str,
        nodes: Iterable[tuple[str, int, float] | NodeSpec],
        inter_node_latency_us: float = 10.0,
        overrides: Iterable[LinkOverride] = (),
        catalog: Mapping[str, GPUType] | None = None,
        description: str = "",
    ) -> "ClusterSpec":
        """Build in code: nodes as (gpu name, count, nic_gbps) tuples or NodeSpec."""
        specs = [
            node if isinstance(node, NodeSpec) else NodeSpec(get_gpu(node[0], catalog), *node[1:]) for node in nodes
        ]
        return cls(name, tuple(specs), inter_node_latency_us, tuple(overrides), description)

    # ---- basic facts
    @property
    def size(self) -> int:
        return len(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def gpu_types(self) -> dict[str, int]:
        """{GPU type name: count}, in order of first appearance."""
        out: dict[str, int] = {}
        for d in self.devices:
            out[d.gpu.name] = out.get(d.gpu.name, 0) + 1
        return out

    @property
    def node_devices(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for d in self.devices:
            out[d.node].append(d.index)
        return out

    @property
    def peak_pflops(self) -> float:
        return sum(d.gpu.peak_bf16_tflops for d in self.devices) / 1e3

    @property
    def memory_gib(self) -> float:
        return sum(d.gpu.memory_gib for d in self.devices)

    # ---- network
    @functools.cached_property
    def _matrices(self) -> tuple[np.ndarray, np.ndarray]:
        node = np.array([d.node for d in self.devices])
        nic = np.array([d.nic_gbps for d in self.devices])
        link = np.array([d.link_bandwidth_gbps for d in self.devices])
        lat_link = np.array([d.gpu.link_latency_us for d in self.devices])
        same = node[:, None] == node[None, :]
        bw = np.where(same, np.minimum(link[:, None], link[None, :]), np.minimum(nic[:, None], nic[None, :]))
        lat = np.where(same, np.maximum(lat_link[:, None], lat_link[None, :]), self.inter_node_latency_us)
        for o in self.overrides:
            bw[o.a, o.b] = bw[o.b, o.a] = o.bandwidth_gbps
            if o.latency_us is not None:
                lat[o.a, o.b] = lat[o.b, o.a] = o.latency_us
        np.fill_diagonal(bw, np.inf)
        np.fill_diagonal(lat, 0.0)
        bw.setflags(write=False)
        lat.setflags(write=False)
        return bw, lat

    @property
    def bandwidth_matrix_gbps(self) -> np.ndarray:
        """[N, N] GB/s per direction (inf on the diagonal)."""
        return self._matrices[0]

    @property
    def latency_matrix_s(self) -> np.ndarray:
        """[N, N] seconds."""
        return self._matrices[1] * 1e-6

    def bandwidth_gbps(self, a: int, b: int) -> float:
        """GB/s per direction between devices a and b."""
        self._check_index(a)
        self._check_index(b)
        return float(self._matrices[0][a, b])

    def latency_s(self, a: int, b: int) -> float:
        self._check_index(a)
        self._check_index(b)
        return float(self._matrices[1][a, b]) * 1e-6

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.size:
            raise SpecError(f"cluster {self.name!r} has devices 0..{self.size - 1}; got device {i}")

    def same_node(self, a: int, b: int) -> bool:
        return self.devices[a].node == self.devices[b].node

    def with_profile(self, profile: Mapping[str, Mapping[str, float]]) -> "ClusterSpec":
        """The same cluster with GPU efficiencies replaced by measured ones."""
        profile = check_profile(profile)
        new_nodes = []
        for node in self.nodes:
            fields = profile.get(node.gpu.name)
            new_nodes.append(dataclasses.replace(node, gpu=node.gpu.measured(fields)) if fields else node)
        return ClusterSpec(self.name, tuple(new_nodes), self.inter_node_latency_us, self.overrides, self.description)

    def summary(self) -> dict[str, Any]:
        """Devices per type, totals and a compact bandwidth summary (JSON-friendly)."""
        bw = self.bandwidth_matrix_gbps
        node = np.array([d.node for d in self.devices])
        same = (node[:, None] == node[None, :]) & ~np.eye(self.size, dtype=bool)
        cross = node[:, None] != node[None, :]
        types = {}
        for name, n in self.gpu_types.items():
            g = next(d.gpu for d in self.devices if d.gpu.name == name)
            types[name] = {
                "count": n,
                "peak_bf16_tflops": g.peak_bf16_tflops,
                "memory_gib": g.memory_gib,
                "link": f"{g.link_kind} {g.link_bandwidth_gbps:g} GB/s",
            }
        return {
            "name": self.name,
            "devices": self.size,
            "nodes": len(self.nodes),
            "types": types,
            "peak_pflops": round(self.peak_pflops, 3),
            "memory_gib": round(self.memory_gib, 1),
            "intra_node_gbps": sorted({float(x) for x in bw[same]}) if same.any() else [],
            "inter_node_gbps": sorted({float(x) for x in bw[cross]}) if cross.any() else [],
        }


# --------------------------------------------------------------------------- the file


@dataclass(frozen=True, config=STRICT)
class ClusterFile(KnownKeys):
    """A cluster YAML file (data/clusters/README.md). Devices are numbered in file order."""

    nodes: Annotated[list[NodeEntry], Field(min_length=1, description="the nodes, in device order")]
    name: Annotated[
        StrictStr | None, Field(description="cluster name (default: the file name without .yaml); plans record it")
    ] = None
    description: StrictStr = ""
    inter_node_latency_us: LatencyUs = 10.0
    overrides: Annotated[
        list[LinkOverride],
        Field(description="explicit links on device indices; they win over the derived value, both directions"),
    ] = dataclasses.field(default_factory=list)
    slurm: Annotated[
        SlurmSection | None, Field(description="partitions and job options for hexiseq launch --slurm")
    ] = None

    def to_spec(self, default_name: str) -> ClusterSpec:
        nodes: list[NodeSpec] = []
        for e in self.nodes:
            nodes.extend([NodeSpec(e.gpu, e.count, e.nic_gbps, e.link_bandwidth_gbps)] * e.repeat)
        return ClusterSpec(
            self.name or default_name, tuple(nodes), self.inter_node_latency_us, tuple(self.overrides), self.description
        )


_CLUSTER_FILE = TypeAdapter(ClusterFile)


def bundled_clusters() -> list[str]:
    """Names of the cluster files shipped in data/clusters/."""
    return sorted(x.stem for x in data_path("clusters").glob("*.yaml"))


def load_cluster(path: Path | str, catalog: Mapping[str, GPUType] | None = None) -> ClusterSpec:
    """Load a cluster YAML (see data/clusters/README.md). A bare name means a bundled file."""
    p = Path(path)
    if not p.suffix and not p.exists():
        p = data_path("clusters") / f"{path}.yaml"
    if not p.exists():
        raise SpecError(f"cluster file not found: {path}; bundled clusters: {', '.join(bundled_clusters())}")
    where = p.name if p.parent == data_path("clusters") else str(path)
    raw = read_yaml(p)
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise SpecError(
            f"{where}: a cluster file is a mapping with a 'nodes' list (data/clusters/README.md), got {got}"
        )
    spec = validate(_CLUSTER_FILE, raw, where, context={"catalog": catalog})
    try:
        return spec.to_spec(p.stem)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
