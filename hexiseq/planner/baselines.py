"""The homogeneous baselines HexiSeq is measured against, each tuned as a strong competitor would.

Every candidate is a `Plan` judged by the same cost model and simulator as HexiSeq's own plans:

- **ring**: pure CP (zigzag), one device per group, even chunks;
- **ulysses**: pure HP, one group, even heads (when the heads do not divide over all devices,
  the largest group whose size divides the heads, on the fastest devices);
- **usp**: every CP x HP factorization with HP dividing the heads, in two placements (HP inside
  nodes, i.e. consecutive devices; and HP across nodes, i.e. strided), even splits;
- each of the above also on every homogeneous subset (all devices of one GPU type), since a user
  can simply leave the slow GPUs out;
- **proportional**: node groups, chunks / shards / heads split in proportion to effective FLOP/s
  (a heuristic without optimization).

For each family the configuration with the lowest simulated iteration time among those that fit
in memory is kept. Recompute: under a concrete policy every candidate runs with it; under "auto"
(or an explicit list of policies) each candidate takes the first policy of "none", "selective",
"full" under which it fits, as a competitor would turn checkpointing on only when it must: the same
plan with more recompute is never faster (it adds at least as much recompute time as its larger
backward window can hide of the parameter collectives), so that is the candidate's best policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ..errors import PlanError
from ..plan import Group, Plan, symmetric_plan
from ..specs import RECOMPUTE_POLICIES, ClusterSpec, ModelSpec, Workload

# How many of a family's candidates (best by the fast estimate) are replayed in the simulator.
SIMULATE_TOP = 3


@dataclass
class BaselineResult:
    """The best configuration of one baseline family, or why none fits."""

    name: str
    plan: Plan | None
    iteration_time_s: float  # simulated; inf when nothing fits
    tokens_per_s: float  # simulated; 0 when nothing fits
    config: str  # human description of the kept configuration
    tried: int  # configurations built
    fitting: int  # configurations that fit in memory
    estimate_time_s: float = math.inf  # the cost model's (analytic) time of the kept plan
    notes: list[str] = field(default_factory=list)
    recompute: str | None = None  # the recompute policy the kept plan runs with (None when nothing fits)

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
            "recompute": self.recompute,
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------- helpers


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def device_speed(cluster: ClusterSpec, d: int) -> float:
    """Effective FLOP/s used to rank and weight devices (matmul rate; attention is similar)."""
    return cluster.devices[d].gpu.matmul_flops


def homogeneous_subsets(cluster: ClusterSpec) -> dict[str, list[int]]:
    """{GPU type: its devices} for clusters with more than one type (one type = the whole cluster)."""
    by_type: dict[str, list[int]] = {}
    for d in cluster.devices:
        by_type.setdefault(d.gpu.name, []).append(d.index)
    return by_type if len(by_type) > 1 else {}


def _block_for(seq_len: int, parts: int, block: int) -> int | None:
    """The alignment an even zigzag split into `parts` chunk pairs can use: the workload's block if
    it divides, else the largest divisor of the chunk length below it (a competitor would do the
    same); None when S does not split evenly at all."""
    if seq_len % (2 * parts):
        return None
    return math.gcd(seq_len // (2 * parts), block)


def symmetric_candidates(
    devices: Sequence[int], seq_len: int, model: ModelSpec, block: int, family: str, speed: dict[int, float] | None = None
) -> list[tuple[str, Plan]]:
    """Every legal symmetric plan of one family on `devices` (ordered node by node); `speed` ranks
    devices when Ulysses must use a subset (fastest first)."""
    devs = list(devices)
    n, H = len(devs), model.heads
    out: list[tuple[str, Plan]] = []

    def make(dv: list[int], cp: int, hp: int, label: str) -> None:
        b = _block_for(seq_len, cp, block)
        if b is None:
            return
        try:
            out.append((label, symmetric_plan(dv, seq_len, H, model.kv_heads, cp=cp, hp=hp, block_size=b)))
        except PlanError:
            pass  # not a legal layout for this size; the family simply lacks it

    if family == "ring":
        make(devs, n, 1, f"cp={n}")
    elif family == "ulysses":
        # Largest HP sizes first; a subset of the fastest devices when heads do not divide over all.
        for hp in sorted((d for d in divisors(H) if d <= n), reverse=True)[:3]:
            pick = devs if hp == n else sorted(sorted(devs, key=lambda d: -(speed or {}).get(d, 0.0))[:hp])
            make(pick, 1, hp, f"hp={hp}" + ("" if hp == n else f" on {hp} of {n} devices"))
    elif family == "usp":
        for hp in divisors(n):
            cp = n // hp
            if hp == 1 or cp == 1 or H % hp:
                continue
            make(devs, cp, hp, f"cp={cp} x hp={hp}, hp inside nodes")
            strided = [devs[i + j * cp] for i in range(cp) for j in range(hp)]
            make(strided, cp, hp, f"cp={cp} x hp={hp}, hp across nodes")
    else:  # pragma: no cover - programming error
        raise ValueError(family)
    return out


def largest_remainder(total: int, weights: Sequence[float], unit: int = 1, minimum: int = 0) -> list[int]:
    """Split `total` (a multiple of `unit`) into parts ∝ weights, each a multiple of `unit`, at least
    `minimum` units each when possible; exact sum."""
    units = total // unit
    k = len(weights)
    base = [minimum] * k if units >= minimum * k else [0] * k
    rest = units - sum(base)
    wsum = sum(weights) or 1.0
    raw = [rest * w / wsum for w in weights]
    parts = [int(math.floor(x)) for x in raw]
    order = sorted(range(k), key=lambda i: raw[i] - parts[i], reverse=True)
    for i in order[: rest - sum(parts)]:
        parts[i] += 1
    return [(b + p) * unit for b, p in zip(base, parts)]


def proportional_plan(cluster: ClusterSpec, model: ModelSpec, workload: Workload, devices: Iterable[int] | None = None) -> Plan:
    """Capacity-proportional heuristic: one group per (node, GPU type), chunk lengths ∝ the group's
    FLOP/s, shards and heads ∝ each device's FLOP/s (heads in whole KV-head units)."""
    use = set(devices) if devices is not None else set(range(cluster.size))
    groups_devs: list[list[int]] = []
    for node in cluster.node_devices:
        by_type: dict[str, list[int]] = {}
        for d in node:
            if d in use:
                by_type.setdefault(cluster.devices[d].gpu.name, []).append(d)
        groups_devs.extend(by_type.values())
    S, B, H = workload.seq_len, workload.block_size, model.heads
    unit = model.group_size if (H // model.group_size) >= 1 else 1
    if S % (2 * B) or S // (2 * B) < len(groups_devs):
        raise PlanError(f"seq_len {S} cannot give {len(groups_devs)} groups whole chunks of {B} tokens")
    speeds = [[device_speed(cluster, d) for d in g] for g in groups_devs]
    chunk_blocks = largest_remainder(S // (2 * B), [sum(s) for s in speeds], 1, minimum=1)
    groups = []
    for g, sp, cb in zip(groups_devs, speeds, chunk_blocks):
        L = cb * B
        heads = largest_remainder(H, sp, unit)
        shards = largest_remainder(2 * L, sp, 1, minimum=1)
        groups.append(Group(tuple(g), L, tuple(shards), tuple(heads)))
    return Plan(S, H, model.kv_heads, tuple(groups), B, "proportional", cluster.name, model.name)


# ---------------------------------------------------------------------------- evaluation


def policies_of(workload: Workload, policies: Sequence[str] | None = None) -> list[str]:
    """The recompute policies to try, in order of increasing recompute: `policies` when given, all
    three under "auto", else the workload's own."""
    if policies is not None:
        return list(policies)
    return list(RECOMPUTE_POLICIES) if workload.recompute == "auto" else [workload.recompute]


def _evaluate(
    name: str,
    candidates: list[tuple[str, Plan]],
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    simulate_top: int = SIMULATE_TOP,
    policies: Sequence[str] | None = None,
) -> BaselineResult:
    """Estimate every candidate (under the first policy it fits with, module doc), replay the best few
    that fit in the simulator, keep the fastest."""
    from ..costmodel import estimate, simulate

    workloads = [workload.with_recompute(p) for p in policies_of(workload, policies)]
    scored = []
    for label, plan in candidates:
        for wl in workloads:
            p = Plan(plan.seq_len, plan.num_heads, plan.num_kv_heads, plan.groups, plan.block_size, name, cluster.name, model.name,
                     {"config": label, "recompute": wl.recompute})
            est = estimate(p, cluster, model, wl)
            if est.fits:
                scored.append((est.iteration_time_s, label, p, wl))
                break
    if not scored:
        note = "no configuration fits in memory" if candidates else "no legal configuration for this size"
        return BaselineResult(name, None, math.inf, 0.0, "-", len(candidates), 0, notes=[note])
    scored.sort(key=lambda x: x[0])
    best = None
    for est_t, label, plan, wl in scored[:simulate_top]:
        t = simulate(plan, cluster, model, wl).iteration_time_s
        if best is None or t < best[0]:
            best = (t, est_t, label, plan, wl)
    t, est_t, label, plan, wl = best
    if len(workloads) > 1 or wl.recompute != "none":
        label += f", recompute {wl.recompute}"
    return BaselineResult(name, plan, t, workload.tokens / t, label, len(candidates), len(scored), est_t, recompute=wl.recompute)


def baselines(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    progress: Callable[[str], None] | None = None,
    policies: Sequence[str] | None = None,
) -> dict[str, BaselineResult]:
    """Every baseline family at its best configuration: {name: BaselineResult}.

    Names: "ring", "ulysses", "usp", then "ring[H100-SXM]" etc. for homogeneous subsets (only on
    mixed clusters), and "proportional". Recompute policies: `policies` when given, else the
    workload's (all three under "auto"); each candidate uses the first that fits (module doc).
    """
    speed = {d.index: device_speed(cluster, d.index) for d in cluster.devices}
    S, B = workload.seq_len, workload.block_size
    everything = list(range(cluster.size))
    # A scope is a device set; a homogeneous subset whose size is not a power of two is also tried
    # at the largest power of two (whole nodes first), where even splits of S and heads work.
    scopes: list[tuple[str, list[list[int]]]] = [("", [everything])]
    for t, devs in homogeneous_subsets(cluster).items():
        p2 = 1 << (len(devs).bit_length() - 1)
        scopes.append((f"[{t}]", [devs] if p2 == len(devs) else [devs, devs[:p2]]))
    out: dict[str, BaselineResult] = {}
    for family in ("ring", "ulysses", "usp"):
        for suffix, sets in scopes:
            name = family + suffix
            if progress:
                progress(name)
            cands = [c for devs in sets for c in symmetric_candidates(devs, S, model, B, family, speed)]
            out[name] = _evaluate(name, cands, cluster, model, workload, policies=policies)
    if progress:
        progress("proportional")
    try:
        cands = [("node groups, split by FLOP/s", proportional_plan(cluster, model, workload))]
    except PlanError:
        cands = []
    out["proportional"] = _evaluate("proportional", cands, cluster, model, workload, policies=policies)
    return out


def best_baseline(results: dict[str, BaselineResult], symmetric_only: bool = False) -> BaselineResult | None:
    """The fastest feasible baseline (optionally only the symmetric CP/HP ones)."""
    pool = [r for r in results.values() if r.feasible and not (symmetric_only and r.name == "proportional")]
    return min(pool, key=lambda r: r.iteration_time_s) if pool else None
