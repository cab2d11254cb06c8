"""The step of a joint plan: data-parallel replicas under one parameter-sharding strategy.

A plan's replicas (`Plan.replicas`) run side by side on disjoint devices, each its own ring over the
whole sequence, replica i processing B_i sequences per step; the strategy is the plan's
(`Plan.sharding`: the one source of truth for a joint plan's sharding; the workload gives the
sequence, the recompute policy and the global batch). The step:

    step = max over lockstep sets of T_set + re-gather + max_r optimizer_r

- T_i: replica i's B_i micro-steps, the step replay (simulate.py) of `plan.replica(i)` with the
  strategy's per-micro-step collectives among the shard group (comm.sharding_collectives; the same
  prefetch/overlap rules as today's ZeRO-3 and DDP passes) and without its optimizer: a line
  T_i(B) = fixed_i + B·per_sequence_i (`ReplicaLine`).
- lockstep sets: under zero2 / zero3 every layer's collectives run over the shard group on every
  micro-step, so replicas joined by a shard group (directly or through others) wait for each other at
  each layer, and one with fewer sequences runs empty micro-steps until the busiest is done
  (runtime/sharding.py). Micro-step j of a set takes the longest j-th micro-step of its replicas that
  have one: T_set = max_i fixed_i + Σ_j max_{i: B_i ≥ j} per_sequence_i (`lockstep_time`). Under
  replicated and zero1 nothing is collective before the step's end: each replica is its own set,
  T_set = T_i. (On the CPU emulation a cluster with two speeds measured it: 2:2:1:1 shares under ZeRO-3
  over all devices took the slow replicas' micro-step plus the fast ones' second, not the slowest line.)
- the strategy's shard groups: scope "all" = every device of the plan, "replica" = each replica's
  devices, "node" = the plan's devices of each node; a replica's collectives take the seconds of the
  slowest shard group it has ranks in.
- hybrid scopes: each layer's gradient shard all-reduced across the copies in the last micro-step's
  backward (comm.step_collectives, simulate.pass_schedule: the last layer's and the root's exposed);
  zero1/zero2's re-gather of the updated weights after the optimizer: exposed. zero1 all-reduces
  whole gradients over every rank of the plan, as replicated does, whatever its scope (the executor's
  ZeRO-1, runtime/sharding.py): its shard groups split the optimizer step and the re-gather only.
- optimizer_r: the rank's optimizer step over its shard (params / its group's size under zero1-3).
A one-replica plan under zero3 or replicated over all devices is exactly `simulate`'s iteration
(the paper's setting): `estimate_step(plan).step_time_s == simulate(plan).iteration_time_s`.

Memory per rank: memory.py's categories of its replica's layout, with the model states of the
strategy over its shard group (memory.sharded_state_bytes).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import PlanError
from ..plan import Plan, ShardingScope, ShardingStage
from ..specs import GIB, ClusterSpec, ModelSpec, Workload
from .arrays import link_matrices, plan_arrays
from .bound import compute_bound
from .comm import ParamComm, StepCollectives, sharding_collectives, step_collectives
from .durations import coefficients, evaluate
from .kernels import CostOptions
from .memory import MEMORY_KEYS, memory_bytes, sharded_state_bytes
from .policy import rule_of
from .simulate import layer_chains, simulate_durations

STATE_KEYS = ("weights", "grads", "optimizer", "param_buffers")


@dataclass
class ReplicaStep:
    """One replica's share of the step."""

    index: int
    sequences: int
    devices: tuple[int, ...]
    gpus: dict[str, int]  # GPU type -> devices of this replica
    micro_step_s: float  # one sequence (its passes, collectives included, no optimizer)
    time_s: float  # its `sequences` micro-steps
    optimizer_s: float  # its slowest rank's optimizer step
    waiting_s: float  # inside its micro-steps, for the replicas it runs in lockstep with (module doc)
    memory_gib: float  # its fullest rank
    capacity_gib: float  # that rank's capacity
    fits: bool


