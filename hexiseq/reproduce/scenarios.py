"""Scenario files (`data/scenarios/*.yaml`) and the cells they expand into.

A scenario names clusters, models and sequence lengths; every combination is a *cell*, planned
for HexiSeq and every baseline. Keys of a scenario file:

- `name`, `description`
- `clusters`: bundled cluster names or paths, or `{mixed: N}` for N GPUs split evenly over
  H100/A100/A800/L40S in nodes of 8 (`types:` and `node_size:` override; scaling studies)
- `models`, `seq_lens` (e.g. `16K`, `1M`), `workload` (Workload fields; recompute defaults to auto)
- `pairs`: `[{mixed: A, homogeneous: B}]`, FLOP-comparable pairs: both clusters of each pair
  become cells (roles `mixed` and `homogeneous`) for every model and length
- `sweeps`: sensitivity studies (see `sensitivity.py`): `{sweep name: parameters}`
- `quick`: the same keys again, for `--quick`: they replace the full ones (a sweep's parameters
  are merged into the full sweep's)

Bad files fail here, before any planning, with the file and the key at fault.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..specs import DATA_DIR, ClusterSpec, Workload, get_model, load_cluster, parse_tokens, read_yaml

SCENARIO_DIR = DATA_DIR / "scenarios"
CLUSTER_DIR = DATA_DIR / "clusters"
MIXED_TYPES = ("H100-SXM", "A100-80GB", "A800", "L40S")
MIXED_NIC_GBPS = {"H100-SXM": 50.0, "L40S": 12.5}  # others 25 GB/s, as the bundled simulation clusters
SCENARIO_KEYS = {"name", "description", "clusters", "models", "seq_lens", "workload", "pairs", "sweeps", "quick"}


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
    from .sensitivity import build_variant  # sensitivity variants

    return build_variant(recipe)


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

    @property
    def label(self) -> str:
        from .style import tokens_label

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
        }


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str
    cells: tuple[Cell, ...] = field(default=())
    quick: bool = False


def _workload(raw: Any, where: str) -> tuple[tuple[str, Any], ...]:
    wl = {"activation_checkpointing": "auto", **dict(raw or {})}  # the planner picks the recompute policy
    if "seq_len" in wl:
        raise SpecError(f"{where}: workload must not set seq_len (use seq_lens)")
    try:
        Workload(seq_len=1 << 20, **wl)
    except (TypeError, SpecError) as e:
        raise SpecError(f"{where}: bad workload {wl!r}: {e}") from None
    return tuple(sorted(wl.items()))


def _models(raw: Any, where: str) -> tuple[str, ...]:
    models = tuple(raw or ())
    for m in models:
        try:
            get_model(m)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
    return models


def _lens(raw: Any, where: str) -> tuple[int, ...]:
    try:
        return tuple(parse_tokens(s) for s in (raw or ()))
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def scenario_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix and p.exists():
        return p
    p = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        raise SpecError(f"scenario not found: {name_or_path}; bundled: {', '.join(bundled_scenarios())}")
    return p


def bundled_scenarios() -> list[str]:
    return sorted(x.stem for x in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path, quick: bool = False) -> Scenario:
    """A bundled scenario by name or a YAML path, expanded into its cells (`quick`: the file's
    `quick:` subset). Every cluster is built and every model looked up here, so a bad entry fails
    before any planning starts."""
    from .sensitivity import sweep_cells

    path = scenario_path(name_or_path)
    raw = read_yaml(path)  # the specs' strict reader: one clear error for a missing or malformed file
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a scenario is a mapping with keys {sorted(SCENARIO_KEYS)}")
    unknown = set(raw) - SCENARIO_KEYS
    if unknown:
        raise SpecError(f"{path.name}: unknown keys {sorted(unknown)}; known: {sorted(SCENARIO_KEYS)}")
    if quick:
        q = dict(raw.get("quick") or {})
        bad = set(q) - (SCENARIO_KEYS - {"name", "description", "quick"})
        if bad:
            raise SpecError(f"{path.name}: quick: unknown keys {sorted(bad)}")
        sweeps = {k: {**v, **((q.get("sweeps") or {}).get(k) or {})} for k, v in (raw.get("sweeps") or {}).items()}
        raw = {**raw, **q, "sweeps": sweeps}
    name = str(raw.get("name", path.stem))
    where = f"{path.name}"
    wl = _workload(raw.get("workload"), f"{where}: workload")
    models = _models(raw.get("models"), f"{where}: models")
    lens = _lens(raw.get("seq_lens"), f"{where}: seq_lens")
    cells: list[Cell] = []
    for i, entry in enumerate(raw.get("clusters") or ()):
        recipe = cluster_recipe(entry, f"{where}: clusters[{i}]")
        cells += [Cell(name, recipe, m, s, wl) for m in models for s in lens]
    for i, pair in enumerate(raw.get("pairs") or ()):
        if not isinstance(pair, Mapping) or set(pair) != {"mixed", "homogeneous"}:
            raise SpecError(f"{where}: pairs[{i}] must be {{mixed: CLUSTER, homogeneous: CLUSTER}}, got {pair!r}")
        mixed = cluster_recipe(pair["mixed"], f"{where}: pairs[{i}].mixed")
        homo = cluster_recipe(pair["homogeneous"], f"{where}: pairs[{i}].homogeneous")
        label = f"{mixed.name} vs {homo.name}"
        for m in models:
            for s in lens:
                cells += [
                    Cell(name, mixed, m, s, wl, pair=label, role="mixed"),
                    Cell(name, homo, m, s, wl, pair=label, role="homogeneous"),
                ]
    sweeps = raw.get("sweeps") or {}
    if not isinstance(sweeps, Mapping):
        raise SpecError(f"{where}: sweeps must map a sweep name to its parameters")
    for sweep, params in sweeps.items():
        cells += sweep_cells(name, sweep, params, wl, f"{where}: sweeps.{sweep}")
    if not cells:
        raise SpecError(f"{where}: no cells (give clusters + models + seq_lens, pairs, or sweeps)")
    return Scenario(name, str(raw.get("description", "")), str(path), tuple(cells), quick)


def load_scenarios(names: list[str] | tuple[str, ...] | None = None, quick: bool = False) -> list[Scenario]:
    """The named scenarios (default: every bundled one), all validated before any work."""
    scenarios: list[Scenario] = []
    seen: dict[str, str] = {}
    for n in names or bundled_scenarios():
        sc = load_scenario(n, quick=quick)
        if sc.name in seen:
            if seen[sc.name] != sc.path:
                raise SpecError(f"two scenarios are named {sc.name!r}: {seen[sc.name]} and {sc.path}")
            continue  # the same file named twice
        seen[sc.name] = sc.path
        scenarios.append(sc)
    return scenarios
