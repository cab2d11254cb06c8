"""Which plan rank a torchrun process is: the mapping follows the cluster file.

torchrun numbers processes by node and local rank. The plan numbers its ranks group by group, and
a group may span nodes, so the two orders differ. Here a process finds its device from where it
runs — node n (torchrun's node rank, `GROUP_RANK`; `--node` or HEXISEQ_NODE overrides it for c10d
rendezvous, which numbers nodes by arrival: a Slurm job sets HEXISEQ_NODE on each node) and local
rank l — as the l-th device, in cluster order, that the plan uses on the n-th cluster node the plan
uses; its plan rank is that device's position in the plan. The process group is then created with
the plan's rank numbers.

Checked on every process before the process group exists (one clear line on mismatch): the world
size, the node count and this node's process count against the plan and the cluster file; after it
exists (`check_placement`, collective): no device claimed twice, and on CUDA each GPU's model.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PlanError
from ..plan import Plan


@dataclass(frozen=True)
class Placement:
    rank: int  # the plan's rank of this process
    device: int  # cluster device index
    node: int  # index among the plan's nodes (torchrun node rank)
    local_rank: int  # torchrun's local rank
    cuda_index: int  # the GPU index on the node (the device's local rank in the cluster file)
    host: str


def plan_nodes(plan: Plan, cluster: Any | None) -> list[list[int]]:
    """The devices the plan uses on each node that it uses (cluster order); without a cluster, one
    node holding the plan's devices in rank order."""
    used = set(plan.rank_devices)
    if cluster is None:
        return [list(plan.rank_devices)]
    bad = sorted(d for d in used if not 0 <= d < cluster.size)
    if bad:
        raise PlanError(
            f"plan {plan.name!r} uses devices {bad} that cluster {cluster.name!r} does not have (0..{cluster.size - 1})"
        )
    return [devs for devs in ([d for d in node if d in used] for node in cluster.node_devices) if devs]


def placement_from_env(
    plan: Plan, cluster: Any | None, env: Mapping[str, str] = os.environ, node: int | None = None
) -> Placement:
    """This torchrun process's place in the plan; PlanError (one line) when torchrun's world does
    not match the plan on its cluster."""
    world = int(env["WORLD_SIZE"])
    nnodes = int(env.get("GROUP_WORLD_SIZE", "1"))
    node = int(env.get("HEXISEQ_NODE") or env.get("GROUP_RANK", "0")) if node is None else node
    local, local_world = int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", str(world)))
    nodes = plan_nodes(plan, cluster)
    where = f"cluster {cluster.name!r}" if cluster is not None else "no cluster"
    if world != plan.world_size:
        raise PlanError(
            f"torchrun started {world} processes but plan {plan.name!r} has {plan.world_size} ranks "
            f"({', '.join(str(len(n)) for n in nodes)} on its {len(nodes)} node{'s' * (len(nodes) > 1)}): "
            "start one process per device of the plan"
        )
    if nnodes != len(nodes):
        raise PlanError(
            f"torchrun has {nnodes} node{'s' * (nnodes > 1)} (--nnodes) but plan {plan.name!r} uses {len(nodes)} "
            f"nodes of {where}: run one torchrun agent per node"
        )
    if not 0 <= node < len(nodes):
        raise PlanError(f"node rank {node} is outside the plan's nodes 0..{len(nodes) - 1}")
    if local_world != len(nodes[node]):
        raise PlanError(
            f"node {node} runs {local_world} processes (--nproc-per-node) but plan {plan.name!r} uses "
            f"{len(nodes[node])} devices there ({where}, devices {nodes[node]}): "
            f"use --nproc-per-node {len(nodes[node])} on that node"
        )
    device = nodes[node][local]
    cuda = cluster.devices[device].local_rank if cluster is not None else local
    return Placement(plan.rank_devices.index(device), device, node, local, cuda, socket.gethostname())


def check_placement(plan: Plan, me: Placement, cluster: Any | None) -> list[dict[str, Any]]:
    """Collective, after the process group exists: every rank's placement, gathered; PlanError on
    every rank when two processes claim one device (say, two agents given the same node rank).
    Returns the placements in rank order."""
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.get_device_name(me.cuda_index) if torch.cuda.is_available() else "cpu"
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {**me.__dict__, "gpu": gpu})
    seen: dict[int, int] = {}
    for p in everyone:
        if p["device"] in seen:
            raise PlanError(
                f"ranks {seen[p['device']]} and {p['rank']} both run device {p['device']} (node {p['node']}, "
                f"local rank {p['local_rank']}): each torchrun agent needs its own --node-rank"
            )
        seen[p["device"]] = p["rank"]
    return everyone