@dataclass
class StepEstimate:
    """Time, throughput and memory of one step of a joint plan (module doc)."""

    plan: str
    sharding: str  # Sharding.describe()
    step_time_s: float
    tokens_per_s: float
    bound_tokens_per_s: float
    efficiency_vs_bound: float
    mfu: float
    fits: bool
    replicas: list[ReplicaStep]
    sync_s: dict[str, float]  # copies_allreduce, regather, optimizer: the terms after the slowest replica
    devices_used: int
    devices_left_out: int
    oom: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lines = [
            f"plan {self.plan!r}: {len(self.replicas)} replica{'s' * (len(self.replicas) > 1)}, sharding "
            f"{self.sharding}, {self.step_time_s:.4g} s/step, {self.tokens_per_s:,.0f} tokens/s, MFU {self.mfu:.1%}, "
            f"{self.efficiency_vs_bound:.1%} of the compute bound ({self.bound_tokens_per_s:,.0f} tokens/s); "
            f"{self.devices_used} devices used, {self.devices_left_out} left out"
        ]
        for r in self.replicas:
            gpus = ", ".join(f"{n}x {g}" for g, n in r.gpus.items())
            lines.append(
                f"  replica {r.index}: {gpus}; {r.sequences} sequence{'s' * (r.sequences > 1)} x "
                f"{r.micro_step_s:.4g} s = {r.time_s:.4g} s"
                + (f" + {r.waiting_s:.4g} s waiting in lockstep" if r.waiting_s > 0 else "")
                + f"; memory {r.memory_gib:.1f} of {r.capacity_gib:.1f} GiB"
                + ("" if r.fits else " (does not fit)")
            )
        lines.append(
            "  synchronisation: " + ", ".join(f"{k.replace('_', ' ')} {v:.4g} s" for k, v in self.sync_s.items())
        )
        lines += self.oom or ["memory: every rank fits"]
        return "\n".join(lines)


def shard_groups(plan: Plan, cluster: ClusterSpec) -> list[np.ndarray]:
    """The plan's shard groups as arrays of global ranks (module doc); [] when nothing is sharded."""
    stage, scope = plan.sharding.stage, plan.sharding.scope
    if stage == ShardingStage.REPLICATED or scope == ShardingScope.ALL:
        return [np.arange(plan.world_size)]
    if scope == ShardingScope.REPLICA:
        return [np.array(plan.replica_ranks(i)) for i in range(plan.num_replicas)]
    node = np.array([cluster.devices[d].node for d in plan.rank_devices])
    return [np.flatnonzero(node == n) for n in dict.fromkeys(node.tolist())]


def lockstep_sets(plan: Plan, groups: list[np.ndarray]) -> list[list[int]]:
    """The replicas that run in lockstep (module doc), as sets of replica indices: under zero2 /
    zero3 those joined through `groups` (the plan's shard groups), otherwise each replica alone."""
    n = plan.num_replicas
    if plan.sharding.stage not in (ShardingStage.ZERO2, ShardingStage.ZERO3) or n == 1:
        return [[i] for i in range(n)]
    replica_of = np.zeros(plan.world_size, dtype=np.int64)
    for i in range(n):
        r = plan.replica_ranks(i)
        replica_of[r.start : r.stop] = i
    root = list(range(n))

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i

    for g in groups:
        members = sorted({int(x) for x in replica_of[g]})
        for j in members[1:]:
            root[find(j)] = find(members[0])
    sets: dict[int, list[int]] = {}
    for i in range(n):
        sets.setdefault(find(i), []).append(i)
    return list(sets.values())


def lockstep_time(lines: list[ReplicaLine], shares: list[int]) -> float:
    """The micro-steps of replicas in lockstep (module doc): the longest fixed part of those given
    sequences, then micro-step j the longest per-sequence time of those with a j-th sequence. One
    replica: its own line, `fixed_s + B·per_sequence_s`."""
    used = [i for i, b in enumerate(shares) if b > 0]
    if not used:
        return 0.0
    t = max(lines[i].fixed_s for i in used)
    for j in range(max(shares)):
        t += max(lines[i].per_sequence_s for i in used if shares[i] > j)
    return t


