"""How a cell's cluster is built (`ClusterRecipe`: a file, a generated mixed cluster, or a
sensitivity variant of another recipe) and the cell itself (`Cell`): what scenarios and sweeps
expand into. Below both `scenarios.py` and `sensitivity.py`, which read and expand the files."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..specs import DATA_DIR, ClusterSpec, Workload, get_model, load_cluster
from ..specs.stacks import DEFAULT_STACK_NAME
from .style import tokens_label

CLUSTER_DIR = DATA_DIR / "clusters"
MIXED_TYPES = ("H100-SXM", "A100-80GB", "A800", "L40S")
MIXED_NIC_GBPS = {"H100-SXM": 50.0, "L40S": 12.5}  # others 25 GB/s, as the bundled simulation clusters


def mixed_cluster(gpus: int, types: tuple[str, ...] = MIXED_TYPES, node_size: int = 8) -> ClusterSpec:
    """A cluster of `gpus` devices split evenly over `types` in nodes of `node_size` (scaling studies)."""
    if gpus <= 0 or gpus % (len(types) * node_size):
        raise SpecError(f"{gpus} GPUs do not split into {len(types)} types x nodes of {node_size}")
    nodes_per_type = gpus // (len(types) * node_size)
    nodes = [(t, node_size, MIXED_NIC_GBPS.get(t, 25.0)) for t in types for _ in range(nodes_per_type)]
    return ClusterSpec.from_nodes(
        f"mixed-{gpus}", nodes, description=f"{gpus} GPUs, {' / '.join(types)} in equal shares, nodes of {node_size}"
    )


# ----------------------------------------------------------------------------- clusters


@dataclass(frozen=True)
class ClusterRecipe:
    """How to build a cell's cluster: a file (`kind="file"`, `source` its path) or a generator
    with frozen parameters (`mixed`, or a sensitivity variant). Hashable, so builds are cached."""

    name: str
    kind: str
    source: str = ""
    params: tuple[tuple[str, Any], ...] = ()

    def build(self) -> ClusterSpec:
        return _build(self, _digest(self))

    def fingerprint(self) -> str:
        """Everything that defines the cluster the planner sees: the file's bytes (when there is a
        file) and the full content of the built spec (every node and GPU field, links, overrides);
        no paths, so the same cluster has the same fingerprint on every machine."""
        return _fingerprint(self, _digest(self))


def _digest(recipe: ClusterRecipe) -> str:
    """The content of the files a recipe reads, read afresh: the build caches below are keyed by
    it, so an edited cluster file is never served from a cache (a notebook kernel lives long)."""
    h = hashlib.sha256()
    if recipe.source:
        h.update(Path(recipe.source).read_bytes())
    for _, v in recipe.params:
        if isinstance(v, ClusterRecipe):
            h.update(_digest(v).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=256)
def _fingerprint(recipe: ClusterRecipe, digest: str) -> str:
    c = recipe.build()
    params = tuple((k, v.fingerprint() if isinstance(v, ClusterRecipe) else v) for k, v in recipe.params)
    return hashlib.sha256(
        (digest + repr((recipe.kind, params, c.nodes, c.inter_node_latency_us, c.overrides))).encode()
    ).hexdigest()


@functools.lru_cache(maxsize=256)
def _build(recipe: ClusterRecipe, digest: str) -> ClusterSpec:
    if recipe.kind == "file":
        return load_cluster(recipe.source)
    if recipe.kind == "mixed":
        p = dict(recipe.params)
        return mixed_cluster(p["gpus"], tuple(p["types"]), p["node_size"])
    return build_variant(recipe)  # a sensitivity variant


def cluster_recipe(entry: Any, where: str) -> ClusterRecipe:
    """A scenario's cluster entry: a bundled name, a path, or `{mixed: N, types: [...], node_size: 8}`."""
    if isinstance(entry, Mapping):
        unknown = set(entry) - {"mixed", "types", "node_size"}
        if "mixed" not in entry or unknown:
            raise SpecError(
                f"{where}: a generated cluster is {{mixed: N, types: [...], node_size: 8}}; got {dict(entry)!r}"
            )
        types = tuple(entry.get("types", MIXED_TYPES))
        recipe = ClusterRecipe(
            f"mixed-{entry['mixed']}",
            "mixed",
            params=(("gpus", entry["mixed"]), ("types", types), ("node_size", entry.get("node_size", 8))),
        )
    elif isinstance(entry, str):
        p = Path(entry)
        path = p if p.suffix and p.exists() else CLUSTER_DIR / f"{entry}.yaml"
        if not path.exists():
            known = ", ".join(sorted(x.stem for x in CLUSTER_DIR.glob("*.yaml")))
            raise SpecError(f"{where}: cluster {entry!r} not found; bundled clusters: {known}")
        recipe = ClusterRecipe(path.stem, "file", source=str(path.resolve()))
    else:
        raise SpecError(f"{where}: a cluster is a name, a path or {{mixed: N}}; got {entry!r}")
    try:
        built = recipe.build()
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
    return ClusterRecipe(built.name, recipe.kind, recipe.source, recipe.params)


