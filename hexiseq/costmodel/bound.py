"""The compute-bound throughput of a cluster for a workload: the limit no plan can beat.

The bound is the throughput of a perfectly balanced iteration with no communication, no
recompute and no waiting, timed with the kernel-time model every other part uses (kernels.py), so
every loss below it is imbalance, communication, recompute or a kernel cost the bound leaves out
(the causal-tile waste and the per-row block cost of attention, both >= 0, are left out: the
bound stays a bound). Useful FLOPs (`useful_flops`, `Estimate.model_flops`) are a different
number: 3 × forward, recompute not counted.

Per device i (kernels.WorkTimes; B = global_batch, S = seq_len, Λ = layers, H = heads):
    token work      τ_i = Λ·(pre + post, forward and backward) + head   seconds per token
    attention work  ρ_i = (1 + attn_bwd_factor)·pair                    seconds per (query, key)
                                                                        pair per head per layer
    total work      B·S tokens and B·Λ·H·S(S+1)/2 pair-heads (a zigzag group g does exactly
                    L_g·(S+1) pairs per head, so a plan's pairs always sum to this)
The fastest conceivable compute time is the LP

    t* = min t  s.t.  Σ_i x_i = B·S, Σ_i y_i = B·Λ·H·S(S+1)/2, x_i·τ_i + y_i·ρ_i ≤ t, x, y ≥ 0,

each device doing the kind of work it is relatively best at; solved exactly by sorting the devices
by (1/ρ_i)/(1/τ_i) and finding the split device. The optimizer step is added as the least of its
per-rank times over the cluster (params/N under zero3, all params replicated): every plan's last
rank pays at least that on top of its share of the work. Bound = B·S / (t* + optimizer) tokens/s.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..plan import ShardingStage
from ..specs import ClusterSpec, ModelSpec, Workload
from .arrays import link_matrices
from .comm import ParamComm, collective_link, param_collectives, sharding_collectives
from .kernels import CostOptions, WorkTimes, work_times
from .memory import memory_terms, sharded_state_bytes
from .paths import Pass, StepShape
from .policy import rule_of
from .simulate import pass_schedule


def useful_flops(model: ModelSpec, workload: Workload) -> tuple[float, float]:
    """(F_lin, F_att): useful FLOPs of one iteration split into matmuls and attention."""
    S, B = workload.seq_len, workload.global_batch
    f_lin = 3.0 * B * S * model.linear_flops_per_token
    f_att = 3.0 * B * model.layers * model.heads * model.attention_flops_per_pair * model.causal_pairs(S)
    return f_lin, f_att


def min_compute_time(m: np.ndarray, a: np.ndarray, f_lin: float, f_att: float) -> float:
    """t* of the LP above for devices with rates m (token work / s) and a (attention work / s)."""
    m = np.asarray(m, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    if f_att <= 0:
        return f_lin / m.sum()
    if f_lin <= 0:
        return f_att / a.sum()
    order = np.argsort(-(a / m), kind="stable")
    m, a = m[order], a[order]
    A_before = np.concatenate([[0.0], np.cumsum(a)[:-1]])  # attention capacity of devices before i
    M_after = m.sum() - np.cumsum(m)  # matmul capacity of devices after i
    # device i splits: attention share θ, t·(A_before + θ a_i) = F_att, t·(M_after + (1-θ) m_i) = F_lin
    theta = (f_att * (M_after + m) - f_lin * A_before) / (f_att * m + f_lin * a)
    # along the device order the balance moves monotonically: the split device is the first with θ <= 1
    i = int(np.argmax(theta <= 1.0)) if (theta <= 1.0).any() else len(m) - 1
    th = min(max(float(theta[i]), 0.0), 1.0)
    return max(
        f_lin / (M_after[i] + (1 - th) * m[i]) if M_after[i] + (1 - th) * m[i] > 0 else 0.0,
        f_att / (A_before[i] + th * a[i]) if A_before[i] + th * a[i] > 0 else 0.0,
    )


def kernel_rates(
    cluster: ClusterSpec, model: ModelSpec, options: CostOptions = CostOptions()
) -> tuple[np.ndarray, np.ndarray]:
    """Per device (tokens/s, pair-heads/s) of training work under the kernel-time model: 1/τ_i, 1/ρ_i."""
    w = work_times([d.gpu for d in cluster.devices], model, options)
    tau = model.layers * w.token_fwd_bwd + w.head
    rho = (1.0 + w.attn_bwd_factor) * w.pair
    return 1.0 / tau, 1.0 / rho


def min_iteration_time(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> float:
    """Seconds of the perfectly balanced, communication- and recompute-free iteration (module doc)."""
    tok_rate, att_rate = kernel_rates(cluster, model, options)
    S, B = workload.seq_len, workload.global_batch
    work = min_compute_time(
        tok_rate, att_rate, float(B * S), float(B * model.layers * model.heads * model.causal_pairs(S))
    )
    w = work_times([d.gpu for d in cluster.devices], model, options)
    local_params = model.param_count / (options.shards(cluster.size) if workload.param_sharding == "zero3" else 1)
    return work + float((local_params * w.optimizer).min())


def subset_time_bound(
    cluster: ClusterSpec,
    devices: Sequence[int],
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    stage: ShardingStage | None = None,
) -> float:
    """Seconds no plan on exactly these devices can beat under the workload's (concrete) recompute
    policy, whatever its grouping, ring order or split: the larger of two bounds. (1) The balanced,
    communication-free iteration of `min_compute_time` with the policy's recompute counted
    (selective: the linear forward again; full: the whole layer forward again) plus the least
    optimizer step. (2) The step replay's pass structure (simulate.pass_schedule): every pass of a
    kind takes at least the balanced compute of one such pass and its prefetched parameter
    collective with the slowdown it causes; the exposed collectives add; the collectives are those
    of these devices (comm.param_collectives: they depend on the set of devices only; `stage`: those
    of that sharding stage over these devices, comm.sharding_collectives). The planner prunes a
    candidate whose subset cannot beat the best plan found."""
    w = work_times([cluster.devices[d].gpu for d in devices], model, options)
    if options.ignore_comm:
        pc = ParamComm(workload.param_sharding)
    else:
        bw, lat = link_matrices(cluster)
        idx = np.asarray(list(devices), dtype=np.int64)
        sub_bw, sub_lat = bw[np.ix_(idx, idx)], lat[np.ix_(idx, idx)]
        if stage is None:
            pc = param_collectives(sub_bw, sub_lat, model, workload)
        else:
            pc = sharding_collectives(stage, sub_bw, sub_lat, model)
    return _pass_bound(w, len(devices), pc, model, workload, options, min_compute_time)


def one_replica_bound(
    cluster: ClusterSpec,
    devices: Sequence[int],
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
) -> float:
    """Seconds no one-replica plan on exactly these devices beats under the workload's (concrete)
    recompute policy and any sharding strategy (costmodel/step.py: its shard group is every device
    of the plan or each node's): `subset_time_bound` without communication where a strategy with no
    per-micro-step collective beyond a node can hold a sequence (zero1 over the devices, or zero2 /
    zero3 inside each node: `SequenceRoom` with the states they hold), else with the per-micro-step
    collectives of zero2 or zero3 over the devices, whichever can hold one; inf where none can. The
    optimizer step is the least (its states sharded over the devices)."""
    n = len(devices)
    per_node = Counter(cluster.devices[d].node for d in devices)
    wl = replace(workload, param_sharding="zero3")
    local = (
        HeldStates((ShardingStage.ZERO1,), n),
        HeldStates((ShardingStage.ZERO2, ShardingStage.ZERO3), max(per_node.values())),
    )
    classes: list[tuple[tuple[HeldStates, ...], ShardingStage | None]] = [
        (local, None),
        ((HeldStates((ShardingStage.ZERO2,), n),), ShardingStage.ZERO2),
        ((HeldStates((ShardingStage.ZERO3,), n),), ShardingStage.ZERO3),
    ]
    best = math.inf
    for helds, stage in classes:
        if any(SequenceRoom(cluster, model, wl, options, held).can_hold(devices) for held in helds):
            opts = options if stage is not None else replace(options, ignore_comm=True)
            best = min(best, subset_time_bound(cluster, devices, model, wl, opts, stage))
    return best


def outer_group_collectives_floor(
    cluster: ClusterSpec,
    devices: Sequence[int],
    model: ModelSpec,
    options: CostOptions = CostOptions(),
) -> dict[ShardingStage, float] | None:
    """Per sharding stage, the seconds each micro-step (one more sequence) of a replica on `devices`
    spends at least in the stage's per-micro-step parameter collectives when its shard group holds a
    device outside the replica's nodes (None: the replica spans every node, so no group does; 0 under
    zero1 and replicated, whose reductions run once per step). The replay (simulate.pass_schedule)
    runs a pass with a prefetched collective of c seconds in at least c·(1 + overlap slowdown) and an
    exposed one in full; its collectives (comm.sharding_collectives) take longer over more ranks, a
    slower link and a longer latency. Such a group has at least one rank more than the replica; its
    slowest link is no faster than the replica's own slowest nor than the best one outside device has
    to every device of the replica, and its largest latency no shorter."""
    nodes = {cluster.devices[d].node for d in devices}
    outside = np.array([d.index for d in cluster.devices if d.node not in nodes], dtype=np.int64)
    if not len(outside):
        return None
    bw, lat = link_matrices(cluster)
    idx = np.asarray(list(devices), dtype=np.int64)
    inner_bw, inner_lat = collective_link(bw[np.ix_(idx, idx)], lat[np.ix_(idx, idx)])
    link_bw = min(inner_bw, float(bw[np.ix_(idx, outside)].min(axis=0).max()))
    link_lat = max(inner_lat, float(lat[np.ix_(idx, outside)].max(axis=0).min()))
    n = len(idx) + 1
    group_bw = np.full((n, n), link_bw)
    np.fill_diagonal(group_bw, np.inf)
    group_lat = np.full((n, n), link_lat)
    np.fill_diagonal(group_lat, 0.0)
    slow = float(work_times([cluster.devices[d].gpu for d in idx], model, options).overlap_slowdown.min())

    def seconds(pc: ParamComm, batch: int) -> float:
        total = 0.0
        for step in pass_schedule(StepShape(params=pc, layers=model.layers, batch=batch, comm=True)):
            total += step.count * (step.collective_s * (1.0 + slow) if isinstance(step, Pass) else step.seconds)
        return total

    out = {stage: 0.0 for stage in ShardingStage}
    for stage in (ShardingStage.ZERO2, ShardingStage.ZERO3):
        pc = sharding_collectives(stage, group_bw, group_lat, model)
        out[stage] = seconds(pc, 2) - seconds(pc, 1)  # what one more micro-step adds (linear in the batch)
    return out


def recompute_work_times(w: WorkTimes, model: ModelSpec, workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Per device (τ seconds per token, ρ seconds per pair-head per layer) of one sequence's
    training work under the workload's concrete recompute policy (module doc's τ_i and ρ_i, with
    what the policy runs again in backward: the linear forward (selective), the whole layer
    forward (full))."""
    again = rule_of(workload).backward_factors()
    fwd_tok = w.pre_fwd + w.post_fwd
    tau = model.layers * (w.token_fwd_bwd + again.rerun_linear * fwd_tok + again.replay_layer * fwd_tok) + w.head
    rho = (1.0 + w.attn_bwd_factor + again.replay_layer) * w.pair
    return tau, rho


