"""Typed descriptions of the hardware, the model and the workload.

Units are in the field names: `_gbps` is GB/s (1e9 bytes per second, per direction),
`_gib` is GiB (2**30 bytes), `_tflops` is 1e12 FLOP/s, `_us` microseconds, `_s` seconds.

- `GPUType`: one GPU model from `data/gpus.yaml` (peak, memory, links, default efficiencies).
- `Device`: one GPU in a cluster (its type, node, NIC).
- `ClusterSpec`: the devices plus the bandwidth/latency between any two of them:
  same node -> the node's GPU link; different nodes -> the slower of the two NICs;
  an explicit per-pair override wins over both.
- `ModelSpec`: a decoder-only transformer; parameter count and FLOPs per token.
- `Workload`: what one training iteration processes and how (sequence length, batch,
  recompute, parameter sharding).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import yaml

from .errors import SpecError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GIB = 2**30
GB = 1e9


def _data_path(name: str) -> Path:
    """Bundled data lives in `data/` next to the package (source checkout)."""
    return DATA_DIR / name


def _load_yaml(path: Path | str) -> Any:
    path = Path(path)
    if not path.exists():
        raise SpecError(f"file not found: {path}")
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from None


def _positive(owner: str, **values: float) -> None:
    for key, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v <= 0:
            raise SpecError(f"{owner}: {key} must be a positive number, got {v!r}")


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GPUType:
    """One GPU model. Efficiencies are fractions of peak reached by training kernels."""

    name: str
    peak_bf16_tflops: float
    memory_gib: float
    hbm_bandwidth_gbps: float
    link_kind: str
    link_bandwidth_gbps: float
    link_latency_us: float = 3.0
    eff_matmul: float = 0.6
    eff_attention: float = 0.5
    # Citation key (data/validation/sources.yaml) per numeric field; read, not used in any computation.
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        _positive(
            f"GPU type {self.name!r}",
            peak_bf16_tflops=self.peak_bf16_tflops,
            memory_gib=self.memory_gib,
            hbm_bandwidth_gbps=self.hbm_bandwidth_gbps,
            link_bandwidth_gbps=self.link_bandwidth_gbps,
            link_latency_us=self.link_latency_us,
        )
        for key in ("eff_matmul", "eff_attention"):
            v = getattr(self, key)
            if not (0 < v <= 1):
                raise SpecError(f"GPU type {self.name!r}: {key} must be in (0, 1], got {v!r}")

    @property
    def matmul_flops(self) -> float:
        """Effective FLOP/s of the linear layers."""
        return self.peak_bf16_tflops * 1e12 * self.eff_matmul

    @property
    def attention_flops(self) -> float:
        """Effective FLOP/s of the attention kernel."""
        return self.peak_bf16_tflops * 1e12 * self.eff_attention

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


def _load_catalog(path: Path | str, cls: type, kind: str, float_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """{name: cls(name=name, **fields)} from a YAML mapping, with one clear error per bad entry."""
    raw = _load_yaml(path)
    if not isinstance(raw, dict) or not raw:
        raise SpecError(f"{path}: expected a mapping of {kind} name -> fields")
    known = {f for f in cls.__dataclass_fields__ if f != "name"}
    out = {}
    for name, fields in raw.items():
        fields = dict(fields or {})
        unknown = set(fields) - known
        if unknown:
            raise SpecError(f"{kind} {name!r}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        # PyYAML reads "3.21e9" (no sign in the exponent) as a string: coerce the float fields.
        for key in float_keys:
            if isinstance(fields.get(key), str):
                try:
                    fields[key] = float(fields[key])
                except ValueError:
                    raise SpecError(f"{kind} {name!r}: {key} must be a number, got {fields[key]!r}") from None
        try:
            out[name] = cls(name=name, **fields)
        except TypeError as e:
            raise SpecError(f"{kind} {name!r}: {e}") from None
    return out


def load_gpu_catalog(path: Path | str | None = None) -> dict[str, GPUType]:
    """Read `data/gpus.yaml` (or another catalog) into {name: GPUType}."""
    return _load_catalog(path or _data_path("gpus.yaml"), GPUType, "GPU type")


@functools.lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GPUType]:
    """The bundled GPU catalog (cached)."""
    return load_gpu_catalog()


def get_gpu(name: str, catalog: Mapping[str, GPUType] | None = None) -> GPUType:
    catalog = catalog if catalog is not None else gpu_catalog()
    if name not in catalog:
        raise SpecError(f"unknown GPU type {name!r}; known types: {', '.join(sorted(catalog))}")
    return catalog[name]


def apply_profile(catalog: Mapping[str, GPUType], profile: Mapping[str, Mapping[str, float]]) -> dict[str, GPUType]:
    """Override catalog efficiencies with measured ones: {gpu: {eff_matmul: .., eff_attention: ..}}."""
    out = dict(catalog)
    for name, fields in check_profile(profile).items():
        out[name] = replace(get_gpu(name, catalog), **fields)
    return out


PROFILE_KEYS = ("eff_matmul", "eff_attention")


def check_profile(profile: Any, where: str = "profile") -> dict[str, dict[str, float]]:
    """`profile` when it is {gpu name: {eff_matmul / eff_attention: number}}; else a SpecError.
    (The range of the numbers is checked by GPUType when a profile is applied.)"""
    if not isinstance(profile, Mapping):
        raise SpecError(f"{where}: 'gpus' must map GPU names to {{eff_matmul: x, eff_attention: y}}, got {profile!r}")
    for name, fields in profile.items():
        if not isinstance(fields, Mapping):
            raise SpecError(f"{where}: entry {name!r} must be a mapping of eff_matmul / eff_attention, got {fields!r}")
        bad = set(fields) - set(PROFILE_KEYS)
        if bad:
            raise SpecError(f"{where}: entry {name!r}: only eff_matmul / eff_attention can be overridden, got {sorted(bad)}")
        for key, v in fields.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise SpecError(f"{where}: entry {name!r}: {key} must be a number, got {v!r}")
    return dict(profile)


def load_profile(path: Path | str) -> dict[str, dict[str, float]]:
    """A profile file: `gpus: {NAME: {eff_matmul: x, eff_attention: y}}` (other keys are notes)."""
    raw = _load_yaml(path)
    if not isinstance(raw, dict) or "gpus" not in raw:
        raise SpecError(f"{path}: a profile needs a top-level 'gpus' mapping")
    return check_profile(raw["gpus"], str(path))


# --------------------------------------------------------------------------- clusters


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class NodeSpec:
    gpu: GPUType
    count: int
    nic_gbps: float
    link_bandwidth_gbps: float | None = None


@dataclass(frozen=True)
class LinkOverride:
    a: int
    b: int
    bandwidth_gbps: float
    latency_us: float | None = None


@dataclass(frozen=True, eq=False)
class ClusterSpec:
    """Devices and the network between them. Build with `ClusterSpec.from_nodes` or `load_cluster`."""

    name: str
    nodes: tuple[NodeSpec, ...]
    inter_node_latency_us: float = 10.0
    overrides: tuple[LinkOverride, ...] = ()
    description: str = ""
    devices: tuple[Device, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SpecError(f"cluster {self.name!r} has no nodes")
        _positive(f"cluster {self.name!r}", inter_node_latency_us=self.inter_node_latency_us)
        devices = []
        for n, node in enumerate(self.nodes):
            if not isinstance(node.count, int) or node.count <= 0:
                raise SpecError(f"cluster {self.name!r}, node {n}: count must be a positive integer, got {node.count!r}")
            _positive(f"cluster {self.name!r}, node {n} ({node.gpu.name})", nic_gbps=node.nic_gbps)
            link = node.link_bandwidth_gbps if node.link_bandwidth_gbps is not None else node.gpu.link_bandwidth_gbps
            _positive(f"cluster {self.name!r}, node {n} ({node.gpu.name})", link_bandwidth_gbps=link)
            for i in range(node.count):
                devices.append(Device(len(devices), node.gpu, n, i, float(node.nic_gbps), float(link)))
        object.__setattr__(self, "devices", tuple(devices))
        for o in self.overrides:
            for end in (o.a, o.b):
                if not 0 <= end < len(devices):
                    raise SpecError(f"cluster {self.name!r}: override names device {end}, but devices are 0..{len(devices) - 1}")
            if o.a == o.b:
                raise SpecError(f"cluster {self.name!r}: override from device {o.a} to itself")
            _positive(f"cluster {self.name!r}, override {o.a}<->{o.b}", bandwidth_gbps=o.bandwidth_gbps)
            if o.latency_us is not None:
                _positive(f"cluster {self.name!r}, override {o.a}<->{o.b}", latency_us=o.latency_us)

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
        specs = []
        for node in nodes:
            if isinstance(node, NodeSpec):
                specs.append(node)
            else:
                gpu, count, nic = node
                specs.append(NodeSpec(get_gpu(gpu, catalog), count, nic))
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
        n = self.size
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
        del n
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
            new_nodes.append(replace(node, gpu=replace(node.gpu, **fields)) if fields else node)
        return ClusterSpec(self.name, tuple(new_nodes), self.inter_node_latency_us, self.overrides, self.description)

    def summary(self) -> dict[str, Any]:
        """Devices per type, totals and a compact bandwidth summary (JSON-friendly)."""
        bw = self.bandwidth_matrix_gbps
        node = np.array([d.node for d in self.devices])
        same = (node[:, None] == node[None, :]) & ~np.eye(self.size, dtype=bool)
        cross = node[:, None] != node[None, :]
        types = {}
        for name, count in self.gpu_types.items():
            g = next(d.gpu for d in self.devices if d.gpu.name == name)
            types[name] = {
                "count": count,
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


def load_cluster(path: Path | str, catalog: Mapping[str, GPUType] | None = None) -> ClusterSpec:
    """Load a cluster YAML (see data/clusters/README.md). A bare name means a bundled file."""
    p = Path(path)
    if not p.suffix and not p.exists():
        p = _data_path("clusters") / f"{path}.yaml"
    if not p.exists():
        bundled = sorted(x.stem for x in (_data_path("clusters")).glob("*.yaml"))
        raise SpecError(f"cluster file not found: {path}; bundled clusters: {', '.join(bundled)}")
    raw = _load_yaml(p)
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise SpecError(f"{p}: a cluster file needs a 'nodes' list")
    unknown = set(raw) - {"name", "description", "inter_node_latency_us", "nodes", "overrides"}
    if unknown:  # a misspelt key would otherwise be ignored without a word
        raise SpecError(f"{p.name}: unknown top-level keys {sorted(unknown)} (known: name, description, "
                        f"inter_node_latency_us, nodes, overrides)")
    nodes = []
    for n, entry in enumerate(raw["nodes"]):
        where = f"{p.name}: nodes[{n}]"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: expected a mapping with gpu, count, nic_gbps")
        missing = {"gpu", "count", "nic_gbps"} - set(entry)
        if missing:
            raise SpecError(f"{where}: missing {sorted(missing)}")
        unknown = set(entry) - {"gpu", "count", "nic_gbps", "repeat", "link_bandwidth_gbps"}
        if unknown:
            raise SpecError(f"{where}: unknown keys {sorted(unknown)}")
        try:
            gpu = get_gpu(entry["gpu"], catalog)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
        repeat = entry.get("repeat", 1)
        if not isinstance(repeat, int) or repeat <= 0:
            raise SpecError(f"{where}: repeat must be a positive integer, got {repeat!r}")
        nodes.extend([NodeSpec(gpu, entry["count"], entry["nic_gbps"], entry.get("link_bandwidth_gbps"))] * repeat)
    overrides = []
    if not isinstance(raw.get("overrides") or [], list):
        raise SpecError(f"{p.name}: overrides must be a list of {{a, b, bandwidth_gbps, latency_us}}")
    for o in raw.get("overrides") or []:
        try:
            overrides.append(LinkOverride(int(o["a"]), int(o["b"]), o["bandwidth_gbps"], o.get("latency_us")))
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"{p.name}: override {o!r} needs a, b, bandwidth_gbps ({e})") from None
    return ClusterSpec(
        name=str(raw.get("name", p.stem)),
        nodes=tuple(nodes),
        inter_node_latency_us=raw.get("inter_node_latency_us", 10.0),
        overrides=tuple(overrides),
        description=str(raw.get("description", "")),
    )


def bundled_clusters() -> list[str]:
    return sorted(x.stem for x in _data_path("clusters").glob("*.yaml"))


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (Llama: SwiGLU + RMSNorm + RoPE + GQA; GPT: GELU + LayerNorm, biases)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    head_dim: int = 0  # 0 -> hidden // heads
    published_params: float | None = None

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"model {self.name!r}: {key} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise SpecError(
                f"model {self.name!r}: heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads}); "
                f"{self.heads} % {self.kv_heads} = {self.heads % self.kv_heads}"
            )
        if self.mlp not in ("swiglu", "gelu"):
            raise SpecError(f"model {self.name!r}: mlp must be 'swiglu' or 'gelu', got {self.mlp!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise SpecError(f"model {self.name!r}: norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise SpecError(f"model {self.name!r}: hidden ({self.hidden}) not divisible by heads ({self.heads}); give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads

    @property
    def has_bias(self) -> bool:
        return self.mlp == "gelu"  # GPT-style blocks carry biases

    # ---- parameters
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        bias = ((self.heads + 2 * self.kv_heads) * self.head_dim + self.hidden) if self.has_bias else 0
        return q + kv + o + bias

    @property
    def mlp_params_per_layer(self) -> int:
        mats = 3 if self.mlp == "swiglu" else 2
        bias = (self.ffn + self.hidden) if self.has_bias else 0
        return mats * self.hidden * self.ffn + bias

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def param_count(self) -> int:
        """All parameters (embeddings, layers, final norm, LM head unless tied)."""
        return self.embedding_params + self.layers * self.params_per_layer + self.norm_params + self.lm_head_params

    # ---- FLOPs (forward; a multiply-add is 2 FLOPs; backward = 2x forward)
    @property
    def linear_flops_per_token_per_layer(self) -> float:
        """Forward FLOPs per token of one layer's matmuls (QKV, O, MLP); norms/activations ignored."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mats = 3 if self.mlp == "swiglu" else 2
        return 2.0 * (q + kv + o + mats * self.hidden * self.ffn)

    @property
    def lm_head_flops_per_token(self) -> float:
        """Forward FLOPs per token of the LM head (the logits matmul)."""
        return 2.0 * self.vocab * self.hidden

    @property
    def linear_flops_per_token(self) -> float:
        """Forward FLOPs per token of every matmul of the model (all layers + LM head)."""
        return self.layers * self.linear_flops_per_token_per_layer + self.lm_head_flops_per_token

    @property
    def attention_flops_per_pair(self) -> float:
        """Forward FLOPs of one query-key pair for one head in one layer: QK^T and PV, 2*d each."""
        return 4.0 * self.head_dim

    def causal_pairs(self, seq_len: int) -> int:
        """Query-key pairs per head of causal attention over a sequence: S(S+1)/2."""
        return seq_len * (seq_len + 1) // 2

    def forward_flops(self, seq_len: int) -> float:
        """Forward FLOPs of one sequence: matmuls on every token + causal attention in every layer."""
        return seq_len * self.linear_flops_per_token + self.layers * self.heads * self.attention_flops_per_pair * self.causal_pairs(seq_len)

    def training_flops(self, seq_len: int) -> float:
        """Useful FLOPs of forward + backward of one sequence (3x forward; recompute not counted)."""
        return 3.0 * self.forward_flops(seq_len)

    def state_bytes(self) -> dict[str, float]:
        """Bytes of model states for mixed-precision AdamW: bf16 weights and grads, fp32 master + 2 moments."""
        p = self.param_count
        return {"weights_bf16": 2.0 * p, "grads_bf16": 2.0 * p, "master_fp32": 4.0 * p, "adam_fp32": 8.0 * p}


