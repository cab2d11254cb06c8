"""Published points through the public path: `hexiseq estimate --plan` (the cost model's
`costmodel.step.estimate_step`) with the point's cluster, layout, recompute and stack.

A point the public path can express becomes one joint plan: dp replicas on consecutive ranks, each
the point's layout (ring over cp ranks, one Ulysses group of hp ranks, or cp groups of hp), each
processing its share of the global batch as one sequence per micro-step, under ZeRO-3 over all
devices; the cluster is the job's GPUs, gpus_per_node to a node. Its prediction must equal the
validation benchmark's (`fidelity.predict`) exactly: the same cost model on the same inputs.
`public_reason` says why a point cannot be expressed (the benchmark's own approximations that the
public path does not have). GPUs of published.yaml's `extra_gpus` are not in the catalog a cluster
file names: such points go through the Python function (`estimate_step`) instead of the command.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..costmodel.step import estimate_step
from ..plan import Plan, Sharding, ShardingScope, ShardingStage, symmetric_plan
from ..specs import ClusterSpec, GPUType, Workload, load_gpu_catalog
from ..specs.identity import model_record
from .fidelity import Calibration, Point, clusters_of, excluded_reason, workload_of


def public_reason(p: Point) -> str | None:
    """Why `hexiseq estimate` cannot express a published point (None: it can)."""
    if excluded_reason(p):
        return "pipeline parallelism: not modelled anywhere (the benchmark excludes the point too)"
    if p.tp > 1:
        return (
            "tensor parallelism: the benchmark's approximation (a TP group as one rank with tp x the rates, plus "
            "exposed sequence-parallel collectives) is no layout a plan can hold"
        )
    if p.micro_batch > 1:
        return (
            "micro-batches of m > 1 sequences: the benchmark runs m sequences per micro-step (parameter collectives "
            "once per m); a plan's replica runs one sequence per micro-step"
        )
    if p.sharding != "zero3":
        return (
            f"the benchmark maps {p.source}'s optimizer as {p.sharding!r} gradients with the optimizer state sharded "
            "over all ranks (Megatron's distributed optimizer), which is none of the plan's strategies (zero1 "
            "over all devices differs by up to 1%)"
        )
    return None


@dataclass(frozen=True)
class PublicRun:
    """A published point as the public path takes it."""

    point: Point
    plan: Plan  # dp replicas of the point's layout; ZeRO-3 over all devices
    cluster: ClusterSpec  # the job's GPUs
    workload: Workload
    through_cli: bool  # the GPU is a catalog GPU (a cluster file can name it)

    def cluster_file(self) -> dict:
        """The cluster as a cluster YAML mapping (data/clusters/README.md)."""
        nodes = [{"gpu": n.gpu.name, "count": n.count, "nic_gbps": n.nic_gbps} for n in self.cluster.nodes]
        return {"name": self.cluster.name, "nodes": nodes}


def public_run(p: Point, gpu: GPUType) -> PublicRun:
    """The joint plan, cluster and workload of an expressible point (module doc); `gpu`: its GPU type."""
    if (why := public_reason(p)) is not None:
        raise ValueError(f"{p.id}: not expressible through the public path: {why}")
    _, job = clusters_of(p, gpu)
    m, n = p.model, p.cp * p.hp
    steps = workload_of(p).global_batch  # sequences per replica per step
    replicas = [
        symmetric_plan(range(i * n, (i + 1) * n), p.seq_len, m.heads, m.kv_heads, p.cp, p.hp, name=f"{p.id}.r{i}")
        for i in range(p.dp)
    ]
    meta = {"recompute": p.recompute, **({"model_spec": spec} if (spec := model_record(m)) else {})}
    plan = Plan.joint(replicas, [steps] * p.dp, Sharding(ShardingStage.ZERO3, ShardingScope.ALL), p.id, meta)
    plan = dataclasses.replace(plan, cluster=job.name, model=m.name)
    wl = dataclasses.replace(workload_of(p), global_batch=steps * p.dp)
    return PublicRun(p, plan, job, wl, p.gpu in load_gpu_catalog())


def public_predict(run: PublicRun, cal: Calibration) -> float:
    """Tokens/s per GPU of the public path's estimate (`estimate_step` on the point's stack)."""
    step = estimate_step(run.plan, run.cluster, run.point.model, run.workload, cal.options_for(run.point))
    return step.tokens_per_s / run.cluster.size
