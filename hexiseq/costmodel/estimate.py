"""The estimate of one plan: iteration time and throughput (the step replay's, simulate.py), every
rank's time by phase, memory against capacity, MFU and the distance to the compute bound.

- iteration_time_s: the replayed iteration (simulate.py, the judge); tokens_per_s = B·S / it.
- ranks[r].time_s: the rank's seconds per phase (simulate.PHASES), summing to the iteration time;
  busy_s is everything but "wait".
- memory: memory.py's categories per rank; fits when every rank's sum ≤ its capacity.
- MFU = model FLOPs / (iteration time × Σ peak BF16 FLOP/s of all cluster devices, used or not);
  efficiency_vs_bound = tokens_per_s / compute_bound (bound.py), the balanced, communication- and
  recompute-free iteration under the same kernel-time model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..plan import Plan
from ..specs import GIB, ClusterSpec, ModelSpec, Workload
from .bound import compute_bound
from .durations import durations
from .kernels import CostOptions
from .memory import MEMORY_KEYS, memory_bytes
from .simulate import PHASES, one_replica, simulate_durations


@dataclass
class RankEstimate:
    rank: int
    device: int
    gpu: str
    group: int
    tokens: int
    heads: int
    time_s: dict[str, float]
    busy_s: float
    idle_s: float
    memory_gib: float
    capacity_gib: float
    memory_breakdown_gib: dict[str, float]
    fits: bool


@dataclass
class OOM:
    rank: int
    device: int
    gpu: str
    memory_gib: float
    capacity_gib: float
    shortfall_gib: float

    @property
    def message(self) -> str:
        return (
            f"rank {self.rank} (device {self.device}, {self.gpu}) needs {self.memory_gib:.2f} GiB "
            f"but has {self.capacity_gib:.2f} GiB: short by {self.shortfall_gib:.2f} GiB"
        )


@dataclass
class Estimate:
    plan: str
    iteration_time_s: float
    tokens_per_s: float
    model_flops: float
    mfu: float
    bound_tokens_per_s: float
    efficiency_vs_bound: float
    fits: bool
    critical_rank: int
    critical_phase: str
    ranks: list[RankEstimate]
    oom: list[OOM] = field(default_factory=list)
    passes: dict[str, tuple[float, float]] = field(default_factory=dict)  # simulate.SimResult.passes

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops": self.model_flops,
            "mfu": self.mfu,
            "bound_tokens_per_s": self.bound_tokens_per_s,
            "efficiency_vs_bound": self.efficiency_vs_bound,
            "fits": self.fits,
            "critical_rank": self.critical_rank,
            "critical_phase": self.critical_phase,
            "passes": {k: {"count": c, "seconds": s} for k, (c, s) in self.passes.items()},
            "oom": [{**asdict(o), "message": o.message} for o in self.oom],
            "ranks": [asdict(r) for r in self.ranks],
        }

    def summary(self) -> str:
        lines = [
            f"plan {self.plan!r}: {self.iteration_time_s:.4g} s/iteration, {self.tokens_per_s:,.0f} tokens/s, "
            f"MFU {self.mfu:.1%}, {self.efficiency_vs_bound:.1%} of the compute bound "
            f"({self.bound_tokens_per_s:,.0f} tokens/s)",
            f"critical path: rank {self.critical_rank} ({self.ranks[self.critical_rank].gpu}), "
            f"largest phase {self.critical_phase}",
        ]
        lines += [o.message for o in self.oom] or ["memory: every rank fits"]
        return "\n".join(lines)


def estimate(
    plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> Estimate:
    """Time, memory and throughput of one training iteration of `plan` (module doc)."""
    one_replica(plan)
    d = durations(plan, cluster, model, workload, options)
    a = d.a
    sim = simulate_durations(d)
    it = sim.iteration_time_s
    phases = sim.phases
    mem = memory_bytes(a, model, workload, d.recv_bytes, options)
    total_mem = sum(mem.values())
    flops = model.training_flops(workload.seq_len) * workload.global_batch
    bound = compute_bound(cluster, model, workload, options)
    crit = sim.critical_rank
    ranks, oom = [], []
    for r in range(a.R):
        dev = cluster.devices[int(a.dev[r])]
        fits = bool(total_mem[r] <= a.capacity[r])
        ranks.append(
            RankEstimate(
                rank=r,
                device=dev.index,
                gpu=dev.gpu.name,
                group=int(a.grp[r]),
                tokens=int(a.s[r]),
                heads=int(a.eta[r]),
                time_s={p: float(phases[p][r]) for p in PHASES},
                busy_s=float(it - phases["wait"][r]),
                idle_s=float(phases["wait"][r]),
                memory_gib=float(total_mem[r] / GIB),
                capacity_gib=float(a.capacity[r] / GIB),
                memory_breakdown_gib={k: float(mem[k][r] / GIB) for k in MEMORY_KEYS},
                fits=fits,
            )
        )
        if not fits:
            oom.append(
                OOM(
                    r,
                    dev.index,
                    dev.gpu.name,
                    float(total_mem[r] / GIB),
                    float(a.capacity[r] / GIB),
                    float((total_mem[r] - a.capacity[r]) / GIB),
                )
            )
    busy_phases = [p for p in PHASES if p != "wait"]
    crit_phase = max(busy_phases, key=lambda p: phases[p][crit])
    tps = workload.tokens / it
    return Estimate(
        plan=plan.name,
        iteration_time_s=it,
        tokens_per_s=tps,
        model_flops=flops,
        mfu=flops / (it * cluster.peak_pflops * 1e15),
        bound_tokens_per_s=bound,
        efficiency_vs_bound=tps / bound,
        fits=not oom,
        critical_rank=crit,
        critical_phase=crit_phase,
        ranks=ranks,
        oom=oom,
        passes=dict(sim.passes),
    )
