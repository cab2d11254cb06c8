"""Stage I of the planner: the device subsets and the layouts it searches — the search space the
bound is claimed for, listed explicitly and in a fixed order (the same input gives the same list).

Device subsets (a plan may leave devices out):
    every device; every union of GPU types and its largest power-of-two part (fastest whole nodes
    first); the fastest n devices, whole nodes first, for every n that is a power of two or a divisor
    of the cluster size.
Layouts of a subset:
    - node groups: each node's devices of one GPU type (a *domain*, identical devices on one link)
      cut into sub-groups of size s, for every s that divides the head units (whole KV heads) and
      some domain (a domain that s does not divide uses its largest size below s); and, for every
      s dividing the head units larger than some domain's largest such cut, groups of s and one of
      the rest (a node of 3: 2 + 1); heads even inside a group of identical devices;
    - spanning groups (at most MAX_SPANNING devices): all devices in one group, and one group per
      GPU type; their heads split over the classes of identical devices in whole KV-head units, every
      such split (at most MAX_HEAD_SPLITS per layout family);
    - ring orders: node order; a periodic interleave of the GPU types (when the subset repeats, the
      rotation maps identical groups onto each other: `orbits`, which the model exploits beyond
      SYMMETRIC_FROM groups); with at most MAX_ORDERED groups every distinct order of group kinds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import reduce

from ..rounding import even_split
from ..specs import ClusterSpec, ModelSpec
from .layout import Layout

MAX_SPANNING = 16  # spanning groups only on small subsets: their all-to-all crosses nodes
EXHAUSTIVE_DEVICES = 4  # clusters up to this size: every layout of every subset (`exhaustive_layouts`) ...
EXHAUSTIVE_MAX = 2000  # ... unless there are more layouts than this (many KV heads to split): then the families
MAX_HEAD_SPLITS = 16
MAX_ORDERED = 4  # up to this many groups, every order of the group kinds is a candidate
SYMMETRIC_FROM = 33  # groups from which a periodic layout is modelled on its orbits (planner/layout_model.py)


@dataclass(frozen=True)
class Candidate:
    """One layout the planner searches, with how it was formed and its rotation orbits (or None)."""

    layout: Layout
    label: str
    subset: str
    orbits: tuple[int, ...] | None = None
    complete: bool = False  # one of `exhaustive_layouts`: the list it belongs to holds every layout at all

    @property
    def key(self) -> tuple:
        return (self.layout.groups, self.layout.heads)


def head_units(model: ModelSpec) -> int:
    """Query-head units a group splits: whole KV heads (GQA granularity)."""
    return model.heads // model.group_size


def domains(cluster: ClusterSpec, devices: Iterable[int]) -> list[list[int]]:
    """Devices of one node and one GPU type, node by node, in device order."""
    use = set(devices)
    out: list[list[int]] = []
    for node in cluster.node_devices:
        by: dict[str, list[int]] = {}
        for d in node:
            if d in use:
                by.setdefault(cluster.devices[d].gpu.name, []).append(d)
        out.extend(by.values())
    return out


def device_speed(cluster: ClusterSpec, d: int) -> tuple[float, float]:
    g = cluster.devices[d].gpu
    return (g.matmul_flops, g.memory_bytes)


def device_subsets(cluster: ClusterSpec, sizes: Iterable[int] = ()) -> list[tuple[str, tuple[int, ...]]]:
    """Candidate device sets (module doc), most devices first; each with a label. `sizes`: also the
    fastest n devices for each of these n (the baselines add the sizes their symmetric layouts can use)."""
    out: dict[tuple[int, ...], str] = {}
    everything = tuple(range(cluster.size))
    out[everything] = "all devices"
    # ties (equal speeds) by name: set order changes with the interpreter's hash seed
    types = sorted(
        {d.gpu.name for d in cluster.devices},
        key=lambda t: (tuple(-x for x in device_speed(cluster, _first(cluster, t))), t),
    )
    for r in range(len(types), 0, -1):
        for combo in itertools.combinations(types, r):
            devs = tuple(d.index for d in cluster.devices if d.gpu.name in combo)
            if r < len(types):
                out.setdefault(devs, "+".join(combo))
            # ... and its largest power-of-two part, whole nodes of the fastest types first (even splits of
            # a power-of-two sequence over a power-of-two grid: the layout a person would build by hand)
            p2 = 1 << (len(devs).bit_length() - 1)
            if p2 < len(devs):
                doms = sorted(
                    domains(cluster, devs), key=lambda dom: (tuple(-x for x in device_speed(cluster, dom[0])), dom[0])
                )
                ranked = [d for dom in doms for d in dom]
                out.setdefault(tuple(sorted(ranked[:p2])), f"{'+'.join(combo)}, the fastest {p2}")
    # the fastest n devices, whole nodes (of one type) first
    doms = sorted(
        domains(cluster, everything), key=lambda dom: (tuple(-x for x in device_speed(cluster, dom[0])), dom[0])
    )
    ranked = [d for dom in doms for d in dom]
    N = cluster.size
    sizes = sorted(
        {n for n in range(1, N) if N % n == 0}
        | {1 << i for i in range(int(math.log2(N)) + 1) if 1 << i < N}
        | {n for n in sizes if 0 < n < N},
        reverse=True,
    )
    for n in sizes:
        devs = tuple(sorted(ranked[:n]))
        out.setdefault(devs, f"the fastest {n}")
    return [(label, devs) for devs, label in sorted(out.items(), key=lambda kv: (-len(kv[0]), kv[0]))]


def _first(cluster: ClusterSpec, gpu: str) -> int:
    return next(d.index for d in cluster.devices if d.gpu.name == gpu)


def even_heads(model: ModelSpec, size: int) -> tuple[int, ...] | None:
    """Heads of a group of `size` identical devices: even in whole KV-head units (the first ranks take
    the remainder), None when the group has more ranks than units."""
    units, unit = head_units(model), model.group_size
    if size > units:
        return None
    return tuple(x * unit for x in even_split(units, size))


def _split_sizes(domain: int, units: int) -> list[int]:
    return [s for s in range(1, domain + 1) if domain % s == 0 and units % s == 0] or [1]


def node_groups(cluster: ClusterSpec, devices: Sequence[int], size: int, units: int) -> list[tuple[int, ...]]:
    """Each domain cut into sub-groups of `size` (its largest legal size below it when it does not divide)."""
    out = []
    for dom in domains(cluster, devices):
        s = (
            max(x for x in _split_sizes(len(dom), units) if x <= size)
            if any(x <= size for x in _split_sizes(len(dom), units))
            else 1
        )
        out.extend(tuple(dom[i : i + s]) for i in range(0, len(dom), s))
    return out


def _kind(cluster: ClusterSpec, group: Sequence[int]) -> tuple:
    """What makes two groups interchangeable: their devices' types and links, in order."""
    return tuple(
        (cluster.devices[d].gpu.name, cluster.devices[d].nic_gbps, cluster.devices[d].link_bandwidth_gbps)
        for d in group
    )


