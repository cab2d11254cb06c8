"""Stage I of the scheduler: candidate groupings from the topology.

A *grouping* fixes which devices take part, how they form HP groups and the groups' ring order;
the MILP (stage II) then chooses chunk lengths, shards and heads for it. Candidates come from:

- a *domain* is the devices of one node that share a GPU type (identical, NVLink-connected);
- groups are domains cut into equal sub-groups whose size divides the heads (in whole KV-head
  units), so a one-type group can split its heads evenly; size 1 everywhere is pure CP;
- optionally every device of a GPU type in one group, or all devices in one group (HP across
  nodes), when that many ranks can share the heads;
- every subset of GPU types (leaving slow devices out), since that can be faster.

Ring order follows the device order (node by node), so neighbouring groups share nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

from ..specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class Grouping:
    """HP groups (cluster device indices, in ring order) and a label saying how they were formed."""

    groups: tuple[tuple[int, ...], ...]
    label: str

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for g in self.groups for d in g)

    @property
    def key(self) -> tuple[tuple[int, ...], ...]:
        return self.groups


def head_units(model: ModelSpec) -> int:
    """How many query-head units a group splits: heads in whole KV-head groups (GQA granularity)."""
    return model.heads // model.group_size


def domains(cluster: ClusterSpec, devices: Iterable[int] | None = None) -> list[list[int]]:
    """Devices of one node and one GPU type, node by node (only those in `devices` if given)."""
    use = set(range(cluster.size)) if devices is None else set(devices)
    out: list[list[int]] = []
    for node in cluster.node_devices:
        by_type: dict[str, list[int]] = {}
        for d in node:
            if d in use:
                by_type.setdefault(cluster.devices[d].gpu.name, []).append(d)
        out.extend(by_type.values())
    return out


def split_sizes(domain_size: int, units: int) -> list[int]:
    """Sub-group sizes for a domain: divisors of its size that also divide the head units."""
    return [d for d in range(1, domain_size + 1) if domain_size % d == 0 and units % d == 0]


def _fit(size: int, target: int, units: int) -> int:
    """The largest legal sub-group size of a domain of `size` devices not above `target`."""
    return max(d for d in split_sizes(size, units) if d <= target)


def node_grouping(cluster: ClusterSpec, types: Sequence[str], size_by_type: dict[str, int], units: int) -> Grouping | None:
    """Domains of the chosen GPU types cut into sub-groups of (at most) the size chosen per type."""
    use = [d.index for d in cluster.devices if d.gpu.name in types]
    if not use:
        return None
    groups: list[tuple[int, ...]] = []
    for dom in domains(cluster, use):
        t = cluster.devices[dom[0]].gpu.name
        k = _fit(len(dom), size_by_type[t], units)
        groups.extend(tuple(dom[i : i + k]) for i in range(0, len(dom), k))
    return Grouping(tuple(groups), "groups of " + ", ".join(f"{t} x{size_by_type[t]}" for t in types))


def type_order(cluster: ClusterSpec) -> list[str]:
    """GPU types, fastest first (effective matmul FLOP/s, then memory)."""
    seen: dict[str, tuple[float, float]] = {}
    for d in cluster.devices:
        seen[d.gpu.name] = (d.gpu.matmul_flops, d.gpu.memory_bytes)
    return sorted(seen, key=lambda t: seen[t], reverse=True)


def type_subsets(cluster: ClusterSpec, max_subsets: int = 15) -> list[tuple[str, ...]]:
    """Subsets of GPU types to use: all of them first, then dropping the slowest ones, then the rest."""
    order = type_order(cluster)
    out: list[tuple[str, ...]] = [tuple(order[:k]) for k in range(len(order), 0, -1)]
    for k in range(len(order) - 1, 0, -1):
        for combo in combinations(order, k):
            if combo not in out:
                out.append(combo)
    return out[:max_subsets]


def size_options(cluster: ClusterSpec, types: Sequence[str], units: int) -> dict[str, list[int]]:
    """Legal sub-group sizes per GPU type (those that divide every domain of that type and the heads)."""
    out: dict[str, list[int]] = {}
    for t in types:
        sizes = None
        for dom in domains(cluster, [d.index for d in cluster.devices if d.gpu.name == t]):
            s = set(split_sizes(len(dom), units))
            sizes = s if sizes is None else sizes & s
        out[t] = sorted(sizes or {1})
    return out


def spanning_groupings(cluster: ClusterSpec, types: Sequence[str], units: int) -> list[Grouping]:
    """Groups that cross nodes: all devices of each type in one group, and all devices in one group.

    A group's ranks of one type share one head count, so these are legal only when each type's count
    can share the head units with the others (checked by the MILP; here only a size sanity bound)."""
    use = [d.index for d in cluster.devices if d.gpu.name in types]
    out = []
    if len(use) <= units:
        out.append(Grouping((tuple(use),), "one group of all used devices (HP across nodes)"))
    per_type = [tuple(d.index for d in cluster.devices if d.gpu.name == t) for t in types]
    if len(per_type) > 1 and all(len(g) <= units for g in per_type):
        out.append(Grouping(tuple(per_type), "one group per GPU type (HP across nodes)"))
    return out


def candidate_groupings(cluster: ClusterSpec, model: ModelSpec, max_subsets: int = 15) -> list[Grouping]:
    """Stage I: every candidate grouping (uniform sub-group size per type subset, plus spanning groups).

    Per-type mixed sizes are explored by the scheduler around the best uniform one."""
    units = head_units(model)
    seen: set = set()
    out: list[Grouping] = []
    for types in type_subsets(cluster, max_subsets):
        opts = size_options(cluster, types, units)
        all_sizes = sorted({s for v in opts.values() for s in v}, reverse=True)
        for size in all_sizes:
            g = node_grouping(cluster, types, {t: size for t in types}, units)
            if g is not None and g.key not in seen:
                seen.add(g.key)
                out.append(Grouping(g.groups, f"{'+'.join(types)}: groups of <= {size} in each node"))
        for g in spanning_groupings(cluster, types, units):
            if g.key not in seen:
                seen.add(g.key)
                out.append(Grouping(g.groups, f"{'+'.join(types)}: {g.label}"))
    return out
