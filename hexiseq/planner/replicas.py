"""Replica partitions of a cluster: which disjoint device sets the joint planner tries as
data-parallel replicas, from the cluster's structure.

A *family* is a run of identical nodes (same GPU type, GPU count, NIC and link). A replica is a
`Piece` list (node, first local GPU, GPU count); its *shape* (`shape_key`) is what its plan depends
on — the node specs in order and the inter-node latency — so replicas of one shape are planned once
and their plan is moved onto each one's devices. The partitions (`partitions`) combine, per family:
nothing (left out), replicas of m whole nodes (m dividing the family's nodes) or replicas of c GPUs
inside a node (c dividing the node's GPUs: pure data parallelism at c = 1); and fast+slow pairings:
one node of a family with k nodes of another that has k times as many, per replica; and
rate-balanced unions of whole nodes (`balanced_unions`): for each replica count R, the nodes in
order of their rate cut into R runs, each with an integer share, so that the slowest share / rate
is least — replicas of mixed GPU types whose integer shares finish together (a fast pair of nodes
with one slower node, say, where the pair alone would take one sequence too many or too few).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..specs import ClusterSpec, NodeSpec


class Piece(NamedTuple):
    """GPUs [first, first + count) of node `node` (a tuple: the joint search hashes millions)."""

    node: int
    first: int
    count: int


Replica = tuple[Piece, ...]


@dataclass(frozen=True)
class Family:
    """Identical consecutive-or-not nodes of a cluster (same spec)."""

    spec: NodeSpec
    nodes: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{len(self.nodes)} x {self.spec.count} {self.spec.gpu.name}"


def spec_key(node: NodeSpec) -> tuple:
    """What makes two nodes identical: GPU type, GPU count, NIC and link."""
    return (node.gpu.name, node.count, node.nic_gbps, node.link_bandwidth_gbps)


def families(cluster: ClusterSpec) -> list[Family]:
    """The cluster's nodes grouped by identical spec, in order of first appearance."""
    out: dict[tuple, list[int]] = {}
    specs: dict[tuple, NodeSpec] = {}
    for n, node in enumerate(cluster.nodes):
        key = spec_key(node)
        out.setdefault(key, []).append(n)
        specs[key] = node
    return [Family(specs[k], tuple(v)) for k, v in out.items()]


def shape_key(cluster: ClusterSpec, replica: Replica) -> tuple:
    """What a replica's plan depends on: its nodes' specs (GPUs taken) in order and the latency."""
    nodes = cluster.nodes
    return (
        cluster.inter_node_latency_us,
        tuple(
            (nodes[p.node].gpu.name, p.count, nodes[p.node].nic_gbps, nodes[p.node].link_bandwidth_gbps)
            for p in replica
        ),
    )


def sub_cluster(cluster: ClusterSpec, replica: Replica, name: str) -> ClusterSpec:
    """The replica as a cluster of its own (device j of it = `replica_devices(...)[j]`)."""
    nodes = [
        NodeSpec(
            cluster.nodes[p.node].gpu,
            p.count,
            cluster.nodes[p.node].nic_gbps,
            cluster.nodes[p.node].link_bandwidth_gbps,
        )
        for p in replica
    ]
    return ClusterSpec.from_nodes(name, nodes, cluster.inter_node_latency_us)


def replica_devices(cluster: ClusterSpec, replica: Replica) -> list[int]:
    """The cluster device indices of a replica, in its sub-cluster's order."""
    per_node = cluster.node_devices
    return [d for p in replica for d in per_node[p.node][p.first : p.first + p.count]]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def family_options(fam: Family) -> list[tuple[str, list[Replica]]]:
    """(label, replicas) choices of one family: replicas of m whole nodes, of c GPUs inside a node."""
    out: list[tuple[str, list[Replica]]] = []
    g = fam.spec.count
    for m in _divisors(len(fam.nodes)):
        reps = [tuple(Piece(n, 0, g) for n in fam.nodes[i : i + m]) for i in range(0, len(fam.nodes), m)]
        out.append((f"{len(reps)} x {m} node{'s' * (m > 1)} of {fam.spec.gpu.name}", reps))
    for c in _divisors(g)[:-1]:
        reps = [(Piece(n, f, c),) for n in fam.nodes for f in range(0, g, c)]
        out.append((f"{len(reps)} x {c} {fam.spec.gpu.name}", reps))
    return out


MAX_BALANCED_REPLICAS = 16  # rate-balanced unions of at most this many replicas (the families give more)


@dataclass(frozen=True)
class Partition:
    """Replicas (disjoint) and a label naming how they were formed."""

    label: str
    replicas: tuple[Replica, ...]