def load_model_catalog(path: Path | str | None = None) -> dict[str, ModelSpec]:
    """Read `data/models.yaml` (or another catalog) into {name: ModelSpec}."""
    return _load_catalog(path or _data_path("models.yaml"), ModelSpec, "model", ("published_params", "rope_theta"))


@functools.lru_cache(maxsize=1)
def model_catalog() -> dict[str, ModelSpec]:
    """The bundled model catalog (cached)."""
    return load_model_catalog()


def get_model(name: str) -> ModelSpec:
    """A bundled model by name, or a ModelSpec from a Hugging Face config.json path."""
    catalog = model_catalog()
    if name in catalog:
        return catalog[name]
    p = Path(name)
    if p.suffix == ".json" and p.exists():
        return model_from_hf_config(p)
    raise SpecError(f"unknown model {name!r}; known models: {', '.join(catalog)} (or a path to a Hugging Face config.json)")


def model_from_hf_config(path_or_dict: Path | str | Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face Llama `config.json` (path or already-parsed dict)."""
    if isinstance(path_or_dict, Mapping):
        cfg, default_name = dict(path_or_dict), "hf-model"
    else:
        p = Path(path_or_dict)
        cfg, default_name = read_hf_config(p), (p if p.is_dir() else p.parent).name or "hf-model"
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelSpec(
            name=name or cfg.get("_name_or_path") or default_name,
            layers=int(cfg["num_hidden_layers"]),
            hidden=int(cfg["hidden_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            ffn=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            mlp="swiglu",
            norm="rmsnorm",
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # transformers 5 nests rope_theta inside rope_parameters; older configs keep it top-level.
            rope_theta=float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))),
            head_dim=int(cfg.get("head_dim") or 0),
        )
    except KeyError as e:
        raise SpecError(f"Hugging Face config lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, SpecError):  # ModelSpec's own checks
            raise
        raise SpecError(f"Hugging Face config has a malformed value: {e}") from None


def read_hf_config(path: Path | str) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint directory (or the file itself)."""
    import json

    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    if not p.exists():
        raise SpecError(f"Hugging Face config not found: {p}")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{p}: a Hugging Face config is a JSON object, got {type(cfg).__name__}")
    return cfg


# --------------------------------------------------------------------------- workload


RECOMPUTE_POLICIES = ("none", "selective", "full")  # in order of increasing recompute time, decreasing memory


def recompute_policy(value: bool | str, allow_auto: bool = True, owner: str = "workload") -> str:
    """The recompute policy named by an `activation_checkpointing` value: False -> "none",
    True -> "selective" (what True has meant since selective checkpointing), or one of
    "none" | "selective" | "full" (| "auto" where `allow_auto`: the planner's search over the three)."""
    if value is False:
        return "none"
    if value is True:
        return "selective"
    allowed = RECOMPUTE_POLICIES + (("auto",) if allow_auto else ())
    if isinstance(value, str) and value in allowed:
        return value
    raise SpecError(f"{owner}: activation_checkpointing (recompute policy) must be True, False or one of "
                    f"{', '.join(repr(x) for x in allowed)}; got {value!r}")


@dataclass(frozen=True)
class Workload:
    """One training iteration: `global_batch` sequences of `seq_len` tokens, processed one after
    another by the whole cluster (gradient accumulation), then one optimizer step.

    `param_sharding`: "replicated" (every rank holds all states; gradients all-reduced) or
    "zero3" (FSDP: states sharded; weights all-gathered per layer, gradients reduce-scattered).

    `activation_checkpointing` is the recompute policy (`recompute` gives it normalized):
    "none" (False) keeps every activation; "selective" (True) recomputes only the linear parts
    of each layer in backward (the attention core's inputs/outputs are kept); "full" keeps only each
    layer's input and recomputes the whole layer, attention and its communication included;
    "auto" lets the planner pick the fastest of the three that fits (the cost model refuses it).
    The field is stored canonically (False for "none", True for "selective") so that old callers
    that test it as a bool keep working and equal policies compare equal.
    """

    seq_len: int
    global_batch: int = 1
    activation_checkpointing: bool | str = False
    param_sharding: str = "zero3"
    block_size: int = 128

    def __post_init__(self) -> None:
        for key in ("seq_len", "global_batch", "block_size"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"workload: {key} must be a positive integer, got {v!r}")
        if self.param_sharding not in ("replicated", "zero3"):
            raise SpecError(f"workload: param_sharding must be 'replicated' or 'zero3', got {self.param_sharding!r}")
        policy = recompute_policy(self.activation_checkpointing)
        canonical = {"none": False, "selective": True}.get(policy, policy)
        object.__setattr__(self, "activation_checkpointing", canonical)

    @property
    def recompute(self) -> str:
        """The recompute policy: "none", "selective", "full" or "auto"."""
        return recompute_policy(self.activation_checkpointing)

    def with_recompute(self, policy: bool | str) -> "Workload":
        """The same workload under another recompute policy."""
        return replace(self, activation_checkpointing=policy)

    @property
    def tokens(self) -> int:
        return self.seq_len * self.global_batch


def parse_tokens(text: str | int) -> int:
    """'128K' -> 131072, '1M' -> 1048576, '4096' -> 4096."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper()
    mult = 1
    if s.endswith("K"):
        mult, s = 1024, s[:-1]
    elif s.endswith("M"):
        mult, s = 1024 * 1024, s[:-1]
    try:
        v = int(float(s) * mult)
    except (ValueError, OverflowError):  # OverflowError: "inf"
        raise SpecError(f"not a token count: {text!r} (examples: 4096, 128K, 1M)") from None
    if v <= 0:
        raise SpecError(f"token count must be positive, got {text!r}")
    return v