@functools.lru_cache(maxsize=4096)
def _pass_shape_workload(workload: Workload, stage: ShardingStage, sequences: int) -> Workload:
    """The workload a replica's replay reads: its sequences, the zero3 or replicated pass shape
    (memoized: a validated Workload is immutable and costly to build)."""
    shape = "zero3" if stage in (ShardingStage.ZERO3, ShardingStage.ZERO2) else "replicated"
    return replace(workload, global_batch=sequences, param_sharding=shape)


@dataclass(frozen=True, eq=False)
class _Strategy:
    """The plan's sharding laid over its ranks."""

    stage: ShardingStage
    groups: list[np.ndarray]  # shard groups (global ranks)
    per_group: list[ParamComm]  # each group's per-micro-step collectives
    shards_of: np.ndarray  # [R] the size of each rank's shard group
    today: bool  # one replica, zero3 or replicated over all devices: coefficients' own terms
    sync: StepCollectives
    lockstep: list[list[int]]  # replica indices of each lockstep set (lockstep_sets)
    touching: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, init=False, repr=False)  # memo

    def groups_of(self, ranks: range) -> tuple[int, ...]:
        """Indices of the shard groups these ranks take part in, in group order (kept per range: the
        planner asks for each replica's under every batch share)."""
        key = (ranks.start, ranks.stop)
        got = self.touching.get(key)
        if got is None:
            got = self.touching[key] = tuple(
                j for j, g in enumerate(self.groups) if np.any((g >= ranks.start) & (g < ranks.stop))
            )
        return got


def _strategy(
    plan: Plan, cluster: ClusterSpec, model: ModelSpec, options: CostOptions, cache: dict | None = None
) -> _Strategy:
    """The plan's sharding over its ranks; `cache` (replica_lines' dict, one cluster and model)
    keeps it per (sharding, devices, replica ranks, options): the sequence counts do not change it."""
    key = None
    if cache is not None:
        key = (
            "strategy",
            plan.sharding,
            plan.rank_devices,
            tuple(g.size for g in plan.groups),
            tuple(r.groups for r in plan.replicas),  # with the group sizes: each replica's ranks
            options,
        )
        if key in cache:
            return cache[key]
    st = _build_strategy(plan, cluster, model, options, cache)
    if key is not None:
        cache[key] = st
    return st


def _build_strategy(
    plan: Plan, cluster: ClusterSpec, model: ModelSpec, options: CostOptions, cache: dict | None = None
) -> _Strategy:
    stage = plan.sharding.stage
    bw_all, lat_all = link_matrices(cluster)
    dev = np.array(plan.rank_devices, dtype=np.int64)
    groups = shard_groups(plan, cluster)
    shards_of = np.zeros(plan.world_size, dtype=np.int64)
    for g in groups:
        shards_of[g] = len(g)
    # The collectives depend only on the shard groups' device sets (the slowest link and largest
    # latency among or across them): kept per set in `cache`, as many plans share them (on 1,024
    # devices each costs a scan of a million links).
    memo = cache if cache is not None else {}
    sets = [tuple(sorted(int(d) for d in dev[g])) for g in groups]
    if options.ignore_comm:
        sync = StepCollectives()
    else:
        key = ("step collectives", stage, tuple(sorted(sets)))
        if key not in memo:
            union = np.sort(dev)  # the shard groups cover the plan's ranks
            local = [np.searchsorted(union, s) for s in sets]
            memo[key] = step_collectives(
                stage, local, bw_all[np.ix_(union, union)], lat_all[np.ix_(union, union)], model
            )
        sync = memo[key]
    per_group = []
    for s in sets:
        # zero1 reduces whole gradients over every rank of the plan (comm.py's module doc); its shard
        # groups only split the optimizer step and the re-gather
        s = tuple(sorted(int(d) for d in dev)) if stage == ShardingStage.ZERO1 else s
        key = ("shard collectives", stage, s)
        if key not in memo:
            idx = np.array(s, dtype=np.int64)
            memo[key] = sharding_collectives(stage, bw_all[np.ix_(idx, idx)], lat_all[np.ix_(idx, idx)], model)
        per_group.append(replace(memo[key], xr_layer=sync.copies_layer_s, xr_root=sync.copies_root_s))
    today = plan.num_replicas == 1 and plan.sharding.scope == ShardingScope.ALL and stage in ("zero3", "replicated")
    return _Strategy(stage, groups, per_group, shards_of, today, sync, lockstep_sets(plan, groups))


