"""The joint planner: data-parallel replicas x parameter sharding x asymmetric CP x HP for a whole
step of `global_batch` sequences.

- Candidates: the DP x family baselines (planner/dp_baselines.py, the first incumbent), today's
  plan of one replica (`plan_cluster`, DP = 1: skipped when a proven bound of its search space is
  above the best plan found) and the replica partitions of
  the cluster's structure (planner/replicas.py: families of identical nodes, fast+slow pairings,
  rate-balanced unions of nodes). Each replica shape is planned once (`plan_cluster`
  on the shape as a cluster of its own, one sequence, ZeRO-3 inside it) and its plan moved onto
  every replica of that shape.
- Strategies: every parameter-sharding stage over every scope (`STRATEGIES`), scored by the step
  model (costmodel/step.py); the fastest that fits wins.
- Batch shares: given the replicas' lines T_i(B) = c_i + B·m_i (costmodel.step.replica_lines),
  the integer shares minimising max_i T_i(B_i) with Σ B_i = G are exact by the greedy that gives
  each sequence to the replica finishing it first (each T_i is increasing: the chosen values are
  the G smallest of the merged sequences T_i(1) < T_i(2) < ...). A replica given no sequence is
  left out.
- Search: partitions in the order of a proven lower bound of their step (each shape's balanced
  compute per sequence, costmodel.bound, with the same exact shares); it stops when the next bound
  is within `gap` of the best step found or after MAX_PARTITIONS_VISITED; then a closing pass plans
  the partitions left whose floors are below the best plan, lowest floor first. A partition's floor
  is tighter (`_Shapes.partition_floor`): under each recompute policy (a plan has one), each shape's
  compute with each device's share held to its memory, its model states sharded as far as its
  strategy's shard group reaches — inside the replica's nodes, or beyond them, where under zero2 /
  zero3 the replicas run in lockstep and each micro-step pays its collectives over the links out of
  the nodes: the floors of the partitions not planned are what the search's bound says of them.
- Lower bound of every plan (any partition, any strategy, any layout; `every_joint_plan_bound`):
  the cluster's balanced compute for G sequences under the recompute policy, plus the least
  optimizer step. A plan's replicas together do the same token and attention work (and its policy's
  recompute), side by side for as long as the slowest of them, so no step is shorter; the policy is
  the workload's, or under "auto" the cheapest policy under which one sequence can fit in the
  cluster's memory at all (costmodel.bound.sequence_can_fit: a plan of a policy that cannot fit is
  no plan); each device's share of the work is held to what its memory can hold of a sequence
  (costmodel.bound.memory_capped_work_time).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..costmodel.bound import (
    HeldStates,
    balanced_work_time,
    compute_bound,
    least_optimizer_time,
    memory_capped_work_time,
    one_replica_bound,
    outer_group_collectives_floor,
    sequence_can_fit,
)
from ..costmodel.kernels import CostOptions
from ..costmodel.step import StepEstimate, estimate_step
from ..errors import HexiSeqError, InfeasibleError
from ..plan import Group, Plan, Sharding, ShardingScope, ShardingStage
from ..specs import ClusterSpec, ModelSpec, Workload
from ..specs.identity import cluster_fingerprint, model_record
from .baselines import MicroStepFloors, policies_of, symmetric_sizes
from .candidates import EXHAUSTIVE_DEVICES, device_subsets
from .collector import fewer_collections
from .dp_baselines import DPBaseline, dp_baselines
from .replicas import (
    Partition,
    Piece,
    Replica,
    balanced_unions,
    partition_key,
    partitions,
    replica_devices,
    shape_key,
    spec_key,
    sub_cluster,
)
from .result import PlanResult
from .scheduler import plan_cluster
from .search import DEFAULT_GAP
from .shares import STRATEGIES, best_over_strategies, lower_lockstep_bound, lower_shares_bound
from .workers import Jobs, resolve_workers

SHAPE_WORK, SHAPE_GAP = 300, 0.005  # the DP = 1 search of each replica shape (one plan of many: less work)
MAX_PARTITIONS_VISITED = 24  # partitions planned in full at most in the order of their balanced compute
MAX_PARTITIONS_CLOSED = 32  # ... then at most these whose floors are below the best plan (the bound covers the rest)
# the stages whose shard group may reach beyond a replica's nodes (replicated never shards)
OUTER_STAGES = (ShardingStage.ZERO1, ShardingStage.ZERO2, ShardingStage.ZERO3)


@dataclass(frozen=True)
class SequenceFloors:
    """A replica's seconds per sequence at least, by where its shard group lies (`_Shapes.sequence_floors`):
    inside its nodes; beyond them, per stage, (compute with the states it holds, collectives per micro-step)."""

    inside: float
    outer: dict[ShardingStage, tuple[float, float]]


@dataclass
class JointResult:
    """The joint plan for one (cluster, model, workload with its global batch) and its evidence."""

    plan: Plan
    step: StepEstimate
    partition: str  # how the replicas were formed
    step_time_s: float
    tokens_per_s: float
    bound_tokens_per_s: float
    efficiency_vs_bound: float
    lower_bound_s: float  # of every plan (module doc)
    searched_bound_s: float  # of the partitions not planned in full (inf: none left)
    bound_covers: str
    dp1: PlanResult | None  # today's planner at the same global batch (one replica)
    dp1_step_s: float  # its best strategy's step
    plan_time_s: float
    visited: int  # partitions planned in full
    partitions: int  # partitions enumerated
    shapes_planned: int
    recompute: str
    stage_times_s: dict[str, float] = field(default_factory=dict)
    workers: int = 1  # processes that planned side by side (planner/workers.py; the plan is the same)
    baselines: dict[str, DPBaseline] = field(default_factory=dict)  # DP x family, each at its best
    left_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def best_baseline(self) -> DPBaseline | None:
        pool = [b for b in self.baselines.values() if b.feasible]
        return min(pool, key=lambda b: (b.step_time_s, b.name)) if pool else None

    @property
    def speedup_vs_best_baseline(self) -> float | None:
        """Throughput over the best DP x symmetric baseline."""
        b = self.best_baseline
        return b.step_time_s / self.step_time_s if b else None

    @property
    def gap(self) -> float:
        """How far the plan can be from the best plan at all (by the bound of every plan)."""
        return max(0.0, 1.0 - self.lower_bound_s / self.step_time_s)

    def explanation(self) -> list[str]:
        """The replicas, their shares, the strategy, why devices are left out, what the bound covers."""
        out = [
            f"{self.plan.num_replicas} replica{'s' * (self.plan.num_replicas > 1)} ({self.partition}), sharding "
            f"{self.plan.sharding.describe()}, recompute {self.recompute}"
        ]
        for r in self.step.replicas:
            gpus = ", ".join(f"{n} x {g}" for g, n in r.gpus.items())
            out.append(
                f"  replica {r.index}: {gpus} (devices {_ranges(r.devices)}): {r.sequences} of "
                f"{sum(x.sequences for x in self.step.replicas)} sequences, {r.micro_step_s:.4g} s each, "
                f"{r.time_s:.4g} s" + (f" + {r.waiting_s:.4g} s waiting in lockstep" if r.waiting_s > 0 else "")
            )
        out.append(
            "  synchronisation: " + ", ".join(f"{k.replace('_', ' ')} {v:.4g} s" for k, v in self.step.sync_s.items())
        )
        if self.dp1 is not None:
            out.append(
                f"  one replica of the DP = 1 planner: {self.dp1_step_s:.4g} s per step "
                f"({self.dp1_step_s / self.step_time_s:.2f}x this plan's time)"
            )
        b = self.best_baseline
        if b is not None:
            out.append(
                f"  best DP x symmetric baseline: {b.name}, {b.config}: {b.step_time_s:.4g} s "
                f"(this plan {self.speedup_vs_best_baseline:.3f}x faster)"
            )
        out += [f"  {line}" for line in self.left_out]
        out.append(f"  bound: {self.bound_covers}")
        return out


def _ranges(devs: Sequence[int]) -> str:
    devs = sorted(devs)
    parts, start = [], devs[0]
    for a, b in zip(devs, devs[1:] + [None]):
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}..{a}")
            start = b
    return ", ".join(parts)


def _moved(plan: Plan, devices: Sequence[int]) -> Plan:
    """A sub-cluster's plan on the cluster's devices (`devices[j]` = its device j)."""
    groups = tuple(Group(tuple(devices[d] for d in g.devices), g.chunk_len, g.shards, g.heads) for g in plan.groups)
    return replace(plan, groups=groups, replicas=())


class _Shapes:
    """Each replica shape planned once (DP = 1 planner on the shape as a cluster, one sequence)."""

    def __init__(self, cluster, model, workload, options, jobs: Jobs | None = None):
        self.cluster, self.model, self.workload, self.options = cluster, model, workload, options
        self.jobs = jobs if jobs is not None else Jobs(1)
        self.plans: dict[tuple, tuple[Plan, str] | None] = {}
        self._started: dict[tuple, Any] = {}  # shapes started by `prefetch`, not taken yet
        self.seconds = 0.0  # spent planning shapes (or waiting for their workers)
        self._caps: dict[tuple, float] = {}  # memory-capped compute per (shape, policy, states held)
        self._floors: dict[tuple, SequenceFloors] = {}  # (replica, policy) -> its floors
        self._collectives: dict[Replica, dict | None] = {}  # replica -> outer_group_collectives_floor
        self.compute: dict[tuple, float] = {}  # the balanced compute part of each bound (node_rates)
        # per planned shape of whole nodes: its nodes and its plan's seconds per sequence (node_rates)
        self.times: dict[tuple, tuple[tuple[int, ...], float]] = {}
        self._keys: dict[tuple, tuple] = {}  # replica -> shape_key (the search scores millions of replicas)
        self._per_seq: dict[Replica, float] = {}  # replica -> compute_per_sequence, one lookup

    def key(self, rep: Replica) -> tuple:
        """The replica's shape_key, kept per replica."""
        key = self._keys.get(rep)
        if key is None:
            key = self._keys[rep] = shape_key(self.cluster, rep)
        return key

    def compute_per_sequence(self, rep: Replica) -> float:
        """A lower bound of the shape's seconds per sequence: its balanced compute (costmodel.bound)."""
        got = self._per_seq.get(rep)
        if got is not None:
            return got
        key = self.key(rep)
        if key not in self.compute:
            sub = sub_cluster(self.cluster, rep, "replica")
            S = self.workload.seq_len
            wl = replace(self.workload, global_batch=1, param_sharding="zero3")
            if wl.recompute == "auto":
                wl = wl.with_recompute("none")  # the balanced compute leaves recompute out
            one, two = (
                S * b / compute_bound(sub, self.model, replace(wl, global_batch=b), self.options) for b in (1, 2)
            )
            self.compute[key] = max(0.0, two - one)  # the compute of one more sequence (no optimizer)
        self._per_seq[rep] = self.compute[key]
        return self.compute[key]

    def sequence_floors(self, rep: Replica, policy: str) -> SequenceFloors:
        """Lower bounds of the replica's seconds per sequence under one recompute policy (a plan has
        one), by where its shard group lies (costmodel/step.py: a strategy's group is its replica,
        its node's devices of the plan, or every device of the plan): inside the replica's nodes,
        under any stage, with the model states sharded over every device of those nodes at most; or
        reaching beyond them, per stage, the states sharded over the whole cluster at most and, under
        zero2 / zero3, each micro-step taking at least its collectives over such a group
        (costmodel.bound.outer_group_collectives_floor). Each is the shape's compute with each
        device's share held to its memory (costmodel.bound.memory_capped_work_time; inf: the policy
        cannot hold a sequence that way), and at least its balanced compute."""
        got = self._floors.get((rep, policy))
        if got is not None:
            return got
        wl = replace(self.workload, global_batch=1, param_sharding="zero3").with_recompute(policy)
        nodes = {p.node for p in rep}
        inside = sum(self.cluster.nodes[n].count for n in nodes)
        floor = self.compute_per_sequence(rep)
        if rep not in self._collectives:
            devices = replica_devices(self.cluster, rep)
            self._collectives[rep] = outer_group_collectives_floor(self.cluster, devices, self.model, self.options)
        comm = self._collectives[rep]  # None: the replica spans every node, no group reaches beyond them
        outer = {
            stage: (max(floor, self._capped(rep, wl, HeldStates((stage,), self.cluster.size))), comm[stage])
            for stage in (OUTER_STAGES if comm is not None else ())
        }
        inner = max(floor, self._capped(rep, wl, HeldStates(shards=inside)))
        got = self._floors[(rep, policy)] = SequenceFloors(inner, outer)
        return got

    def _capped(self, rep: Replica, wl: Workload, held: HeldStates) -> float:
        key = (self.key(rep), str(wl.recompute), held)
        if key not in self._caps:
            sub = sub_cluster(self.cluster, rep, "replica")
            self._caps[key] = memory_capped_work_time(sub, self.model, wl, self.options, held)
        return self._caps[key]

    def partition_bound(self, part: Partition, global_batch: int) -> float:
        """The partition's balanced compute with exact shares: the order the search visits
        partitions in (a lower bound of its step too, `partition_floor` the tighter one)."""
        return lower_shares_bound([self.compute_per_sequence(r) for r in part.replicas], global_batch)

    def partition_floor(self, part: Partition, global_batch: int) -> float:
        """A lower bound of the partition's step under any strategy, layouts and shares: the least over
        the recompute policies and the places of the shard groups (`sequence_floors`) of the exact
        shares of its replicas' floors, independent replicas where the groups stay inside each
        replica's nodes or under zero1 (each replica's micro-steps its own), in lockstep under zero2 /
        zero3 beyond them (every used replica in one group: `lower_lockstep_bound`, two or more used;
        one alone keeps its group inside its nodes). A replica that shares a node with another
        counts no collectives there (its group may reach only that node's devices)."""
        G = global_batch
        owners = Counter(p.node for rep in part.replicas for p in rep)
        alone = [all(owners[p.node] == 1 for p in rep) for rep in part.replicas]
        best = math.inf
        for policy in policies_of(self.workload):
            floors = [self.sequence_floors(r, policy) for r in part.replicas]
            best = min(best, lower_shares_bound([f.inside for f in floors], G))
            for stage in OUTER_STAGES:  # zero1's collectives floor is 0: its replicas run on their own
                per = [
                    max(f.outer[stage][0], f.outer[stage][1] if solo else 0.0) if f.outer else math.inf
                    for f, solo in zip(floors, alone)
                ]
                shares = lower_shares_bound if stage == ShardingStage.ZERO1 else lower_lockstep_bound
                best = min(best, shares(per, G))
        return best

    def node_rates(self) -> list[float]:
        """Per node, the sequences per second it adds to a replica: the best per-node rate of the
        shapes of whole nodes of its spec planned so far, else its balanced compute's rate scaled by
        the median planned / compute ratio of the specs that were planned."""
        nodes = self.cluster.nodes
        spec = [spec_key(node) for node in nodes]
        whole = [(Piece(n, 0, node.count),) for n, node in enumerate(nodes)]
        compute = [1.0 / max(self.compute_per_sequence(rep), 1e-12) for rep in whole]
        planned: dict[tuple, float] = {}
        for members, seconds in self.times.values():
            if len({spec[n] for n in members}) == 1 and math.isfinite(seconds) and seconds > 0:
                sp = spec[members[0]]
                planned[sp] = max(planned.get(sp, 0.0), 1.0 / (seconds * len(members)))
        first = {sp: n for n, sp in reversed(list(enumerate(spec)))}  # nodes of one spec: one compute rate
        ratios = sorted(r / compute[first[sp]] for sp, r in planned.items())
        scale = ratios[len(ratios) // 2] if ratios else 1.0
        return [planned.get(spec[n], compute[n] * scale) for n in range(len(nodes))]

    def _inputs(self, rep: Replica, shards: int) -> tuple:
        sub = sub_cluster(self.cluster, rep, "replica")
        wl = replace(self.workload, global_batch=1, param_sharding="zero3")
        options = replace(self.options, state_shards=shards) if shards else self.options
        return sub, self.model, wl, options

    def prefetch(self, reps: Iterable[Replica]) -> None:
        """Start planning these shapes (workers > 1: side by side, planner/workers.py). Their plans
        count only when `plan` takes them, in the search's order: a shape started but never taken
        changes nothing (not the node rates either)."""
        for rep in reps:
            key = (self.key(rep), 0)
            if key not in self.plans and key not in self._started:
                self._started[key] = self.jobs.submit(_shape_plan, *self._inputs(rep, 0))

    def plan(self, rep: Replica, shards: int = 0) -> tuple[Plan, str] | None:
        """The shape's plan on the replica's devices and its recompute policy (None: it does not fit).
        `shards` > 0: its model states sharded over that many devices (with other replicas'), not
        only its own, which leaves it more memory for a sequence."""
        key = (self.key(rep), shards)
        if key not in self.plans:
            t0 = time.perf_counter()
            job = self._started.pop(key, None)
            if job is None:
                job = self.jobs.submit(_shape_plan, *self._inputs(rep, shards))
            got = self.jobs.result(job)
            if got is None:
                self.plans[key] = None
            else:
                plan, recompute, seconds = got
                self.plans[key] = (plan, recompute)
                if not shards and all(p.count == self.cluster.nodes[p.node].count for p in rep):  # whole nodes only
                    self.times[key] = (tuple(p.node for p in rep), seconds)
            self.seconds += time.perf_counter() - t0
        got = self.plans[key]
        if got is None:
            return None
        return _moved(got[0], replica_devices(self.cluster, rep)), got[1]


def _shape_plan(sub: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions) -> tuple | None:
    """A replica shape's plan, recompute policy and seconds per sequence (None: it does not fit).
    Module-level: a worker process runs it by name (planner/workers.py)."""
    try:
        res = plan_cluster(
            sub,
            model,
            workload,
            progress=False,
            options=options,
            work=SHAPE_WORK,
            gap=SHAPE_GAP,
            explain=False,
            certify=False,  # every_joint_plan_bound covers the joint plans
        )
    except (InfeasibleError, HexiSeqError):
        return None
    return res.plan, res.recompute, res.iteration_time_s


def _dp1_plan(cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions) -> PlanResult:
    """Today's DP = 1 plan of the whole cluster (a worker process may run it: no progress bar)."""
    return plan_cluster(cluster, model, workload, progress=False, options=options)


def _dp1_bound(cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions) -> float:
    """A proven lower bound of every one-replica plan the DP = 1 planner's layouts give under any
    strategy: the least bound of its candidate device subsets (those of its baselines included) over
    the policies it may choose, each under the strategies that can hold a sequence there
    (costmodel.bound.one_replica_bound: no communication where the model states fit sharded inside
    each node or under zero1, else the per-micro-step collectives of zero2 / zero3 over the subset);
    0 on the small clusters where it searches every subset."""
    if cluster.size <= EXHAUSTIVE_DEVICES:
        return 0.0
    sizes = symmetric_sizes(model, workload.seq_len, cluster.size)
    return min(
        one_replica_bound(cluster, sorted(devs), model, workload.with_recompute(p), options)
        for _, devs in device_subsets(cluster, sizes)
        for p in policies_of(workload)
    )


def every_joint_plan_bound(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> tuple[float, str | None]:
    """Seconds no joint plan of `workload.global_batch` sequences beats (module doc), whatever its
    replicas, layouts, strategy and shares, and the recompute policy it assumes (None: no policy
    of the workload can fit one sequence, so no plan fits; the bound then takes the cheapest).
    Each policy's bound: `balanced_work_time` of the G sequences on every device (more devices can
    only be faster; recompute counted), with each device's work held to what its memory can hold
    (`memory_capped_work_time`), + `least_optimizer_time` (every plan's slowest rank runs an
    optimizer step at least that long after its replica's last micro-step; a one-replica plan's
    replay runs it after its passes too)."""
    opt = least_optimizer_time(cluster, model, options)
    pols = policies_of(workload)
    free = {p: balanced_work_time(cluster, model, workload.with_recompute(p), options) for p in pols}
    fit = [p for p in pols if sequence_can_fit(cluster, model, workload.with_recompute(p), options)]
    if not fit:
        return float(min(free.values()) + opt), None
    # both are bounds of the compute: the capped one is no smaller (up to the rounding of its bisection)
    each = {
        p: max(free[p], memory_capped_work_time(cluster, model, workload.with_recompute(p), options)) + opt for p in fit
    }
    best = min(fit, key=lambda p: (each[p], p))
    return float(each[best]), best


def plan_joint(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    dp: str | int = "auto",
    strategies: Sequence[Sharding] = STRATEGIES,
    options: CostOptions = CostOptions(),
    gap: float = DEFAULT_GAP,
    progress: bool = False,
    with_baselines: bool = True,
    workers: int | str = 1,
) -> JointResult:
    """The fastest joint plan (module doc). `dp`: "auto" (one replica or any partition), 1 (one
    replica, every strategy) or N (partitions of exactly N replicas given sequences). `workers`:
    processes that plan the replica shapes and the DP = 1 plan side by side ("auto": one per core
    from 64 GPUs up; the plan is the same for any number, planner/workers.py)."""
    t0 = time.perf_counter()
    G = workload.global_batch
    if dp != "auto" and (not isinstance(dp, int) or dp < 1):
        raise HexiSeqError(f"dp must be 'auto' or a positive number of replicas, got {dp!r}")
    if isinstance(dp, int) and dp > G:
        raise HexiSeqError(f"dp={dp} replicas cannot each take a sequence of a global batch of {G}")
    jobs = Jobs(resolve_workers(workers, cluster.size))
    try:
        with fewer_collections():
            return _plan_joint(
                cluster, model, workload, dp, strategies, options, gap, progress, with_baselines, jobs, t0
            )
    finally:
        jobs.close()


def _plan_joint(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    dp: str | int,
    strategies: Sequence[Sharding],
    options: CostOptions,
    gap: float,
    progress: bool,
    with_baselines: bool,
    jobs: Jobs,
    t0: float,
) -> JointResult:
    G = workload.global_batch
    notes: list[str] = []
    best_s, best_plan, best_label, best_policy = math.inf, None, "", str(workload.recompute)
    dp1, dp1_s = None, math.inf
    # with workers, the DP = 1 plan and the first partitions' shapes start now and are planned while
    # the baselines are scored here; what the search never takes is cancelled (Jobs.close)
    dp1_bound = _dp1_bound(cluster, model, workload, options) if dp == "auto" and G > 1 else 0.0
    dp1_job = None
    if dp in ("auto", 1) and jobs.workers > 1 and not progress:
        dp1_job = jobs.submit(_dp1_plan, cluster, model, workload, options)
    shapes = _Shapes(cluster, model, workload, options, jobs)
    parts: list[tuple[float, int, Partition]] = []
    if dp != 1 and G >= 2 and not cluster.overrides:
        for i, part in enumerate(partitions(cluster)):
            if len(part.replicas) < 2 or (isinstance(dp, int) and len(part.replicas) < dp):
                continue
            parts.append((shapes.partition_bound(part, G), i, part))
    elif cluster.overrides:
        notes.append("the cluster has link overrides: replica partitions are not searched (one replica only)")
    parts.sort(key=lambda x: (x[0], x[1]))
    if jobs.workers > 1:  # the search visits at most these (fewer when the bound stops it)
        shapes.prefetch(r for _, _, part in parts[:MAX_PARTITIONS_VISITED] for r in part.replicas)
    t_base = time.perf_counter()
    cache: dict = {}
    base = dp_baselines(cluster, model, workload, strategies, options, cache) if with_baselines else {}
    for b in base.values():  # never worse than a baseline: the best one is the incumbent
        if b.feasible and b.step_time_s < best_s * (1 - 1e-12) and (dp == "auto" or b.plan.num_replicas == dp):
            best_s, best_plan, best_label, best_policy = b.step_time_s, b.plan, f"baseline {b.name}", b.recompute
    t_base = time.perf_counter() - t_base
    visited = 0
    searched_lb = math.inf
    micro = MicroStepFloors(cluster, model, options)

    def visit(part: Partition) -> None:
        nonlocal best_s, best_plan, best_label, best_policy
        planned = [shapes.plan(r) for r in part.replicas]
        if any(p is None for p in planned):
            # a replica that cannot hold its own states may still run with them sharded over the
            # partition's devices (ZeRO over all devices): plan those shapes with that memory (the
            # others' own plans fit under it too)
            n = sum(len(replica_devices(cluster, r)) for r in part.replicas)
            planned = [p if p is not None else shapes.plan(r, shards=n) for r, p in zip(part.replicas, planned)]
            if any(p is None for p in planned):
                return
        for pol in sorted({pol for _, pol in planned}):
            wl = workload.with_recompute(pol)
            reps = [p for p, _ in planned]
            if lower_shares_bound([micro(r, wl) for r in reps], G) >= best_s:
                continue  # the replicas' own work alone is no faster than the best plan (no strategy helps)
            t, plan, _ = best_over_strategies(reps, cluster, model, wl, strategies, options, "hexiseq", cache)
            if plan is not None and isinstance(dp, int) and plan.num_replicas != dp:
                continue
            if plan is not None and t < best_s * (1 - 1e-12):
                best_s, best_plan, best_label, best_policy = t, plan, part.label, pol

    unvisited: list[tuple[float, int, Partition]] = []

    def search(entries: list[tuple[float, int, Partition]], limit: int | None) -> None:
        """Visit the partitions in the order of their balanced compute until it proves the rest
        slower (or `limit` are planned), passing over those whose floors are not below the best
        plan; what is not planned is left to the closing pass and its floor. (The shapes planned
        set the rates of the rate-balanced unions that follow.)"""
        nonlocal visited
        for k, (lb, _, part) in enumerate(entries):
            stop = lb >= best_s * (1 - gap)
            if stop or (limit is not None and visited >= limit):
                unvisited.extend(entries[k:])
                if not stop:
                    notes.append(
                        f"the search stopped after {visited} partitions planned in full: the bound covers the rest"
                    )
                return
            if shapes.partition_floor(part, G) >= best_s * (1 - gap):
                continue  # no plan of it beats the best found (within the gap): its shapes are not planned
            visited += 1
            visit(part)

    search(parts, MAX_PARTITIONS_VISITED)
    # then rate-balanced unions of nodes, dealt by the rates of the shapes planned so far (replicas.py)
    if parts:
        known = {partition_key(part.replicas) for _, _, part in parts}
        rates = shapes.node_rates()
        more = [
            (shapes.partition_bound(part, G), len(parts) + i, part)
            for i, part in enumerate(balanced_unions(cluster, G, rates.__getitem__))
            if partition_key(part.replicas) not in known and not (isinstance(dp, int) and len(part.replicas) < dp)
        ]
        more.sort(key=lambda x: (x[0], x[1]))
        if jobs.workers > 1:
            shapes.prefetch(r for lb, _, part in more if lb < best_s * (1 - gap) for r in part.replicas)
        search(more, None)
        parts += more
    # the closing pass: the partitions left whose floor is below the best plan, lowest floor first
    # (at most MAX_PARTITIONS_CLOSED), each planned in full; the floors of the others are the bound
    floors = {i: shapes.partition_floor(part, G) for lb, i, part in unvisited if lb < best_s * (1 - gap)}
    closing = sorted((floors[i], i, part) for _, i, part in unvisited if i in floors and floors[i] < best_s * (1 - gap))
    if jobs.workers > 1:
        shapes.prefetch(r for _, _, part in closing[:MAX_PARTITIONS_CLOSED] for r in part.replicas)
    closed: set[int] = set()
    for floor, i, part in closing[:MAX_PARTITIONS_CLOSED]:
        if floor >= best_s * (1 - gap):
            break
        closed.add(i)
        visited += 1
        visit(part)
    for lb, i, part in sorted(unvisited, key=lambda x: (x[0], x[1])):  # by balanced compute, below every floor
        if lb >= searched_lb:
            break
        if i not in closed:
            searched_lb = min(searched_lb, floors[i] if i in floors else shapes.partition_floor(part, G))
    # the DP = 1 planner (today's problem at this batch), unless a proven bound of its whole search
    # space is above the best plan found: it can then be neither faster nor the answer
    t_dp1 = time.perf_counter()
    if dp in ("auto", 1) and dp1_bound < best_s:
        if dp1_job is not None:
            dp1 = jobs.result(dp1_job)
        else:
            dp1 = plan_cluster(cluster, model, workload, progress=progress, options=options)
        wl1 = workload.with_recompute(dp1.recompute)
        one = [s for s in strategies if s.scope != ShardingScope.REPLICA]
        dp1_s, plan1, _ = best_over_strategies(
            [replace(dp1.plan, replicas=())], cluster, model, wl1, one, options, "hexiseq"
        )
        dp1_s = min(dp1_s, dp1.iteration_time_s)
        if plan1 is None or dp1.iteration_time_s <= dp1_s:
            plan1 = Plan.joint([replace(dp1.plan, replicas=())], [G], Sharding(), name="hexiseq")
        if dp1_s < best_s * (1 - 1e-12):
            best_s, best_plan, best_label, best_policy = dp1_s, plan1, "one replica (DP = 1 planner)", dp1.recompute
    elif dp in ("auto", 1):
        notes.append(
            f"the DP = 1 planner was not run: no one-replica plan of its search space beats {dp1_bound:.4g} s "
            f"(the bound of its device subsets), above this plan's {best_s:.4g} s"
        )
    t_dp1 = time.perf_counter() - t_dp1
    if best_plan is None:
        raise InfeasibleError(f"no joint plan of {G} sequences fits on {cluster.name} (dp={dp})")
    wl = workload.with_recompute(best_policy)
    identity = {"cluster_fingerprint": cluster_fingerprint(cluster)}
    if (spec := model_record(model)) is not None:
        identity["model_spec"] = spec
    best_plan = replace(
        best_plan,
        cluster=cluster.name,
        model=model.name,
        meta={"recompute": best_policy, "partition": best_label, **identity},
    )
    if not best_plan.replicas:
        best_plan = Plan.joint([best_plan], [G], best_plan.sharding, name="hexiseq", meta=best_plan.meta)
    step = estimate_step(best_plan, cluster, model, wl, options)
    bound_wl = replace(workload.with_recompute("none"), param_sharding="zero3")
    bound = compute_bound(cluster, model, bound_wl, options)
    lower, lower_policy = every_joint_plan_bound(cluster, model, workload, options)
    if lower_policy is None:
        policy_words = "(no recompute policy fits one sequence in the cluster's memory)"
    elif workload.recompute == "auto":
        fit = [
            p for p in policies_of(workload) if sequence_can_fit(cluster, model, workload.with_recompute(p), options)
        ]
        policy_words = (
            f"with {lower_policy} recompute (the least of the policies one sequence can fit under: {', '.join(fit)})"
        )
    else:
        policy_words = f"with {lower_policy} recompute"
    covers = (
        f"no plan at all (any replica partition, strategy or layout) beats {lower:.4g} s per step, the cluster's "
        f"balanced compute of {G} sequence{'s' * (G > 1)} {policy_words} and the least optimizer step; this "
        f"plan is within {1 - lower / step.step_time_s:.1%} of it"
    )
    if parts:
        covers += (
            f"; of the {len(parts)} replica partitions of the cluster's structure (whole nodes, node groups of "
            f"one type, GPUs inside a node, fast+slow node pairs, rate-balanced unions of nodes) {visited} were "
            "planned in full"
            + (
                f" and no plan of the others beats {searched_lb:.4g} s (their replicas' compute with the memory "
                "their shard groups leave them, in lockstep and with their collectives where those groups reach "
                "beyond their nodes)"
                if math.isfinite(searched_lb)
                else ""
            )
        )
    used = set(best_plan.rank_devices)
    left = [d for d in cluster.devices if d.index not in used]
    left_out = []
    if left:
        by: dict[str, int] = {}
        for d in left:
            by[d.gpu.name] = by.get(d.gpu.name, 0) + 1
        left_out.append(
            "left out: "
            + ", ".join(f"{n} x {g}" for g, n in by.items())
            + " (every partition and strategy that uses them was slower or did not fit; a replica given no "
            "sequence by the exact shares is left out)"
        )
    return JointResult(
        plan=best_plan,
        step=step,
        partition=best_label,
        step_time_s=step.step_time_s,
        tokens_per_s=step.tokens_per_s,
        bound_tokens_per_s=bound,
        efficiency_vs_bound=step.tokens_per_s / bound,
        lower_bound_s=lower,
        searched_bound_s=searched_lb,
        bound_covers=covers,
        dp1=dp1,
        dp1_step_s=dp1_s,
        plan_time_s=time.perf_counter() - t0,
        visited=visited,
        partitions=len(parts),
        shapes_planned=sum(1 for v in shapes.plans.values()),
        recompute=best_policy,
        stage_times_s={
            "DP = 1 planner": t_dp1,
            "DP baselines": t_base,
            "replica shapes": shapes.seconds,
            "partitions and strategies": time.perf_counter() - t0 - t_dp1 - t_base - shapes.seconds,
        },
        left_out=left_out,
        notes=notes,
        baselines=base,
        workers=jobs.workers,
    )


def to_dict(res: JointResult) -> dict[str, Any]:
    """The JSON object of `hexiseq plan --global-batch G --json`."""
    return {
        "partition": res.partition,
        "sharding": {"stage": str(res.plan.sharding.stage), "scope": str(res.plan.sharding.scope)},
        "replicas": [
            {
                "sequences": r.sequences,
                "devices": list(r.devices),
                "micro_step_s": r.micro_step_s,
                "time_s": r.time_s,
                "waiting_s": r.waiting_s,
            }
            for r in res.step.replicas
        ],
        "step_time_s": res.step_time_s,
        "tokens_per_s": res.tokens_per_s,
        "bound_tokens_per_s": res.bound_tokens_per_s,
        "efficiency_vs_bound": res.efficiency_vs_bound,
        "lower_bound_s": res.lower_bound_s,
        "searched_bound_s": res.searched_bound_s if math.isfinite(res.searched_bound_s) else None,
        "bound_covers": res.bound_covers,
        "dp1_step_s": res.dp1_step_s if math.isfinite(res.dp1_step_s) else None,
        "plan_time_s": res.plan_time_s,
        "workers": res.workers,
        "partitions": res.partitions,
        "visited": res.visited,
        "recompute": res.recompute,
        "sync_s": dict(res.step.sync_s),
        "left_out": list(res.left_out),
        "notes": list(res.notes),
        "baselines": {n: b.to_dict() for n, b in res.baselines.items()},
        "best_baseline": res.best_baseline.name if res.best_baseline else None,
        "speedup_vs_best_baseline": res.speedup_vs_best_baseline,
        "plan": res.plan.to_dict(),
    }