def balanced_unions(cluster: ClusterSpec, global_batch: int, node_rate: Callable[[int], float]) -> Iterator[Partition]:
    """Partitions of rate-balanced unions of whole nodes (module doc): the nodes in order of
    `node_rate` (sequences per second, fastest first; ties by node) cut into R = 2 .. min(G, nodes, 16)
    runs, each run a replica with an integer share, minimising the slowest share / rate (a dynamic
    program over the cuts and shares, every node in some run). Runs keep a type's nodes
    together, so a replica mixes types only where a share needs it; its nodes are in cluster order."""
    nodes = cluster.nodes
    order = sorted(range(len(nodes)), key=lambda n: (-node_rate(n), n))
    N, G = len(order), global_batch
    P = np.concatenate([[0.0], np.cumsum([node_rate(n) for n in order])])
    Rmax = min(G, N, MAX_BALANCED_REPLICAS)
    # f[r][i, s]: the least slowest time of r runs covering the first i nodes with s sequences
    f = np.full((Rmax + 1, N + 1, G + 1), np.inf)
    f[0, 0, 0] = 0.0
    arg = np.zeros((Rmax + 1, N + 1, G + 1, 2), dtype=np.int64)  # (j, b): the last run's start, share
    for r in range(1, Rmax + 1):
        for i in range(r, N + 1):
            seg = np.maximum(P[i] - P[:i], 1e-300)  # the rate of the run j .. i-1, per start j
            for s in range(r, G + 1):
                b = np.arange(1, s - r + 2)  # its share; the r - 1 runs before take at least one each
                # [b, j]: ties go to the least share, then the first start
                t = np.maximum(f[r - 1, :i, s - b], b[:, None] / seg[None, :])
                k, j = np.unravel_index(int(np.argmin(t)), t.shape)
                f[r, i, s], arg[r, i, s] = t[k, j], (j, b[k])
    for R in range(2, Rmax + 1):
        # every node: a run's time only falls with more nodes (its replica's own plan may leave devices out)
        i = N
        if not np.isfinite(f[R, i, G]):
            continue
        runs, s = [], G
        for r in range(R, 0, -1):
            j, b = (int(x) for x in arg[r, i, s])
            runs.append((order[j:i], b))
            i, s = j, s - b
        runs.reverse()
        reps = [tuple(Piece(n, 0, nodes[n].count) for n in sorted(run)) for run, _ in runs]
        shares = ":".join(str(b) for _, b in runs)
        yield Partition(f"{R} rate-balanced unions of nodes (shares {shares})", tuple(reps))  # in run order


def partition_key(replicas: Sequence[Replica]) -> tuple[Replica, ...]:
    """The replicas in the order `partitions` holds them (by first node and GPU): equal partitions, equal keys."""
    return tuple(sorted(replicas, key=lambda r: (r[0].node, r[0].first)))


def partitions(cluster: ClusterSpec, max_replicas: int | None = None) -> Iterator[Partition]:
    """Every partition of the families (module doc), each family's nodes used or left out whole;
    `max_replicas` drops partitions with more replicas (they could not all take a sequence)."""
    fams = families(cluster)
    opts = [[("", [])] + family_options(f) for f in fams]
    seen: set = set()

    def emit(label_parts: list[str], reps: list[Replica]) -> Iterator[Partition]:
        if not reps or (max_replicas is not None and len(reps) > max_replicas):
            return
        key = partition_key(reps)
        if key in seen:
            return
        seen.add(key)
        yield Partition(" + ".join(p for p in label_parts if p), key)

    for choice in itertools.product(*opts):
        yield from emit([c[0] for c in choice], [r for c in choice for r in c[1]])
    # fast+slow pairings: one node of a family with k nodes of another that has k times as many
    for a, b in itertools.permutations(range(len(fams)), 2):
        fa, fb = fams[a], fams[b]
        if len(fb.nodes) % len(fa.nodes) or (len(fb.nodes) == len(fa.nodes) and a > b):
            continue
        k = len(fb.nodes) // len(fa.nodes)
        pairs = [
            (Piece(x, 0, fa.spec.count),) + tuple(Piece(y, 0, fb.spec.count) for y in fb.nodes[i * k : (i + 1) * k])
            for i, x in enumerate(fa.nodes)
        ]
        more = f"{k} {fb.spec.gpu.name} nodes" if k > 1 else f"{fb.spec.gpu.name} node"
        label = f"{len(pairs)} x ({fa.spec.gpu.name} node + {more})"
        rest = [o for i, o in enumerate(opts) if i not in (a, b)]
        for choice in itertools.product(*rest):
            yield from emit([label] + [c[0] for c in choice], list(pairs) + [r for c in choice for r in c[1]])