def _replica_coefficients(
    plan: Plan,
    i: int,
    sequences: int,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
    st: _Strategy,
    base: tuple | None = None,
    ranks: range | None = None,
):
    """(arrays, coefficients, workload) of replica i's `sequences` micro-steps under the strategy
    (`base`: the replica's arrays and coefficients already built, under the same pass shape;
    `ranks`: its global ranks, plan.replica_ranks(i), when the caller has them)."""
    ranks = plan.replica_ranks(i) if ranks is None else ranks
    wl = _pass_shape_workload(workload, st.stage, sequences)
    if base is None:
        a = plan_arrays(plan.replica(i), cluster, model, wl, options)
        c = coefficients(a, model, wl, options)
    else:
        a, c = base
    if not st.today:  # the paper's setting keeps coefficients' own terms (bit for bit)
        n_r = st.shards_of[ranks.start : ranks.stop]
        # a replica's collectives run in the shard groups it takes part in, paced by the slowest of them
        mine = [st.per_group[j] for j in st.groups_of(ranks)]
        pc = max(mine, key=lambda p: (p.ag_layer + p.rs_layer + p.ar_layer, p.ag_root + p.rs_root + p.ar_root))
        n_opt = n_r if st.stage != ShardingStage.REPLICATED else 1
        c = replace(
            c,
            params=pc if c.comm else c.params,  # without communication: the zero collectives
            optimizer=model.param_count / n_opt * a.work.optimizer,
        )
    return a, c, wl


@dataclass(frozen=True)
class ReplicaLine:
    """A replica's time as a function of its sequences: B micro-steps take `fixed_s + B·per_sequence_s`
    (without the optimizer, `optimizer_s`); its memory does not depend on B."""

    fixed_s: float
    per_sequence_s: float
    optimizer_s: float
    fits: bool
    memory_gib: float  # its fullest rank (relative to capacity)

    def time_s(self, sequences: int) -> float:
        return self.fixed_s + sequences * self.per_sequence_s if sequences > 0 else 0.0


