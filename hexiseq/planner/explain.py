"""Infeasibility explained: why no plan fits, and what would make one fit.

The memory side of the cost model's linear form is solved as a small LP: spread tokens and chunks
so that the most loaded device is as little loaded as possible (λ = max_r memory_r / capacity_r,
heads even inside node groups, fractional tokens). λ > 1 proves that nothing fits under the cost
model with that layout family; λ is then re-solved with recompute on, with ZeRO-3, with more
devices and for shorter sequences to say what would fit. No solver output reaches the user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..specs import GIB, ClusterSpec, ModelSpec, Workload
from .groupings import domains, head_units


@dataclass
class MemoryReport:
    """The least memory a workload needs on a cluster (continuous relaxation)."""

    load: float  # λ: the most loaded device's memory / capacity at the best spread (inf: no layout)
    needed_gib: float  # total memory at that spread
    capacity_gib: float  # what the devices have
    binding: list[int] = field(default_factory=list)  # device indices at the maximum load


def _grouping(cluster: ClusterSpec, model: ModelSpec) -> list[list[int]]:
    """Node domains cut into sub-groups whose size divides the head units (even heads)."""
    units = head_units(model)
    out = []
    for dom in domains(cluster):
        k = max(d for d in range(1, len(dom) + 1) if len(dom) % d == 0 and units % d == 0)
        out.extend(dom[i : i + k] for i in range(0, len(dom), k))
    return out


def memory_report(cluster: ClusterSpec, model: ModelSpec, workload: Workload) -> MemoryReport:
    """Solve min λ over token/chunk spreads (LP, HiGHS through Pyomo)."""
    import pyomo.environ as pyo
    from pyomo.contrib.solver.common.factory import SolverFactory

    from ..costmodel.linear import linear_form

    groups = _grouping(cluster, model)
    cap_total = sum(d.gpu.memory_bytes for d in cluster.devices) / GIB
    if workload.seq_len < 2 * len(groups):
        groups = [sum(groups, [])[: max(1, workload.seq_len // 2)]]
    heads = [[model.heads // len(g)] * len(g) for g in groups]
    lf = linear_form(cluster, model, workload, groups, heads=heads)
    R, k = lf.num_ranks, len(groups)
    m = pyo.ConcreteModel()
    m.s = pyo.Var(range(R), within=pyo.NonNegativeReals)
    m.L = pyo.Var(range(k), within=pyo.NonNegativeReals)
    m.lam = pyo.Var(within=pyo.NonNegativeReals)
    m.c = pyo.ConstraintList()
    m.c.add(sum(2 * m.L[g] for g in range(k)) == workload.seq_len)
    r0 = 0
    for g, devs in enumerate(groups):
        m.c.add(sum(m.s[r] for r in range(r0, r0 + len(devs))) == 2 * m.L[g])
        r0 += len(devs)

    def expr(aff):
        e = aff.const / GIB
        for key, c in aff.coef.items():
            e = e + (c / GIB) * (m.s[key[1]] if key[0] == "s" else m.L[key[1]])
        return e

    mems = []
    for r in range(R):
        cap = lf.capacity_bytes[r] / GIB
        pieces = lf.memory_pieces(r)
        for p in pieces:
            m.c.add(expr(p) <= m.lam * cap)
        mems.append(pieces)
    m.o = pyo.Objective(expr=m.lam)
    res = SolverFactory("highs").solve(m, load_solutions=False, raise_exception_on_nonoptimal_result=False, time_limit=30)
    if res.incumbent_objective is None:
        return MemoryReport(math.inf, math.inf, cap_total)
    res.solution_loader.load_vars()
    lam = float(pyo.value(m.lam))
    used = [max(pyo.value(expr(p)) for p in pieces) for pieces in mems]
    binding = [lf.rank_device[r] for r in range(R) if used[r] >= lam * lf.capacity_bytes[r] / GIB * (1 - 1e-4)]
    return MemoryReport(lam, float(sum(used)), cap_total, sorted(binding))


def _scaled(cluster: ClusterSpec, factor: int) -> ClusterSpec:
    return ClusterSpec(f"{cluster.name}x{factor}", cluster.nodes * factor, cluster.inter_node_latency_us, (), cluster.description)


def explain_infeasible(cluster: ClusterSpec, model: ModelSpec, workload: Workload) -> str:
    """A plain-language explanation of why nothing fits, with what would make it fit."""
    S, B = workload.seq_len, workload.block_size
    if S % (2 * B):
        return (f"the sequence length {S} is not a multiple of 2 x block size ({2 * B}): zigzag chunks must be whole blocks. "
                f"Use --seq-len {S - S % (2 * B) or 2 * B} or --block-size {math.gcd(S // 2, B) if S % 2 == 0 else 1}.")
    rep = memory_report(cluster, model, workload)
    lines = []
    if rep.load <= 1.0:
        lines.append(
            f"no plan fits on {cluster.name}, although spreading tokens perfectly evenly by memory would just fit "
            f"({rep.load:.0%} of the fullest device): whole blocks of {B} tokens and whole KV heads per device leave too little room."
        )
    else:
        lines.append(
            f"{model.name} at {S:,} tokens does not fit on {cluster.name}: it needs at least {rep.needed_gib:,.0f} GiB "
            f"(model states, activations, attention and K/V buffers, spread as evenly as memory allows), "
            f"the {cluster.size} GPUs have {rep.capacity_gib:,.0f} GiB; the fullest device would need {rep.load:.0%} of its memory."
        )
    if rep.binding:
        types: dict[str, int] = {}
        for d in rep.binding:
            types[cluster.devices[d].gpu.name] = types.get(cluster.devices[d].gpu.name, 0) + 1
        lines.append("binding devices (full at the best spread): " + ", ".join(f"{n} x {t}" for t, n in types.items())
                     + f" (e.g. device {rep.binding[0]} {cluster.devices[rep.binding[0]].name})")
    fixes = []
    if not workload.activation_checkpointing:
        r2 = memory_report(cluster, model, replace(workload, activation_checkpointing=True))
        fixes.append(f"turn on activation checkpointing (--recompute): the fullest device would need {r2.load:.0%}"
                     + (" -> fits" if r2.load <= 1 else " (not enough alone)"))
    if workload.param_sharding == "replicated":
        r3 = memory_report(cluster, model, replace(workload, param_sharding="zero3"))
        fixes.append(f"shard parameters and optimizer states (--sharding zero3): {r3.load:.0%}" + (" -> fits" if r3.load <= 1 else ""))
    for factor in (2, 4, 8):
        if cluster.size * factor > 4096:
            break
        r4 = memory_report(_scaled(cluster, factor), model, workload)
        if r4.load <= 1:
            fixes.append(f"more devices: {factor} x the cluster ({cluster.size * (factor - 1)} more GPUs like these) would fit ({r4.load:.0%})")
            break
    else:
        fixes.append("more devices: even 8 x the cluster would not fit with these settings")
    lo, hi = 0, S // (2 * B)
    while hi - lo > 1:  # longest sequence (in units of 2 blocks) whose best spread fits
        mid = (lo + hi) // 2
        if memory_report(cluster, model, replace(workload, seq_len=mid * 2 * B)).load <= 1:
            lo = mid
        else:
            hi = mid
    if lo > 0:
        fixes.append(f"a shorter sequence: at most about {lo * 2 * B:,} tokens fit with these settings")
    else:
        fixes.append("a shorter sequence will not help: the model states alone do not fit")
    lines.append("what would make it fit:")
    lines.extend(f"  - {f}" for f in fixes)
    return "\n".join(lines)
