"""Aggregation of identical devices in the MILP: which ranks are interchangeable, and a check that
the cost model's linear form really is symmetric in them.

Ranks of one group on identical devices (same GPU type, node, NIC and link) can share one shard
and one head variable. That is exact for the LP relaxation only when permuting them maps the
constraint system onto itself: then averaging an optimal solution over the permutations gives an
equally good symmetric one, so the aggregated relaxation's bound is a bound of the full model.
`symmetric` verifies it on the actual coefficients (each member sees itself, each peer class and
the rest with the same coefficients as the first member).
"""

from __future__ import annotations

from ..specs import ClusterSpec


def classes(cluster: ClusterSpec, groups: list[list[int]]) -> list[list[list[int]]]:
    """Per group, lists of group-local positions of identical devices (GPU type and node)."""
    out = []
    for g in groups:
        by: dict[tuple, list[int]] = {}
        for i, d in enumerate(g):
            dev = cluster.devices[d]
            by.setdefault((dev.gpu.name, dev.node, dev.nic_gbps, dev.link_bandwidth_gbps), []).append(i)
        out.append(list(by.values()))
    return out


def sig(x: float) -> float:
    return float(f"{x:.9g}")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)


def _canon(r: int, aff, cls_of_rank: list[int]) -> dict | None:
    """The affine seen from rank r: its own variables as "self", others by class; None when two
    peers of one class carry different coefficients (then permuting them is not a symmetry)."""
    out: dict = {"const": aff.const}
    for key, c in aff.coef.items():
        if key[0] == "L":
            ck = key
        else:
            ck = (key[0], "self" if key[1] == r else cls_of_rank[key[1]]) + tuple(key[2:])
        prev = out.get(ck)
        if prev is None:
            out[ck] = c
        elif not _close(prev, c):
            return None
    return out


def _same(a: dict | None, b: dict | None) -> bool:
    return a is not None and b is not None and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)


def symmetric(lf, cls_of_rank: list[int], members: list[list[int]]) -> bool:
    """True when the linear form is invariant under permuting the members of each class: every
    member sees itself, its peers and the rest with the same coefficients as the first member."""

    def forms(r: int) -> list:
        out = [_canon(r, p, cls_of_rank) for term in lf.time_terms[r] for p in term]
        out.append(_canon(r, lf.memory[r], cls_of_rank))
        out.extend(_canon(r, p, cls_of_rank) for p in lf.kv_buffer[r])
        return out

    for mem in members:
        if len(mem) < 2:
            continue
        ref = forms(mem[0])
        if any(f is None for f in ref):
            return False
        for r in mem[1:]:
            other = forms(r)
            if len(other) != len(ref) or not all(_same(a, b) for a, b in zip(ref, other)):
                return False
    return True
