"""Infeasibility explained: why no plan fits, and what would make one fit.

The memory side of the cost model's linear form is solved as a small LP: spread tokens and chunks
so that the most loaded device is as little loaded as possible (λ = max_r memory_r / capacity_r,
heads even inside node groups, fractional tokens). λ > 1 proves that nothing fits under the cost
model with that layout family; λ is then re-solved with full recompute, with ZeRO-3, with more
devices and for shorter sequences to say what would fit. The workload needs a concrete recompute
policy (the planner explains "auto" with "full", the one that needs the least memory).
`may_fit` is a much cheaper, solver-free necessary condition the planner uses to skip a policy. No
solver output reaches the user.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ..costmodel.kernels import CostOptions
from ..costmodel.memory import memory_terms, state_bytes
from ..specs import GIB, ClusterSpec, ModelSpec, RecomputePolicy, Workload
from .candidates import domains, even_heads, head_units
from .layout import Layout


@dataclass
class MemoryReport:
    """The least memory a workload needs on a cluster (continuous relaxation)."""

    load: float  # λ: the most loaded device's memory / capacity at the best spread (inf: no layout)
    needed_gib: float  # total memory at that spread
    capacity_gib: float  # what the devices have
    binding: list[int] = field(default_factory=list)  # device indices at the maximum load


def _layout(cluster: ClusterSpec, model: ModelSpec):
    """Node domains cut into sub-groups whose size divides the head units (even heads), node order."""
    units = head_units(model)
    groups = []
    for dom in domains(cluster, range(cluster.size)):
        k = max(d for d in range(1, len(dom) + 1) if len(dom) % d == 0 and units % d == 0)
        groups.extend(tuple(dom[i : i + k]) for i in range(0, len(dom), k))
    return Layout(tuple(groups), tuple(even_heads(model, len(g)) for g in groups))


def memory_report(cluster: ClusterSpec, model: ModelSpec, workload: Workload) -> MemoryReport:
    """Solve min λ over token/chunk spreads (LP, HiGHS through Pyomo): memory.py's terms, the same
    forms the planner's model constrains (LayoutModel.memory_forms)."""
    import pyomo.environ as pyo
    from pyomo.contrib.solver.common.factory import SolverFactory

    from .layout_model import LayoutModel

    layout = _layout(cluster, model)
    B = workload.block_size
    wl = workload if workload.seq_len >= 2 * B * layout.k else replace(workload, seq_len=2 * B * layout.k)
    lm = LayoutModel(cluster, model, wl, layout, memory=False)
    forms = lm.memory_forms()
    cap_total = sum(d.gpu.memory_bytes for d in cluster.devices) / GIB
    m = pyo.ConcreteModel()
    m.s = pyo.Var(range(lm.C), within=pyo.NonNegativeReals)
    m.n = pyo.Var(range(lm.k), within=pyo.NonNegativeReals)
    m.lam = pyo.Var(within=pyo.NonNegativeReals)
    m.c = pyo.ConstraintList()
    m.c.add(sum(m.n[g] for g in range(lm.k)) == float(lm.nb))
    for g in range(lm.k):
        m.c.add(sum(float(lm.members[c]) * m.s[c] for c in range(lm.C) if lm.cls_group[c] == g) == 2.0 * B * m.n[g])
    exprs = []
    for c, f in enumerate(forms):
        base = f["const"] + f["s"] * m.s[c] + f["n"] * m.n[f["group"]]
        pieces = [base + a * m.n[h1] + b * m.n[h2] for a, h1, b, h2 in f["kv"]] or [base]
        for e in pieces:
            m.c.add(e / GIB <= m.lam * f["capacity"] / GIB)
        exprs.append(pieces)
    m.obj = pyo.Objective(expr=m.lam)
    # one thread, as every planner LP (planner/lp.py): HiGHS keeps the first solve's thread scheduler
    res = SolverFactory("highs").solve(
        m, load_solutions=False, raise_exception_on_nonoptimal_result=False, solver_options={"threads": 1}
    )
    if res.incumbent_objective is None:
        return MemoryReport(math.inf, math.inf, cap_total, [])
    res.solution_loader.load_vars()
    lam = float(pyo.value(m.lam))
    used = [max(pyo.value(e) for e in pieces) for pieces in exprs]
    binding = sorted(
        int(layout.devices[r])
        for r in range(len(lm.cls))
        if used[lm.cls[r]] >= lam * forms[lm.cls[r]]["capacity"] * (1 - 1e-4)
    )
    needed = float(sum(used[lm.cls[r]] for r in range(len(lm.cls))) / GIB)
    return MemoryReport(lam, needed, cap_total, binding)


