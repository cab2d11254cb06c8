"""The structure an optimization model is built for: a layout (devices, their HP groups in ring
order, the head split) and its classes of identical ranks.

A layout fixes everything of a plan but the sizes (chunk lengths and token shards); the model
(planner/layout_model.py) chooses those. Ranks of one group with the same device type, node, links and
heads form a class: permuting them maps the problem onto itself, so one shard variable per class
loses nothing in the relaxation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Group, Plan
from ..specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class Layout:
    """The structure a model is built for: groups (device indices, ring order) and heads per device."""

    groups: tuple[tuple[int, ...], ...]
    heads: tuple[tuple[int, ...], ...]

    @property
    def k(self) -> int:
        return len(self.groups)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for g in self.groups for d in g)

    @classmethod
    def of(cls, plan: Plan) -> Layout:
        """The layout a plan has: its groups in ring order and their heads (its sizes left out)."""
        return cls(tuple(g.devices for g in plan.groups), tuple(g.heads for g in plan.groups))


def unit_plan(layout: Layout, model: ModelSpec) -> Plan:
    """A valid plan of this layout with unit-free sizes (chunk_len = group size, 2 tokens per rank,
    block 1): the exchange schedule and the coefficients do not depend on the sizes."""
    groups = tuple(Group(devs, len(devs), (2,) * len(devs), heads) for devs, heads in zip(layout.groups, layout.heads))
    return Plan(sum(2 * len(d) for d in layout.groups), model.heads, model.kv_heads, groups, 1, "unit")


def rank_classes(cluster: ClusterSpec, layout: Layout, aggregate: bool = True) -> np.ndarray:
    """[R] class of every rank: identical members of a group (type, node, NIC, link, heads) share one
    (every rank its own without `aggregate`)."""
    keys: dict[tuple, int] = {}
    out = []
    for g, (devs, heads) in enumerate(zip(layout.groups, layout.heads)):
        for d, h in zip(devs, heads):
            dev = cluster.devices[d]
            key = (g, dev.gpu.name, dev.node, dev.nic_gbps, dev.link_bandwidth_gbps, h) if aggregate else (d,)
            out.append(keys.setdefault(key, len(keys)))
    return np.array(out, dtype=np.int64)