def replica_lines(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    cache: dict | None = None,
) -> list[ReplicaLine]:
    """Every replica's `ReplicaLine` under the plan's sharding, whatever sequence counts the plan
    holds (the replay is linear in B: replayed at B = 1 and 2). Identical replicas (same GPUs, node
    pattern, layout and collectives) are replayed once; `cache` (a dict the caller keeps, for one
    cluster, model and block size) shares across calls (other strategies, other partitions) the
    replicas' arrays, coefficients, durations, layer passes (simulate.layer_chains: the collectives,
    optimizer and batch only schedule them) and memory, the plans' strategies and validity checks."""
    cache = {} if cache is None else cache
    rule_of(workload)
    if ("checked", plan) not in cache:  # the same plan is scored under each of its batch shares' callers
        plan.check(cluster, model)
        cache[("checked", plan)] = True
    st = _strategy(plan, cluster, model, options, cache)
    out: list[ReplicaLine] = []
    seen: dict[tuple, ReplicaLine] = {}
    if ("devices",) not in cache:  # what a replica's key reads of each device
        cache[("devices",)] = [(d.gpu.name, d.nic_gbps, d.link_bandwidth_gbps, d.node) for d in cluster.devices]
    info = cache[("devices",)]
    pass_shape = (_pass_shape_workload(workload, st.stage, 1).param_sharding, str(workload.recompute), workload.seq_len)
    for i in range(plan.num_replicas):
        span = plan.replica_groups(i)
        groups = plan.groups[span.start : span.stop]
        devices = tuple(d for g in groups for d in g.devices)
        ranks = plan.replica_ranks(i)
        if ("device key", devices) not in cache:
            first: dict[int, int] = {}
            for j, d in enumerate(devices):
                first.setdefault(info[d][3], j)
            cache[("device key", devices)] = tuple(
                (info[d][0], info[d][1], info[d][2], first[info[d][3]]) for d in devices
            )
        key = (
            cache[("device key", devices)],
            tuple((g.size, g.chunk_len, g.shards, g.heads) for g in groups),
            pass_shape,
            tuple(int(x) for x in st.shards_of[ranks.start : ranks.stop]),
            None
            if st.today
            else tuple(
                (p.ag_layer, p.rs_layer, p.ar_layer, p.ag_root, p.rs_root, p.ar_root, p.xr_layer, p.xr_root)
                for p in (st.per_group[j] for j in st.groups_of(ranks))
            ),
            (str(st.stage), st.today),
        )
        if key not in seen and ("line", key) in cache:
            seen[key] = cache[("line", key)]
        if key not in seen:
            sub = plan.replica(i)
            own = sub.replicas[0].sequences if sub.replicas else workload.global_batch  # what its check expects
            shape = key[:3]  # the replica without its strategy
            if shape not in cache:
                cache[shape] = _replica_coefficients(
                    plan, i, own, cluster, model, workload, options, replace(st, today=True)
                )[:2]
            if ("layer", shape) not in cache:  # its durations, layer passes and memory, whatever the strategy
                a0, c0 = cache[shape]
                d0 = evaluate(c0, a0.s, a0.L)
                mem0 = memory_bytes(a0, model, _pass_shape_workload(workload, st.stage, 1), d0.recv_bytes, options)
                cache[("layer", shape)] = (d0, layer_chains(d0), mem0)
            d0, chains, mem0 = cache[("layer", shape)]
            a, c, _ = _replica_coefficients(plan, i, own, cluster, model, workload, options, st, cache[shape], ranks)
            d = replace(d0, c=c, optimizer=c.optimizer)  # = evaluate(c, a.s, a.L): c differs in params, optimizer
            t = []
            for B in (1, 2):
                sim = simulate_durations(replace(d, c=replace(c, batch=B)), chains=chains, phases=False)
                opt = sim.passes["optimizer"][1]
                t.append(sim.iteration_time_s - opt)
            total = _replica_memory(a, d, model, workload, options, st, ranks, mem0)
            worst = int(np.argmax(total - a.capacity))
            seen[key] = cache[("line", key)] = ReplicaLine(
                2 * t[0] - t[1], t[1] - t[0], opt, bool((total <= a.capacity).all()), float(total[worst] / GIB)
            )
        out.append(seen[key])
    return out


def compose_step(
    replica_s: list[float], optimizer_s: list[float], sync_s: float, whole: list[float] | None = None
) -> float:
    """The step (module doc): the slowest lockstep set's micro-steps (`replica_s`: each set's), the
    synchronisation, the slowest optimizer. One replica: its replayed iteration `whole[0]` (with its
    optimizer) plus the synchronisation, so the paper's setting is the replay's number bit for bit."""
    if len(replica_s) == 1 and whole is not None:
        return whole[0] + sync_s
    return max(replica_s) + sync_s + max(optimizer_s)


def step_time(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec,
    lines: list[ReplicaLine],
    options: CostOptions = CostOptions(),
    cache: dict | None = None,
) -> float:
    """`estimate_step`'s step time from the replicas' lines at the plan's sequence counts (no
    replay: the planner scores batch shares with it; `cache`: replica_lines' dict)."""
    st = _strategy(plan, cluster, model, options, cache)
    seqs = [r.sequences for r in plan.replicas] if plan.replicas else None
    if seqs is None:
        raise PlanError("step_time needs a plan with replicas (their sequence counts)")
    sets = [lockstep_time([lines[i] for i in m], [seqs[i] for i in m]) for m in st.lockstep]
    return compose_step(sets, [ln.optimizer_s for ln in lines], st.sync.total_s)


def _replica_memory(
    a,
    d,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
    st: _Strategy,
    ranks: range,
    base: dict[str, np.ndarray] | None = None,
):
    """[R] bytes per rank of a replica: memory.py's categories, the strategy's model states
    (`base`: memory_bytes of the replica under its pass shape, already computed; not modified)."""
    if base is None:
        base = memory_bytes(a, model, _pass_shape_workload(workload, st.stage, 1), d.recv_bytes, options)
    mem = dict(base)
    if not st.today:
        states = sharded_state_bytes(model, st.stage, st.shards_of[ranks.start : ranks.stop].astype(np.float64))
        for key in STATE_KEYS:
            mem[key] = np.zeros(a.R) + states[key]
    return sum(mem[k] for k in MEMORY_KEYS)


