"""The homogeneous baselines HexiSeq is measured against, each tuned to its very best.

One registry (`FAMILIES`): a family is a name and a function that lists its symmetric plans on a set
of devices. Every family is tried on every candidate device subset (candidates.device_subsets: the
whole cluster, every union of GPU types, the fastest n whole-node prefixes, for every n a symmetric
layout can use: `symmetric_sizes`), in every legal
configuration, under every recompute policy that fits, and scored by the step replay (the judge).
Nothing is cut by an estimate: a configuration is skipped only when a proven lower bound of its own
step time (`plan_lower_bound`) is already above its family's best replayed time, so the best of each
family is exact.

- ring:     pure CP (zigzag), one device per group, even chunks;
- ulysses:  pure HP, one group, even heads;
- usp:      every CP x HP factorization with HP dividing the heads, HP inside nodes (consecutive
            devices) and HP across nodes (strided);
- proportional: node groups, chunks / shards / heads in proportion to effective FLOP/s (a
            heuristic, no optimization), on the whole cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..costmodel.arrays import PlanArrays, plan_arrays
from ..costmodel.bound import subset_time_bound
from ..costmodel.comm import ParamComm, alltoall_times, kv_bytes, param_collectives
from ..costmodel.durations import coefficients, evaluate
from ..costmodel.kernels import CostOptions, WorkTimes, attention_rows, attention_waste
from ..costmodel.memory import memory_bytes
from ..costmodel.paths import Pass, StepShape
from ..costmodel.policy import rule_of
from ..costmodel.simulate import pass_schedule, simulate_durations
from ..errors import PlanError
from ..plan import Group, Plan, symmetric_plan
from ..rounding import largest_remainder
from ..schedule import chunks_needed
from ..specs import RECOMPUTE_POLICIES, ClusterSpec, ModelSpec, Workload
from .candidates import device_subsets, domains


@dataclass
class BaselineResult:
    """The best configuration of one baseline family, or why none fits."""

    name: str
    plan: Plan | None
    iteration_time_s: float  # replayed; inf when nothing fits
    tokens_per_s: float  # 0 when nothing fits
    config: str  # human description of the kept configuration
    tried: int  # configurations built
    fitting: int  # configurations replayed that fit in memory
    skipped: int = 0  # configurations whose lower bound was above the family's best
    notes: list[str] = field(default_factory=list)
    recompute: str | None = None  # the kept plan's recompute policy (None when nothing fits)

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "feasible": self.feasible,
            "config": self.config,
            "iteration_time_s": self.iteration_time_s if self.feasible else None,
            "tokens_per_s": self.tokens_per_s,
            "tried": self.tried,
            "fitting": self.fitting,
            "skipped": self.skipped,
            "recompute": self.recompute,
            "notes": list(self.notes),
        }


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def symmetric_sizes(model: ModelSpec, seq_len: int, most: int) -> list[int]:
    """Every device count up to `most` that some symmetric CP x HP layout of the model at this length
    can use: cp x hp with hp dividing the heads and the sequence splitting into 2 x cp even chunks.
    The baselines try the fastest n devices for each (a hand-built USP with hp = 40 heads over 16
    rings uses 640 GPUs, a size neither a power of two nor a divisor of a 1024-GPU cluster)."""
    cps = [cp for cp in range(1, most + 1) if seq_len % (2 * cp) == 0]
    return sorted({cp * hp for hp in divisors(model.heads) for cp in cps if cp * hp <= most})


def _block_for(seq_len: int, parts: int, block: int) -> int | None:
    """The alignment an even zigzag split into `parts` chunk pairs can use: the workload's block if
    it divides, else the largest common divisor below it; None when S does not split evenly."""
    if seq_len % (2 * parts):
        return None
    return math.gcd(seq_len // (2 * parts), block)


def _make(devs: Sequence[int], S: int, model: ModelSpec, block: int, cp: int, hp: int) -> Plan | None:
    b = _block_for(S, cp, block)
    if b is None:
        return None
    try:
        return symmetric_plan(list(devs), S, model.heads, model.kv_heads, cp=cp, hp=hp, block_size=b)
    except PlanError:
        return None  # not a legal layout for this size: the family lacks it


def ring(devs: Sequence[int], S: int, model: ModelSpec, block: int) -> list[tuple[str, Plan]]:
    p = _make(devs, S, model, block, len(devs), 1)
    return [(f"cp={len(devs)}", p)] if p else []


def ulysses(devs: Sequence[int], S: int, model: ModelSpec, block: int) -> list[tuple[str, Plan]]:
    p = _make(devs, S, model, block, 1, len(devs))
    return [(f"hp={len(devs)}", p)] if p else []


def usp(devs: Sequence[int], S: int, model: ModelSpec, block: int) -> list[tuple[str, Plan]]:
    n, out = len(devs), []
    for hp in divisors(n):
        cp = n // hp
        if hp == 1 or cp == 1 or model.heads % hp:
            continue
        p = _make(devs, S, model, block, cp, hp)
        if p:
            out.append((f"cp={cp} x hp={hp}, hp inside nodes", p))
        strided = [devs[i + j * cp] for i in range(cp) for j in range(hp)]
        p = _make(strided, S, model, block, cp, hp)
        if p:
            out.append((f"cp={cp} x hp={hp}, hp across nodes", p))
    return out


FAMILIES: dict[str, Callable[[Sequence[int], int, ModelSpec, int], list[tuple[str, Plan]]]] = {
    "ring": ring,
    "ulysses": ulysses,
    "usp": usp,
}


def proportional_plan(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, devices: Iterable[int] | None = None
) -> Plan:
    """Capacity-proportional heuristic: one group per (node, GPU type), chunk lengths ∝ the group's
    FLOP/s, shards and heads ∝ each device's FLOP/s (heads in whole KV-head units)."""
    groups_devs = domains(cluster, devices if devices is not None else range(cluster.size))
    S, B, H = workload.seq_len, workload.block_size, model.heads
    if S % (2 * B) or S // (2 * B) < len(groups_devs):
        raise PlanError(f"seq_len {S} cannot give {len(groups_devs)} groups whole chunks of {B} tokens")
    speeds = [[cluster.devices[d].gpu.matmul_flops for d in g] for g in groups_devs]
    # at least one unit each where there are enough (else none): proportional, not a hard rule
    chunk_blocks = largest_remainder([sum(s) for s in speeds], S // (2 * B), minimum=1, strict_minimum=False)
    groups = []
    for g, sp, cb in zip(groups_devs, speeds, chunk_blocks):
        L = cb * B
        groups.append(
            Group(
                tuple(g),
                L,
                tuple(largest_remainder(sp, 2 * L, minimum=1, strict_minimum=False)),
                tuple(largest_remainder(sp, H, unit=model.group_size)),
            )
        )
    return Plan(S, H, model.kv_heads, tuple(groups), B, "proportional", cluster.name, model.name)


# ---------------------------------------------------------------------------- a plan's lower bound


def plan_lower_bound(
    plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> float:
    """A proven lower bound of the plan's replayed step time that needs no exchange schedule: the
    exposed collectives, the optimizer and every rank's own work (durations.py's forms summed over the
    passes): its linear work, its two all-to-alls (each α + max(send, recv), on the rank's chain
    before and after the exchange) and its exchange, at least max(its attention, its transfers, one
    after the other: from each other group its least latency and the bytes it needs of it over all
    of that group's links at once) — waits, operator charges and the overlap slowdown only add;
    every pass takes at least its slowest rank's own work and its prefetched collective
    (simulate.pass_schedule)."""
    a = plan_arrays(plan, cluster, model, workload, options)
    return _lower_bound(a, _floors(a, model, workload, options), model, workload, options)


@dataclass(frozen=True)
class _Floors:
    """The parts of plan_lower_bound that do not depend on the recompute policy, per rank [R]."""

    att: np.ndarray  # forward attention of all rounds
    xf: np.ndarray  # the least time of the forward transfers, one after the other
    xb: np.ndarray  # ... of the backward transfers
    pc: ParamComm
    a2a: np.ndarray  # the two all-to-alls of a layer pass (forward or backward: the same two, reversed)


def _floors(a: PlanArrays, model: ModelSpec, workload: Workload, options: CostOptions) -> _Floors:
    """The parts of plan_lower_bound that do not depend on the recompute policy."""
    w = a.work
    L = a.L[a.grp]
    rows = sum(attention_rows(L, a.k))
    waste = sum(attention_waste(L, a.k, w.tile))
    att = a.eta * ((L * (workload.seq_len + 1) + waste) * w.pair + rows * w.row)  # forward, all rounds
    xf = xb = np.zeros(a.R)
    if a.k > 1 and not options.ignore_comm:
        # the transfers of a rank's rounds follow one another (simulate.exchange: round j's starts
        # after round j-1's arrived): at least, from each other group h, the least latency of h's
        # ranks to it plus the bytes it needs of h over all of h's links to it at once
        lat_h = np.minimum.reduceat(a.lat, a.gstart, axis=0)  # [k, R]
        bw_h = np.add.reduceat(a.bw, a.gstart, axis=0)  # [k, R]
        h = np.arange(a.k)[:, None]
        mult = chunks_needed(h, a.grp[None, :])  # chunks of h that g needs (h = g: masked below)
        other = h != a.grp[None, :]
        secs = np.where(
            other, kv_bytes(a.kvc[None, :] * mult * a.L[:, None], model.head_dim) / np.where(other, bw_h, 1.0), 0.0
        )
        lat_sum = np.where(other, lat_h, 0.0).sum(axis=0)
        xf = lat_sum + secs.sum(axis=0)
        xb = 2.0 * lat_sum + secs.sum(axis=0)
    pc = (
        param_collectives(a.bw, a.lat, model, workload)
        if not options.ignore_comm
        else ParamComm(workload.param_sharding)
    )
    a2a = np.zeros(a.R)
    if not options.ignore_comm:  # each all-to-all takes α + max(send, recv) (durations.py), its operators left out
        t = alltoall_times(a, model)
        a2a = 2.0 * t["lat"] + np.maximum(t["in_send"], t["in_recv"]) + np.maximum(t["out_send"], t["out_recv"])
    return _Floors(att=att, xf=xf, xb=xb, pc=pc, a2a=a2a)


def _own_work(
    work: WorkTimes, eta: np.ndarray, shards: np.ndarray, fl: _Floors, workload: Workload
) -> dict[str, np.ndarray]:
    """Every rank's least own work per layer pass ("f", "b") and LM-head pass ("h") under the
    workload's recompute policy, from its work times, heads and shard: its linear work, its two
    all-to-alls and its exchange, at least max(attention, transfers) (plan_lower_bound's doc)."""
    again = rule_of(workload).backward_factors()
    w = work
    active = eta > 0
    ex_f = np.where(active, np.maximum(fl.att, fl.xf), 0.0)
    ex_b = np.where(active, np.maximum(w.attn_bwd_factor * fl.att, fl.xb), 0.0)
    fwd = shards * (w.pre_fwd + w.post_fwd) + fl.a2a + ex_f
    rerun = again.rerun_linear * (w.pre_fwd + w.post_fwd)
    bwd = shards * (w.pre_bwd + w.post_bwd + rerun) + fl.a2a + ex_b + again.replay_layer * fwd
    return {"f": fwd, "b": bwd, "h": shards * w.head}


def _lower_bound(a: PlanArrays, fl: _Floors, model: ModelSpec, workload: Workload, options: CostOptions) -> float:
    w = a.work
    own = _own_work(a.work, a.eta, a.s, fl, workload)
    local_params = model.param_count / (options.shards(a.R) if workload.param_sharding == "zero3" else 1)
    shape = StepShape(params=fl.pc, layers=model.layers, batch=workload.global_batch, comm=not options.ignore_comm)
    total = float(local_params * w.optimizer.max())
    for step in pass_schedule(shape):
        if isinstance(step, Pass):  # every rank: max(its own work, the collective) + the slowdown the collective causes
            comm = step.collective_s
            total += step.count * float(
                (np.maximum(own[step.chain], comm) + (w.overlap_slowdown * comm if comm > 0 else 0.0)).max()
            )
        else:
            total += step.count * step.seconds
    return total


class MicroStepFloors:
    """Proven lower bounds of the seconds each micro-step (one sequence) of a layout takes as a
    replica under any parameter-sharding strategy, the collectives and the optimizer left out: every
    layer pass and the LM-head pass take at least their slowest rank's own work (plan_lower_bound's
    floors), whatever collective a strategy prefetches beside them, and a replica's B micro-steps
    replay B times each pass. Kept per layout (its devices and groups): the recompute policy only
    weighs the same floors."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, options: CostOptions = CostOptions()) -> None:
        self.cluster, self.model, self.options = cluster, model, options
        self._parts: dict[tuple, tuple] = {}

    def __call__(self, plan: Plan, workload: Workload) -> float:
        """Seconds per micro-step no strategy makes the plan's layout beat under the workload's policy."""
        key = plan.groups  # devices, chunks, shards and heads: the layout
        if key not in self._parts:
            # the layout on these devices (a replica moved from its shape's plan carries the shape's identity)
            a = plan_arrays(replace(plan, meta={}), self.cluster, self.model, None, self.options)
            # only what the floors read: a layout's arrays hold its [R, R] links
            self._parts[key] = (a.work, a.eta, a.s, _floors(a, self.model, workload, self.options))
        own = _own_work(*self._parts[key], workload)
        return self.model.layers * float(own["f"].max() + own["b"].max()) + float(own["h"].max())


# ---------------------------------------------------------------------------- evaluation


def policies_of(workload: Workload, policies: Sequence[str] | None = None) -> list[str]:
    """The recompute policies to try: `policies` when given, all three under "auto", else the workload's."""
    if policies is not None:
        return [str(getattr(p, "value", p)) for p in policies]
    policy = str(getattr(workload.recompute, "value", workload.recompute))
    return [str(getattr(p, "value", p)) for p in RECOMPUTE_POLICIES] if policy == "auto" else [policy]


def evaluate_family(
    name: str,
    candidates: list[tuple[str, Plan]],
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    policies: Sequence[str],
    options: CostOptions = CostOptions(),
) -> BaselineResult:
    """The family's best plan: every (configuration, policy) replayed unless its lower bound (the
    larger of plan_lower_bound and the bound of its device set) is above the best so far (then it
    cannot be the best); ordered by that bound, so the search stops early."""
    scored = []
    subset: dict[tuple, float] = {}  # the bound of every plan on a device set (costmodel.bound), per policy
    for i, (label, plan) in enumerate(candidates):
        a = plan_arrays(plan, cluster, model, workload, options)  # the same for every policy
        fl = _floors(a, model, workload, options)
        devs = tuple(sorted(plan.rank_devices))
        for policy in policies:
            wl = workload.with_recompute(policy)
            if (devs, policy) not in subset:
                subset[devs, policy] = subset_time_bound(cluster, devs, model, wl, options)
            scored.append((max(_lower_bound(a, fl, model, wl, options), subset[devs, policy]), label, i, policy))
    scored.sort(key=lambda x: (x[0], x[1], x[3]))
    best = None
    fitting = skipped = 0
    arrays: dict[int, object] = {}  # the last plans' arrays: their exchange table serves every policy
    for lb, label, i, policy in scored:
        if best is not None and lb >= best[0]:
            skipped += 1
            continue
        plan = candidates[i][1]
        wl = workload.with_recompute(policy)
        p = replace(
            plan, name=name, cluster=cluster.name, model=model.name, meta={"config": label, "recompute": policy}
        )
        if i not in arrays:
            if len(arrays) >= 4:
                arrays.pop(next(iter(arrays)))
            arrays[i] = plan_arrays(p, cluster, model, wl, options)
        a = arrays[i]
        d = evaluate(coefficients(a, model, wl, options), a.s, a.L)
        mem = sum(memory_bytes(d.a, model, wl, d.recv_bytes, options).values())
        if np.any(mem > d.a.capacity):
            continue  # memory first: a plan that does not fit is never replayed
        fitting += 1
        t = simulate_durations(d, phases=False).iteration_time_s
        if best is None or t < best[0]:
            best = (t, label, p, policy)
    if best is None:
        note = "no configuration fits in memory" if candidates else "no legal configuration for this size"
        return BaselineResult(name, None, math.inf, 0.0, "-", len(candidates), 0, skipped, [note])
    t, label, plan, policy = best
    if len(policies) > 1 or policy != "none":
        label += f", recompute {policy}"
    return BaselineResult(
        name, plan, t, workload.tokens / t, label, len(candidates), fitting, skipped, recompute=policy
    )


def baselines(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    progress: Callable[[str], None] | None = None,
    policies: Sequence[str] | None = None,
    options: CostOptions = CostOptions(),
) -> dict[str, BaselineResult]:
    """Every family at its best over every candidate subset ({name: BaselineResult}), plus
    "proportional" (module doc). Names: "ring", "ulysses", "usp", "proportional"; each result's
    config names the subset it runs on."""
    pol = policies_of(workload, policies)
    S, B = workload.seq_len, workload.block_size
    subsets = device_subsets(cluster, symmetric_sizes(model, S, cluster.size))
    out: dict[str, BaselineResult] = {}
    for family, make in FAMILIES.items():
        if progress:
            progress(family)
        cands = []
        for label, devs in subsets:
            for cfg, plan in make(list(devs), S, model, B):
                cands.append((f"{cfg} on {label} ({len(devs)} GPUs)", plan))
        out[family] = evaluate_family(family, cands, cluster, model, workload, pol, options)
    if progress:
        progress("proportional")
    cands = []
    for label, devs in subsets:  # on every candidate subset too: leaving slow devices out may pay
        try:
            cands.append(
                (
                    f"node groups, split by FLOP/s, on {label} ({len(devs)} GPUs)",
                    proportional_plan(cluster, model, workload, devs),
                )
            )
        except PlanError:
            pass
    out["proportional"] = evaluate_family("proportional", cands, cluster, model, workload, pol, options)
    return out


def best_baseline(results: dict[str, BaselineResult], symmetric_only: bool = False) -> BaselineResult | None:
    """The fastest feasible baseline (optionally only the symmetric CP/HP ones)."""
    pool = [r for r in results.values() if r.feasible and not (symmetric_only and r.name == "proportional")]
    return min(pool, key=lambda r: (r.iteration_time_s, r.name)) if pool else None