def may_fit(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    devices: Iterable[int] | None = None,
) -> bool:
    """A cheap, provable memory check (no solver): False only when no plan on any subset of the
    devices (of `devices`, default all) can fit under the workload's (concrete) recompute policy.

    Summed over the ranks of any plan, memory.py's per-rank terms are at least: the model states
    (zero3: all of them once, plus each rank's gathered buffers; replicated: all of them on every
    rank), each rank's reserve, and per token c_s on the token side and H·c_w + H_kv·c_u on the head
    side (Σ_{r∈g} η_r = H, Σ κ_r ≥ H_kv in every group, per w = η·L and u = κ·L, and the group's 2·L
    tokens, so per token of the sequence: (H·c_w + H_kv·c_u)/2); K/V buffers and chunked logits only
    add. A plan fits only if that is at most the capacity of its devices."""
    terms = memory_terms(model, workload, 1, options=options)
    per_tok = (
        sum(t.c_s for t in terms.values())
        + (model.heads * sum(t.c_w for t in terms.values()) + model.kv_heads * sum(t.c_u for t in terms.values())) / 2.0
    )
    states = state_bytes(model, workload, 1)  # one rank holds everything: its sum is the total (+ buffers)
    total_states = states["weights"] + states["grads"] + states["optimizer"]
    per_rank = (
        states["param_buffers"]
        + terms["logits"].const
        + (total_states if workload.param_sharding == "replicated" else 0.0)
    )
    devs = cluster.devices if devices is None else [cluster.devices[i] for i in devices]
    if options.state_shards and workload.param_sharding == "zero3":
        # the states sharded over more devices than these: a plan on k of them holds a 1/max(k, N)
        # share on each, at least total / max(len(devs), N); a device with less room is no help
        each = total_states / options.shards(len(devs))
        room = sum(max(0.0, (1 - options.reserved_fraction) * d.gpu.memory_bytes - per_rank - each) for d in devs)
        return workload.seq_len * per_tok <= room
    room = sum(max(0.0, (1 - options.reserved_fraction) * dev.gpu.memory_bytes - per_rank) for dev in devs)
    need = workload.seq_len * per_tok + (total_states if workload.param_sharding == "zero3" else 0.0)
    return need <= room


def _scaled(cluster: ClusterSpec, factor: int) -> ClusterSpec:
    return ClusterSpec(
        f"{cluster.name}x{factor}", cluster.nodes * factor, cluster.inter_node_latency_us, (), cluster.description
    )


def explain_infeasible(cluster: ClusterSpec, model: ModelSpec, workload: Workload) -> str:
    """A plain-language explanation of why nothing fits, with what would make it fit."""
    S, B = workload.seq_len, workload.block_size
    if S % (2 * B):
        return (
            f"the sequence length {S} is not a multiple of 2 x block size ({2 * B}): "
            "zigzag chunks must be whole blocks. "
            f"Use --seq-len {S - S % (2 * B) or 2 * B} or --block-size {math.gcd(S // 2, B) if S % 2 == 0 else 1}."
        )
    rep = memory_report(cluster, model, workload)
    lines = []
    if rep.load <= 1.0:
        lines.append(
            f"no plan fits on {cluster.name}, although spreading tokens perfectly evenly by memory would just fit "
            f"({rep.load:.0%} of the fullest device): whole blocks of {B} tokens and whole KV heads per device "
            "leave too little room."
        )
    else:
        lines.append(
            f"{model.name} at {S:,} tokens does not fit on {cluster.name}: it needs at least {rep.needed_gib:,.0f} GiB "
            f"(model states, activations, attention and K/V buffers, spread as evenly as memory allows), "
            f"the {cluster.size} GPUs have {rep.capacity_gib:,.0f} GiB; "
            f"the fullest device would need {rep.load:.0%} of its memory."
        )
    if rep.binding:
        types: dict[str, int] = {}
        for d in rep.binding:
            types[cluster.devices[d].gpu.name] = types.get(cluster.devices[d].gpu.name, 0) + 1
        lines.append(
            "binding devices (full at the best spread): "
            + ", ".join(f"{n} x {t}" for t, n in types.items())
            + f" (e.g. device {rep.binding[0]} {cluster.devices[rep.binding[0]].name})"
        )
    fixes = []
    if workload.recompute != RecomputePolicy.FULL:
        r2 = memory_report(cluster, model, workload.with_recompute(RecomputePolicy.FULL))
        fixes.append(
            "recompute more (--recompute full, or auto to let the planner choose): "
            f"the fullest device would need {r2.load:.0%}" + (" -> fits" if r2.load <= 1 else " (not enough alone)")
        )
    if workload.param_sharding == "replicated":
        r3 = memory_report(cluster, model, replace(workload, param_sharding="zero3"))
        fixes.append(
            f"shard parameters and optimizer states (--sharding zero3): {r3.load:.0%}"
            + (" -> fits" if r3.load <= 1 else "")
        )
    for factor in (2, 4, 8):
        if cluster.size * factor > 4096:
            break
        r4 = memory_report(_scaled(cluster, factor), model, workload)
        if r4.load <= 1:
            fixes.append(
                f"more devices: {factor} x the cluster ({cluster.size * (factor - 1)} more GPUs like these) "
                f"would fit ({r4.load:.0%})"
            )
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