def balanced_work_time(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> float:
    """Seconds of the balanced, communication-free compute of `workload.global_batch` sequences on
    all the cluster's devices under the workload's concrete recompute policy (`min_compute_time`
    of `recompute_work_times`; no optimizer). Any plan's replicas, side by side on disjoint devices
    for as long as the slowest of them, do at least this work: no plan's replicas finish sooner."""
    w = work_times([d.gpu for d in cluster.devices], model, options)
    tau, rho = recompute_work_times(w, model, workload)
    S, B = workload.seq_len, workload.global_batch
    return min_compute_time(
        1.0 / tau, 1.0 / rho, float(B * S), float(B * model.layers * model.heads * model.causal_pairs(S))
    )


def least_optimizer_time(cluster: ClusterSpec, model: ModelSpec, options: CostOptions = CostOptions()) -> float:
    """The least optimizer step of any rank of any plan on the cluster: its parameters sharded over
    every device (no shard group is larger), on the fastest device (`min_iteration_time`'s term)."""
    w = work_times([d.gpu for d in cluster.devices], model, options)
    return float((model.param_count / options.shards(cluster.size) * w.optimizer).min())


@dataclass(frozen=True)
class HeldStates:
    """The model states every rank of the plans a memory bound covers holds at least: the least over
    `stages` of their states (memory.sharded_state_bytes) with the sharded ones split over `shards`
    devices (0: every device of the cluster, or `CostOptions.state_shards` if more)."""

    stages: tuple[ShardingStage, ...] = tuple(ShardingStage)
    shards: int = 0


def sequence_memory(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
    held: HeldStates = HeldStates(),
) -> tuple[np.ndarray, float, float]:
    """What memory.py's model leaves any plan of the workload's concrete recompute policy, per
    sequence: ([N] bytes each device has for one sequence's activations, c_s bytes per shard token,
    c_w bytes per unit of w = η·L_g). Each category but the model states is const + c_s·s + c_w·w +
    c_u·u with coefficients >= 0, and u >= w / group_size (a rank's η query heads touch at least
    η / group_size KV heads), so c_w takes c_u / group_size. A device's room: its capacity less the
    reserved fraction, the least model states of any rank (`held`: by default the least over the
    sharding stages with every device in the shard group) and the constant terms; 0 when that is
    negative."""
    shards = held.shards or options.shards(cluster.size)
    per_stage = [sharded_state_bytes(model, stage, shards) for stage in held.stages]
    states = min(sum(x.values()) for x in per_stage)
    terms = [
        t for key, t in memory_terms(model, workload, cluster.size, options=options).items() if key not in per_stage[0]
    ]
    c_s = sum(t.c_s for t in terms)
    c_w = sum(t.c_w + t.c_u / model.group_size for t in terms)
    cap = np.array([d.gpu.memory_bytes for d in cluster.devices], dtype=np.float64)
    room = np.maximum(0.0, cap * (1.0 - options.reserved_fraction) - states - sum(t.const for t in terms))
    return room, c_s, c_w


class SequenceRoom:
    """Whether a device set can hold one sequence of the workload at all (`sequence_can_fit`'s
    condition on these devices: the sum of their room, `sequence_memory`, with the model states
    sharded over the whole cluster, the most any plan shards them). A plan on devices that cannot
    is no plan: it does not fit in memory, so no bound needs to cover it."""

    def __init__(
        self,
        cluster: ClusterSpec,
        model: ModelSpec,
        workload: Workload,
        options: CostOptions,
        held: HeldStates = HeldStates(),
    ) -> None:
        self.room, c_s, c_w = sequence_memory(cluster, model, workload, options, held)
        self.need = workload.seq_len * (c_s + c_w * model.heads / 2)

    def can_hold(self, devices: Sequence[int]) -> bool:
        return float(self.room[list(devices)].sum()) >= self.need

    def fewest(self, devices: Sequence[int]) -> float:
        """The fewest of `devices` that can hold a sequence (those with the most room); inf if all cannot."""
        total = np.cumsum(np.sort(self.room[list(devices)])[::-1])
        k = int(np.searchsorted(total, self.need))  # the first prefix whose room reaches the need
        return float(k + 1) if k < len(total) else math.inf


def sequence_can_fit(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    held: HeldStates = HeldStates(),
) -> bool:
    """False when no plan of the workload's concrete recompute policy fits, whatever its replicas,
    layout or strategy: a necessary condition of memory.py's model. Every plan has a replica holding
    one whole sequence at a time; summed over that replica's ranks (`sequence_memory`), Σ s = S (its
    shards) and Σ w = H·S/2 (each group's heads over its n_g = 2·L_g tokens), so the sequence's
    S·(c_s + c_w·H/2) must fit in the devices' room (`held`: the states those plans hold at least)."""
    return SequenceRoom(cluster, model, workload, options, held).can_hold(range(cluster.size))


def memory_capped_work_time(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    held: HeldStates = HeldStates(),
) -> float:
    """`balanced_work_time` with each device's work held to what its memory can hold (inf when no
    plan fits: `sequence_can_fit`). A rank of a replica keeps, for each of its replica's sequences
    in turn, its shard's s tokens and its heads' w = η·L_g, which are its token work (s) and its
    attention work per layer (w·(S+1) pair-heads: a zigzag group does L_g·(S+1) pairs per head), so
    per sequence c_s·s + c_w·w <= room (`sequence_memory`). Over a step, a device does B of its
    replica's sequences, B <= G: its total token work x and pair-head work y satisfy
    c_s·x + c_w·y / (Λ·(S+1)) <= G·room. The least t with Σ x = G·S, Σ y = G·Λ·H·S(S+1)/2 and
    x·τ + y·ρ <= t on every device under these caps is G times the one-sequence problem; it is found
    by bisection on t, feasibility being exact: the sum of the devices' polygons {x, y >= 0,
    x·τ + y·ρ <= t, c_s·x + c_y·y <= room} (down-closed) holds the target iff it does along every
    edge normal of the summands, (1, 0), (0, 1), (τ, ρ) and (c_s, c_y). The infeasible end is
    returned: never above the optimum. `held`: a bound of the plans that hold at least these model
    states (`sequence_memory`)."""
    if not sequence_can_fit(cluster, model, workload, options, held):
        return math.inf
    room, c_s, c_w = sequence_memory(cluster, model, workload, options, held)
    w = work_times([d.gpu for d in cluster.devices], model, options)
    tau, rho = recompute_work_times(w, model, workload)
    S, G = workload.seq_len, workload.global_batch
    X, Y = float(S), float(model.layers * model.heads * model.causal_pairs(S))  # one sequence
    c_y = c_w / (model.layers * (S + 1))
    classes: dict[tuple[float, float, float], int] = {}
    for key in zip(tau.tolist(), rho.tolist(), room.tolist()):
        classes[key] = classes.get(key, 0) + 1
    normals = [(1.0, 0.0), (0.0, 1.0), (c_s, c_y)] + [(t_, r_) for t_, r_, _ in classes]

    def support(t: float, a: float, b: float) -> float:
        total = 0.0
        for (ta, ro, m), n in classes.items():
            x0 = min(t / ta, m / c_s) if c_s > 0 else t / ta
            y0 = min(t / ro, m / c_y) if c_y > 0 else t / ro
            best = max(a * x0, b * y0)
            det = ta * c_y - ro * c_s
            if det != 0.0:  # the corner where the time and the memory lines cross
                x, y = (t * c_y - ro * m) / det, (ta * m - c_s * t) / det
                if x >= 0.0 and y >= 0.0:
                    best = max(best, a * x + b * y)
            total += n * best
        return total

    def feasible(t: float) -> bool:
        return all(support(t, a, b) >= a * X + b * Y for a, b in normals)

    lo = min_compute_time(1.0 / tau, 1.0 / rho, X, Y)  # without the caps: no larger
    if feasible(lo):
        return G * lo
    hi = 2.0 * lo
    while not feasible(hi):
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return G * lo


ComputeFloor = Callable[[np.ndarray, np.ndarray, float, float], float]


def _pass_bound(
    w: WorkTimes,
    n_devices: int,
    pc: ParamComm,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
    compute: ComputeFloor,
    any_subset: bool = False,
) -> float:
    """subset_time_bound's two bounds (its doc) from the devices' work times `w`, their number and
    their parameter collectives `pc`; `compute(m, a, f_lin, f_att)` is the balanced compute time of
    rates m, a (min_compute_time; a floor of it over many device sets for `every_plan_bound`).
    `any_subset`: the bound must hold for any subset of these devices (the least slowdown then
    stands for the largest one)."""
    again = rule_of(workload).backward_factors()
    fwd_tok = w.pre_fwd + w.post_fwd
    tau, rho = recompute_work_times(w, model, workload)
    S, B = workload.seq_len, workload.global_batch
    pairs = float(model.heads * model.causal_pairs(S))  # per layer and sequence
    work = compute(1.0 / tau, 1.0 / rho, float(B * S), float(B * model.layers) * pairs)
    local_params = model.param_count / (options.shards(n_devices) if workload.param_sharding == "zero3" else 1)
    optimizer = float((local_params * w.optimizer).min())
    # (2) pass by pass
    per_pass = {
        "f": compute(1.0 / fwd_tok, 1.0 / w.pair, float(S), pairs),
        "b": compute(
            1.0 / (w.pre_bwd + w.post_bwd + again.forward_linear * fwd_tok),
            1.0 / (again.attention(w.attn_bwd_factor) * w.pair),
            float(S),
            pairs,
        ),
        "h": compute(1.0 / w.head, np.full(len(w.head), np.inf), float(S), 0.0),
    }
    comm = not options.ignore_comm
    # a pass with a prefetched collective c takes max_r(chain_r + max(0, c - window_r) + slowdown_r·c)
    # (simulate._pass), and chain_r ≥ window_r, own work_r: at least c·(1 + slowdown_r) on every
    # rank, and the slowest rank's work + slowdown·c
    slow_lo = float(w.overlap_slowdown.min())
    slow_hi = slow_lo if any_subset else float(w.overlap_slowdown.max())
    passes = optimizer
    for step in pass_schedule(StepShape(params=pc, layers=model.layers, batch=B, comm=comm)):
        if isinstance(step, Pass):
            c = step.collective_s
            passes += step.count * max(c * (1.0 + slow_hi), per_pass[step.chain] + slow_lo * c)
        else:
            passes += step.count * step.seconds
    return max(work + optimizer, passes)


# ------------------------------------------------------------------------------ every plan at all

MAX_SUBSET_SHAPES = 512  # device sets up to identical devices: enumerated when there are at most this many


def identical_devices(cluster: ClusterSpec, devices: Iterable[int] | None = None) -> list[tuple[int, ...]]:
    """The devices in classes no bound can tell apart: one node, one GPU type, the same NIC and link
    (every link of one is a link of the other); each device its own class when the cluster has link
    overrides. Classes in device order."""
    devs = range(cluster.size) if devices is None else sorted(devices)
    if cluster.overrides:
        return [(d,) for d in devs]
    by: dict[tuple, list[int]] = {}
    for d in devs:
        dev = cluster.devices[d]
        by.setdefault((dev.node, dev.gpu.name, dev.nic_gbps, dev.link_bandwidth_gbps), []).append(d)
    return [tuple(v) for v in by.values()]


def every_plan_bound(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    options: CostOptions = CostOptions(),
    devices: Iterable[int] | None = None,
) -> float:
    """Seconds no plan on any non-empty subset of `devices` (default: the whole cluster) can beat,
    under the workload's concrete recompute policy, whatever its grouping into HP groups (groups of
    different sizes inside a node, groups spanning nodes), ring order, head split or token split:
    the least `subset_time_bound` over every device subset that can hold a sequence (each of them
    holds for every plan on its subset; on a subset that cannot, `SequenceRoom`, no plan fits in
    memory; inf when no subset can). Exact (every subset up to identical devices,
    `identical_devices`) when there are at most MAX_SUBSET_SHAPES such subsets; otherwise the least
    of (a) every subset inside one node, exactly, and (b) a floor of every subset that spans nodes,
    per number of devices n (no fewer than can hold a sequence): the compute of any n of the
    devices, priced (`fewest_devices_compute_floor`), the optimizer over n, and the collectives of n
    ranks over the fastest link the subset's devices can all have to another node
    (_spanning_floor)."""
    classes = identical_devices(cluster, devices)
    shapes = math.prod(len(c) + 1 for c in classes) - 1
    hold = SequenceRoom(cluster, model, workload, options)
    if shapes <= MAX_SUBSET_SHAPES:
        return min(
            (
                subset_time_bound(cluster, devs, model, workload, options)
                for counts in itertools.product(*[range(len(c) + 1) for c in classes])
                if any(counts)
                for devs in [[d for c, n in zip(classes, counts) for d in c[:n]]]
                if hold.can_hold(devs)
            ),
            default=math.inf,
        )
    node_of = {d: cluster.devices[d].node for c in classes for d in c}
    per_node: dict[int, list[tuple[int, ...]]] = {}
    for c in classes:
        per_node.setdefault(node_of[c[0]], []).append(c)
    best = math.inf
    seen: dict[tuple, float] = {}
    for node_classes in per_node.values():
        for counts in itertools.product(*[range(len(c) + 1) for c in node_classes]):
            if not any(counts):
                continue
            devs = [d for c, n in zip(node_classes, counts) for d in c[:n]]
            if not hold.can_hold(devs):
                continue
            # identical nodes (no overrides: the links of a node depend on its devices only) have one bound
            key = tuple((cluster.devices[d].gpu.name, cluster.devices[d].link_bandwidth_gbps) for d in devs)
            if key not in seen:
                seen[key] = subset_time_bound(cluster, devs, model, workload, options)
            best = min(best, seen[key])
    if len(per_node) > 1:
        best = min(best, _spanning_floor(cluster, [d for c in classes for d in c], model, workload, options, hold))
    return best


def _spanning_floor(
    cluster: ClusterSpec,
    devices: list[int],
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
    hold: SequenceRoom,
) -> float:
    """A floor of subset_time_bound over every subset of `devices` that spans two nodes or more
    (every_plan_bound (b)). Every device of such a subset has a partner in it on another node, so
    the subset's slowest link β is at most the fastest link of each of its devices to another node:
    per level β of those, the subsets of the devices whose fastest such link is at least β, with
    collectives over β (and the least latency between nodes). Sizes are taken in ranges [lo, hi]:
    the compute of any hi of the devices (`fewest_devices_compute_floor`; more devices can only be
    faster) and the collectives of lo ranks (fewer ranks can only be faster), both valid for every
    size of the range.
    Sizes below the fewest of the devices that can hold a sequence (`hold`) are no plan's."""
    if options.ignore_comm:
        return _size_floor(cluster, devices, model, workload, options, None, hold)
    bw, lat = link_matrices(cluster)
    idx = np.asarray(devices, dtype=np.int64)
    node = np.array([cluster.devices[d].node for d in devices])
    cross = node[:, None] != node[None, :]
    b = np.where(cross, bw[np.ix_(idx, idx)], -np.inf)
    fastest = b.max(axis=1)  # each device's fastest link to another node
    least_lat = float(lat[np.ix_(idx, idx)][cross].min())
    best = math.inf
    for level in np.unique(fastest):
        keep = [d for d, f in zip(devices, fastest) if f >= level]
        if len({cluster.devices[d].node for d in keep}) > 1:
            best = min(best, _size_floor(cluster, keep, model, workload, options, (float(level), least_lat), hold))
    return best


def _size_floor(
    cluster: ClusterSpec,
    devices: list[int],
    model: ModelSpec,
    workload: Workload,
    options: CostOptions,
    link: tuple[float, float] | None,
    hold: SequenceRoom,
) -> float:
    """A floor of subset_time_bound over every subset of at least 2 of `devices` that can hold a
    sequence and whose collectives run over a link no faster than `link` (bytes/s, seconds; None: no
    communication), size range by size range (_spanning_floor)."""
    w = work_times([cluster.devices[d].gpu for d in devices], model, options)
    N = len(devices)
    fewest = hold.fewest(devices)  # no subset of fewer of these devices holds a sequence
    if fewest > N:
        return math.inf
    edges = sorted({*range(2, min(N, 64) + 1), *np.unique(np.geomspace(64, max(N, 64), 48).astype(int)).tolist()})
    edges = [e for e in edges if e <= N]
    if not edges or edges[-1] != N:
        edges.append(N)
    best = math.inf
    for lo, hi in zip([2] + [e + 1 for e in edges[:-1]], edges):
        lo = max(lo, int(fewest))
        if lo > hi:
            continue
        if link is None:
            pc = ParamComm(workload.param_sharding)
        else:  # the collectives of lo ranks over the link: a ring matrix of that size
            bw_m = np.full((lo, lo), link[0])
            np.fill_diagonal(bw_m, np.inf)
            lat_m = np.full((lo, lo), link[1])
            np.fill_diagonal(lat_m, 0.0)
            pc = param_collectives(bw_m, lat_m, model, workload)

        def floor(m: np.ndarray, a: np.ndarray, f_lin: float, f_att: float, hi: int = hi) -> float:
            # any hi devices or fewer: no faster than all of them together, nor than the priced floor
            return max(min_compute_time(m, a, f_lin, f_att), fewest_devices_compute_floor(m, a, f_lin, f_att, hi))

        best = min(best, _pass_bound(w, hi, pc, model, workload, options, floor, any_subset=True))
    return best


def fewest_devices_compute_floor(m: np.ndarray, a: np.ndarray, f_lin: float, f_att: float, most: int) -> float:
    """A floor of min_compute_time over every set of at most `most` of these devices (rates m, a), by
    weak LP duality: price attention work at r per unit of matmul work. A device i busy for t seconds
    does at most t·max(m_i, r·a_i) priced work (x_i/m_i + y_i/a_i <= t), so t >= (f_lin + r·f_att) /
    (the sum of the `most` largest max(m_i, r·a_i)) for every r >= 0. The ratio is largest at an end
    (r = 0: matmuls alone; r -> inf: attention alone) or where the denominator bends, at some
    r = m_i / a_j; every one of those is tried (any r gives a valid floor)."""
    m = np.asarray(m, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    t = 0.0
    if f_lin > 0:
        t = max(t, f_lin / float(np.sort(m)[::-1][:most].sum()))
    if f_att > 0:
        t = max(t, f_att / float(np.sort(a)[::-1][:most].sum()))
    if f_lin > 0 and f_att > 0 and np.isfinite(a).all():
        r = np.unique(np.unique(m)[:, None] / np.unique(a)[None, :])
        capacity = -np.sort(-np.maximum(m[None, :], r[:, None] * a[None, :]), axis=1)[:, :most].sum(axis=1)
        t = max(t, float(((f_lin + r * f_att) / capacity).max()))
    return t


def compute_bound(
    cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions = CostOptions()
) -> float:
    """Upper bound on tokens/s: the balanced, communication- and recompute-free iteration (module doc)."""
    return workload.tokens / min_iteration_time(cluster, model, workload, options)
