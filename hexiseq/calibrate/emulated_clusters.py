"""Which clusters a CPU world can emulate, and how (the mechanism is hexiseq/runtime/emulation.py).

Emulated device types are the `CPU-x<f>` entries of data/gpus-cpu.yaml: one CPU rank (one torch
thread) slowed f times, f >= 1 (CPU-x1: one unpaced core). Their cost-model figures are the
reference profile's CPU-x1 figures divided by f (rates; latencies and memory stay), see
`derived_type` and data/clusters/README.md. A cluster whose devices are all such types can be run
on CPU ranks: rank r is slowed by its device's f, and every pair of ranks on different nodes gets
an emulated link with the cluster's bandwidth and latency between them (the cost model's link
matrices, achieved fractions included); pairs inside a node use the real loopback link.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace

import torch

from ..costmodel.arrays import link_matrices
from ..errors import HexiSeqError, SpecError
from ..plan import Plan
from ..runtime.emulation import Emulation
from ..specs import ClusterSpec, GPUType, gpu_catalog, load_cluster

CPU_TYPE = re.compile(r"^CPU-x(\d+(?:\.\d+)?)$")
RATE_FIELDS = (
    "peak_bf16_tflops",
    "hbm_bandwidth_gbps",
)  # scaled by 1/f; efficiencies, links, latencies and memory stay
TIME_FIELDS = ("op_overhead_us",)  # scaled by f: a rank slowed f times takes f times as long per operator


def at_factor(fields: Mapping[str, float], factor: float) -> dict[str, float]:
    """One unpaced core's figures as a CPU-x<factor> rank's: rates over f, per-operator times times f
    (`factor` < 1 goes back: a rank's figures as one core's, with 1/f)."""
    return {k: v / factor if k in RATE_FIELDS else v * factor if k in TIME_FIELDS else v for k, v in fields.items()}


def cpu_factor(gpu: GPUType | str) -> float | None:
    """f of an emulated CPU type `CPU-x<f>`, None for any other type."""
    m = CPU_TYPE.match(gpu if isinstance(gpu, str) else gpu.name)
    return float(m.group(1)) if m else None


def cpu_types() -> dict[float, str]:
    """{f: type name} of the emulated CPU types in the catalog, by factor."""
    out = {}
    for name in gpu_catalog():
        f = cpu_factor(name)
        if f is not None:
            out[f] = name
    return dict(sorted(out.items()))


def derived_type(base: GPUType, factor: float, name: str | None = None) -> GPUType:
    """The emulated type `CPU-x<factor>` from the figures of one unpaced CPU rank (`base`): its
    compute and memory rates divided by the factor, its per-operator time multiplied by it (a rank
    slowed f times runs every kernel f times longer). The link figures stay: the loopback between
    processes is not slowed (an emulated rank's compute sleep does not slow its transfers)."""
    if not factor >= 1:
        raise SpecError(f"an emulated CPU type needs a slowdown factor >= 1, got {factor}")
    scaled = at_factor({f: getattr(base, f) for f in (*RATE_FIELDS, *TIME_FIELDS)}, factor)
    return replace(base, name=name or f"CPU-x{factor:g}", **scaled, sources=dict(base.sources))


def check_emulated(cluster: ClusterSpec) -> None:
    """Refuse a cluster with a device that is not an emulated CPU type (before any rank starts)."""
    bad = sorted({d.gpu.name for d in cluster.devices if cpu_factor(d.gpu) is None})
    if bad:
        known = ", ".join(cpu_types().values())
        raise SpecError(
            f"cluster {cluster.name!r} has devices of type {', '.join(bad)}: a CPU world can only emulate "
            f"the CPU types of data/gpus-cpu.yaml ({known}); use a cluster of those (e.g. cpu-4)"
        )


def emulation_for(plan: Plan, cluster: ClusterSpec) -> Emulation:
    """The emulation that runs `plan` on CPU ranks as if on `cluster` (module doc)."""
    check_emulated(cluster)
    plan.check(cluster)
    dev = list(plan.rank_devices)
    bw, lat = link_matrices(cluster)  # bytes/s with the achieved fractions, seconds: what the cost model charges
    n = len(dev)
    gbps = [[0.0] * n for _ in range(n)]
    lat_us = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(n):
            if a != b and not cluster.same_node(dev[a], dev[b]):
                gbps[a][b] = float(bw[dev[a], dev[b]]) / 1e9
                lat_us[a][b] = float(lat[dev[a], dev[b]]) * 1e6
    slow = tuple(cpu_factor(cluster.devices[d].gpu) or 1.0 for d in dev)
    return Emulation(slow, tuple(map(tuple, gbps)), tuple(map(tuple, lat_us)), source=f"cluster {cluster.name}")


HEADROOM = 2.0  # local ranks use at most 1/HEADROOM of the cores (module doc)


def local_factor(world: int, cores: int | None = None) -> float:
    """The slowdown that lets `world` one-thread ranks share this machine's cores with room to spare:
    the smallest catalog CPU factor >= HEADROOM x world / cores. The room is what keeps the emulation
    true on a machine that others load too: an operator slowed by up to f x by a neighbour still fits
    its f x budget (the rank just sleeps less)."""
    cores = cores or os.cpu_count() or 1
    need = HEADROOM * world / cores
    for f in cpu_types():
        if f >= need - 1e-9:
            return f
    raise HexiSeqError(
        f"{world} CPU ranks on {cores} cores would each need to be 1/{need:g} of a core, slower than the slowest "
        f"emulated CPU type ({', '.join(cpu_types().values())}); use at most "
        f"{int(max(cpu_types()) * cores / HEADROOM)} ranks"
    )


def local_cluster(world: int, cores: int | None = None, nic_gbps: float | None = None) -> ClusterSpec:
    """This machine as a cluster of `world` CPU ranks in one node, each of type CPU-x<local_factor>."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise HexiSeqError(f"world must be a positive number of ranks, got {world!r}")
    f = local_factor(world, cores)
    name = cpu_types()[f]
    gpu = gpu_catalog()[name]
    return ClusterSpec.from_nodes(
        f"cpu-local-{world}",
        [(name, world, nic_gbps or gpu.link_bandwidth_gbps)],
        description=f"{world} CPU ranks of this machine ({name}: one core slowed {f:g}x so that "
        f"{world} ranks share {cores or os.cpu_count()} cores)",
    )


def emulation_of(plan: Plan) -> Emulation | None:
    """How CPU ranks emulate the plan's cluster when its devices are emulated CPU types
    (this module); None for any other cluster, or on a CUDA machine."""
    if not plan.cluster or torch.cuda.is_available():
        return None
    try:
        cluster = load_cluster(plan.cluster)
    except HexiSeqError:
        return None
    if any(cpu_factor(d.gpu) is None for d in cluster.devices):
        return None
    return emulation_for(plan, cluster)