def estimate_step(
    plan: Plan, cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> StepEstimate:
    """One step of `plan` (module doc): each replica replayed under the plan's sharding, the slowest
    replica's micro-steps, the synchronisation terms, the optimizer; memory per rank."""
    rule_of(workload)  # refuses "auto" before any work
    plan.check(cluster, model, workload if plan.replicas else None)
    seqs = plan.sequences_of(workload.global_batch)
    st = _strategy(plan, cluster, model, options)
    replicas: list[ReplicaStep] = []
    oom: list[str] = []
    times, opts = [], []
    for i, B in enumerate(seqs):
        sub = plan.replica(i)
        ranks = plan.replica_ranks(i)
        a, c, wl = _replica_coefficients(plan, i, B, cluster, model, workload, options, st)
        d = evaluate(c, a.s, a.L)
        sim = simulate_durations(d)
        opt = sim.passes["optimizer"][1]
        times.append(sim.iteration_time_s)
        opts.append(opt)
        total = _replica_memory(a, d, model, wl, options, st, ranks)
        worst = int(np.argmax(total - a.capacity))
        fits = bool((total <= a.capacity).all())
        for r in np.flatnonzero(total > a.capacity):
            oom.append(
                f"replica {i}, rank {ranks.start + int(r)} (device {int(a.dev[r])}, "
                f"{cluster.devices[int(a.dev[r])].gpu.name}) needs {total[r] / GIB:.2f} GiB but has "
                f"{a.capacity[r] / GIB:.2f} GiB"
            )
        gpus: dict[str, int] = {}
        for dv in sub.rank_devices:
            name = cluster.devices[dv].gpu.name
            gpus[name] = gpus.get(name, 0) + 1
        replicas.append(
            ReplicaStep(
                index=i,
                sequences=B,
                devices=sub.rank_devices,
                gpus=gpus,
                micro_step_s=(sim.iteration_time_s - opt) / B,
                time_s=sim.iteration_time_s - opt,
                optimizer_s=opt,
                waiting_s=0.0,
                memory_gib=float(total[worst] / GIB),
                capacity_gib=float(a.capacity[worst] / GIB),
                fits=fits,
            )
        )
    sync = st.sync
    own = [t - o for t, o in zip(times, opts)]
    set_s = [max(own[i] for i in m) for m in st.lockstep]
    if any(len(m) > 1 for m in st.lockstep):  # replicas in lockstep: from their lines (the replay is linear in B)
        lines = replica_lines(plan, cluster, model, workload, options)
        for k, m in enumerate(st.lockstep):
            if len(m) > 1:
                set_s[k] = lockstep_time([lines[i] for i in m], [seqs[i] for i in m])
                for i in m:
                    replicas[i].waiting_s = max(0.0, set_s[k] - own[i])
    step = compose_step(set_s, opts, sync.total_s, whole=times if len(times) == 1 else None)
    tokens = workload.seq_len * sum(seqs)
    # the bound of every strategy: its optimizer term is the least one, params / N (zero3 over all devices)
    bound = compute_bound(cluster, model, replace(workload, global_batch=sum(seqs), param_sharding="zero3"), options)
    tps = tokens / step
    flops = model.training_flops(workload.seq_len) * sum(seqs)
    return StepEstimate(
        plan=plan.name,
        sharding=plan.sharding.describe(),
        step_time_s=step,
        tokens_per_s=tps,
        bound_tokens_per_s=bound,
        efficiency_vs_bound=tps / bound,
        mfu=flops / (step * cluster.peak_pflops * 1e15),
        fits=not oom,
        replicas=replicas,
        sync_s={
            "copies_allreduce": model.layers * sync.copies_layer_s + sync.copies_root_s,  # in the last backward
            "regather": sync.regather_s,
            "optimizer": max(opts),
        },
        devices_used=plan.world_size,
        devices_left_out=cluster.size - plan.world_size,
        oom=oom,
    )