def periodic_order(cluster: ClusterSpec, groups: list[tuple[int, ...]]) -> tuple[list[int], list[int] | None]:
    """An interleave of the group kinds (each kind spread evenly over the ring); when every kind's
    count shares a factor q, the order repeats q times and the orbits are the positions mod the period."""
    by: dict[tuple, list[int]] = {}
    for i, g in enumerate(groups):
        by.setdefault(_kind(cluster, g), []).append(i)
    q = reduce(math.gcd, [len(v) for v in by.values()])
    per = {kd: len(v) // q for kd, v in by.items()}
    keyed = sorted(((j + 0.5) / cnt, n, kd) for n, (kd, cnt) in enumerate(per.items()) for j in range(cnt))
    pattern = [kd for _, _, kd in keyed]
    used = {kd: 0 for kd in by}
    order = []
    for _ in range(q):
        for kd in pattern:
            order.append(by[kd][used[kd]])
            used[kd] += 1
    p = len(pattern)
    orbits = [i % p for i in range(len(order))] if q > 1 else None
    return order, orbits


def _orders(cluster: ClusterSpec, groups: list[tuple[int, ...]]) -> list[tuple[str, list[int], list[int] | None]]:
    """Ring orders of a set of groups (module doc): (label, order, orbits)."""

    def kinds(order: Sequence[int]) -> tuple:
        return tuple(_kind(cluster, groups[i]) for i in order)

    node = list(range(len(groups)))
    order, orbits = periodic_order(cluster, groups)
    if kinds(order) == kinds(node):  # the node order is the interleave itself
        out = [("node order", node, orbits)]
    else:
        out = [("node order", node, None), ("interleaved", order, orbits)]
    seen = {kinds(o) for _, o, _ in out}
    if len(groups) <= MAX_ORDERED:
        for perm in itertools.permutations(node):
            if kinds(perm) not in seen:
                seen.add(kinds(perm))
                out.append(("order " + ",".join(map(str, perm)), list(perm), None))
    return out


def _head_splits(cluster: ClusterSpec, model: ModelSpec, group: Sequence[int]) -> list[tuple[int, ...]]:
    """Head counts of a spanning group: per class of identical devices (type, node) a count in whole
    units, the classes' totals summing to the heads; every split, most even by capacity first."""
    units, unit = head_units(model), model.group_size
    classes: dict[tuple, list[int]] = {}
    for i, d in enumerate(group):
        dev = cluster.devices[d]
        classes.setdefault((dev.gpu.name, dev.node), []).append(i)
    cls = list(classes.values())
    sizes = [len(c) for c in cls]
    out = []

    def rec(i: int, left: int, acc: list[int]) -> None:
        if i == len(cls):
            if left == 0:
                out.append(list(acc))
            return
        for x in range(0, left // sizes[i] + 1):
            rec(i + 1, left - x * sizes[i], acc + [x])

    rec(0, units, [])
    weight = [sum(cluster.devices[group[j]].gpu.attention_flops for j in c) for c in cls]
    total = sum(weight)
    want = [units * w / total / s for w, s in zip(weight, sizes)]  # units per member ∝ capacity
    out = [o for o in out if all(x > 0 for x in o)] or out
    out.sort(key=lambda o: (sum((x - y) ** 2 for x, y in zip(o, want)), o))
    heads = []
    for o in out[:MAX_HEAD_SPLITS]:
        h = [0] * len(group)
        for x, c in zip(o, cls):
            for j in c:
                h[j] = x * unit
        heads.append(tuple(h))
    return heads


def set_partitions(items: Sequence[int]) -> Iterable[list[tuple[int, ...]]]:
    """Every partition of `items` into non-empty blocks (members in the given order, blocks unordered)."""
    items = list(items)
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [(first,)] + part
        for i in range(len(part)):
            yield part[:i] + [(first,) + part[i]] + part[i + 1 :]


def compositions(total: int, parts: int) -> Iterable[tuple[int, ...]]:
    """Every way to write `total` as an ordered sum of `parts` non-negative integers."""
    if parts == 1:
        yield (total,)
        return
    for x in range(total + 1):
        for rest in compositions(total - x, parts - 1):
            yield (x,) + rest


def exhaustive_layouts(cluster: ClusterSpec, model: ModelSpec, limit: int | None = None) -> list[Candidate] | None:
    """Every layout of a small cluster (at most EXHAUSTIVE_DEVICES devices): every device subset,
    every partition into groups in every ring order, every head split in whole KV-head units (a rank
    may hold none), members of a group in device order; layouts that only swap identical devices
    (same node and type) are listed once. None when there are more than `limit`."""
    units, unit = head_units(model), model.group_size
    ident = {d.index: (d.node, d.gpu.name, d.nic_gbps, d.link_bandwidth_gbps) for d in cluster.devices}
    out, seen = [], set()
    for r in range(cluster.size, 0, -1):
        for subset in itertools.combinations(range(cluster.size), r):
            for part in set_partitions(subset):
                for order in itertools.permutations(part):
                    for heads in itertools.product(*[list(compositions(units, len(g))) for g in order]):
                        sig = tuple(tuple((ident[d], h) for d, h in zip(g, hs)) for g, hs in zip(order, heads))
                        if sig in seen:
                            continue
                        seen.add(sig)
                        lay = Layout(tuple(order), tuple(tuple(h * unit for h in hs) for hs in heads))
                        desc = " | ".join("+".join(str(d) for d in g) for g in order)
                        out.append(
                            Candidate(
                                lay,
                                f"groups {desc}, heads {[list(h) for h in lay.heads]}",
                                f"{r} devices",
                                complete=True,
                            )
                        )
                        if limit is not None and len(out) > limit:
                            return None
    return out


def layouts(
    cluster: ClusterSpec, model: ModelSpec, label: str, devices: Sequence[int], max_groups: int | None = None
) -> list[Candidate]:
    """Every candidate layout of one device subset (module doc), in a fixed order."""
    units = head_units(model)
    doms = domains(cluster, devices)
    sizes = sorted({s for dom in doms for s in _split_sizes(len(dom), units)}, reverse=True)
    out: list[Candidate] = []
    seen: set = set()

    def add(groups: list[tuple[int, ...]], heads: list[tuple[int, ...]], what: str) -> None:
        for olabel, order, orbits in _orders(cluster, groups):
            g = tuple(groups[i] for i in order)
            h = tuple(heads[i] for i in order)
            lay = Layout(g, h)
            key = (lay.groups, lay.heads)
            if key in seen or (max_groups is not None and len(g) > max_groups):
                continue
            seen.add(key)
            orb = tuple(orbits) if orbits is not None and len(g) >= SYMMETRIC_FROM else None
            out.append(Candidate(lay, f"{what}, {olabel}", label, orb))

    for size in sizes:
        groups = node_groups(cluster, devices, size, units)
        heads = [even_heads(model, len(g)) for g in groups]
        if all(h is not None for h in heads):
            add(groups, heads, f"{label}: groups of <= {size} in each node")
    # a domain whose even cuts are all smaller than a group size dividing the head units: groups of that
    # size and one of the rest (3 GPUs: 2 + 1; 7: 2 + 2 + 2 + 1; 6 GPUs, 4 units: 4 + 2), heads even inside each
    for size in sorted({s for s in range(2, units + 1) if units % s == 0}, reverse=True):
        if all(len(dom) <= size or max(_split_sizes(len(dom), units)) >= size for dom in doms):
            continue  # every domain has an even cut at least this large: the families above
        groups = [tuple(dom[i : i + size]) for dom in doms for i in range(0, len(dom), size)]
        heads = [even_heads(model, len(g)) for g in groups]
        if all(h is not None for h in heads):
            add(groups, heads, f"{label}: groups of {size} and the rest in each node")
    if len(devices) <= MAX_SPANNING:
        spans = [[tuple(devices)]]
        by_type: dict[str, list[int]] = {}
        for d in devices:
            by_type.setdefault(cluster.devices[d].gpu.name, []).append(d)
        if len(by_type) > 1:
            spans.append([tuple(v) for v in by_type.values()])
        for groups in spans:
            if any(len(g) > units for g in groups):
                continue
            per_group = [_head_splits(cluster, model, g) for g in groups]
            for combo in itertools.islice(itertools.product(*per_group), MAX_HEAD_SPLITS):
                add(
                    list(groups),
                    list(combo),
                    f"{label}: " + ("one group across nodes" if len(groups) == 1 else "one group per GPU type"),
                )
    return out