# ----------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Cell:
    """One (cluster, model, sequence length) of a scenario. `pair`/`role` mark FLOP-comparable
    pairs, `sweep`/`sweep_value` sensitivity points; they label the cell but do not change what
    is computed (`compute_params`), so equal computations in two scenarios share one cache entry."""

    scenario: str
    cluster: ClusterRecipe
    model: str
    seq_len: int
    workload: tuple[tuple[str, Any], ...]
    pair: str = ""
    role: str = ""
    sweep: str = ""
    sweep_value: float | None = None
    joint: bool = False  # the whole step planned (replicas x sharding: planner/joint.py), not one sequence
    stack: str = DEFAULT_STACK_NAME  # the software stack it is planned and judged on (data/stacks.yaml)

    @property
    def label(self) -> str:
        return f"{self.cluster.name} {self.model} {tokens_label(self.seq_len)}"

    def workload_spec(self) -> Workload:
        return Workload(seq_len=self.seq_len, **dict(self.workload))

    def compute_params(self) -> dict[str, Any]:
        """All the inputs of the computation of this cell (the cache key hashes them)."""
        return {
            "cluster": self.cluster.name,
            "cluster_fingerprint": self.cluster.fingerprint(),
            "model": self.model,
            "seq_len": self.seq_len,
            "workload": dict(self.workload),
            **({"joint": True} if self.joint else {}),  # (absent for the paper's cells: their cache keys stay)
            # the stack's factors enter the version (data/stacks.yaml); its name tells the cells apart.
            # Absent on the default stack, so the default grid's cache keys stay.
            **({"stack": self.stack} if self.stack != DEFAULT_STACK_NAME else {}),
        }


def checked_models(raw: Any, where: str) -> tuple[str, ...]:
    """Model names of a scenario entry, each looked up in the catalog (a bad name fails here)."""
    models = tuple(raw or ())
    for m in models:
        try:
            get_model(m)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
    return models


# ----------------------------------------------------------------------------- sensitivity variants


def _nic_variant(recipe: Any) -> ClusterSpec:
    p = dict(recipe.params)
    base: ClusterSpec = p["base"].build()
    nodes = tuple(replace(n, nic_gbps=p["nic_gbps"]) for n in base.nodes)
    return ClusterSpec(
        recipe.name,
        nodes,
        base.inter_node_latency_us,
        base.overrides,
        f"{base.name} with every NIC at {p['nic_gbps']:g} GB/s per GPU",
    )


def _old_fraction_variant(recipe: Any) -> ClusterSpec:
    p = dict(recipe.params)
    old = p["old_nodes"]
    nodes = [(p["new"], p["node_size"], p["nic_gbps"])] * (p["nodes"] - old) + [
        (p["old"], p["node_size"], p["nic_gbps"])
    ] * old
    return ClusterSpec.from_nodes(
        recipe.name, nodes, description=f"{p['nodes'] - old} {p['new']} + {old} {p['old']} nodes of {p['node_size']}"
    )


BUILDERS: dict[str, Callable[[Any], ClusterSpec]] = {"nic": _nic_variant, "old_fraction": _old_fraction_variant}


def build_variant(recipe: Any) -> ClusterSpec:
    if recipe.kind not in BUILDERS:  # pragma: no cover - programming error
        raise ValueError(f"unknown cluster recipe kind {recipe.kind!r}")
    return BUILDERS[recipe.kind](recipe)
