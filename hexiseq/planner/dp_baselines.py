"""The data-parallel baselines of a joint plan: DP x {ring, Ulysses, USP}, each tuned to its best.

On every candidate device subset (candidates.device_subsets, with the fastest n devices for every n
that DP blocks of one symmetric layout can fill: baselines.symmetric_sizes), every DP that divides its devices
(DP <= the global batch): DP replicas of consecutive devices, each the same symmetric layout of its
block (the family's every legal CP x HP configuration, both placements of USP: planner/baselines.py's
FAMILIES), under every recompute policy and every sharding strategy, with the exact batch shares
(planner/shares.py) — scored by the step model (costmodel/step.py). A block of one device is pure
data parallelism (a sequence on one GPU). DP = 1 is today's symmetric baselines. Nothing is cut by an
estimate: a (subset, DP) grid is skipped only when a proven bound of every plan on its blocks (each
block's balanced compute per sequence, costmodel.bound, with the exact shares) is above the
family's best; a recompute policy of a grid, when the same bound under that policy (each block's
compute with the policy's recompute, each device's share held to what its memory can hold of a
sequence with the model states sharded over the whole cluster, the most any strategy shards them:
costmodel.bound.memory_capped_work_time) is above it; a layout under a policy, when its replicas'
own work alone is (each micro-step at least its passes' slowest rank's linear work, all-to-alls and exchange,
baselines.MicroStepFloors, with the exact shares: no strategy's collectives make it shorter); and a
layout is not tried under more recompute once it fits under every strategy (more recompute is then
only slower). So each family's best is exact.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..costmodel.bound import kernel_rates, memory_capped_work_time, min_compute_time
from ..costmodel.kernels import CostOptions
from ..plan import Plan, Sharding
from ..specs import RECOMPUTE_POLICIES, ClusterSpec, ModelSpec, NodeSpec, Workload
from .baselines import FAMILIES, MicroStepFloors, divisors, policies_of, symmetric_sizes
from .candidates import device_subsets
from .shares import STRATEGIES, best_over_strategies, lower_shares_bound


@dataclass
class DPBaseline:
    """The best configuration of one DP x family baseline."""

    name: str  # "dp x ring", "dp x ulysses", "dp x usp"
    plan: Plan | None
    step_time_s: float  # inf when nothing fits
    config: str
    recompute: str | None
    tried: int
    skipped: int = 0  # (subset, DP) grids, or their recompute policies, whose bound was above the family's best

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "feasible": self.feasible,
            "config": self.config,
            "step_time_s": self.step_time_s if self.feasible else None,
            "recompute": self.recompute,
            "tried": self.tried,
            "skipped": self.skipped,
            "replicas": self.plan.num_replicas if self.plan else None,
            "sharding": self.plan.sharding.describe() if self.plan else None,
        }


def dp_baselines(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    strategies: Sequence[Sharding] | None = None,
    options: CostOptions = CostOptions(),
    cache: dict | None = None,
    even: bool = False,
) -> dict[str, DPBaseline]:
    """The best DP x family plan of every family (module doc), by step time. `even`: only plans whose
    replicas take equal shares (DP divides the global batch), the data parallelism of frameworks that
    split a batch evenly."""
    strategies = STRATEGIES if strategies is None else strategies
    cache = {} if cache is None else cache
    G, S = workload.global_batch, workload.seq_len
    out = {f"dp x {name}": DPBaseline(f"dp x {name}", None, math.inf, "nothing fits", None, 0) for name in FAMILIES}
    tok_rate, att_rate = kernel_rates(cluster, model, options)
    pairs = float(model.layers * model.heads * model.causal_pairs(S))
    # (subset, DP) in the order of a proven bound of every plan of DP replicas of those blocks
    grids = []
    # the fastest n devices also for every size DP blocks of one symmetric layout can fill
    block_sizes = symmetric_sizes(model, S, cluster.size)
    sizes = {dp * n for n in block_sizes for dp in range(1, G + 1) if dp * n <= cluster.size}
    for label, devs in device_subsets(cluster, sizes):
        for dp in divisors(len(devs)):
            if dp > G or (even and G % dp):
                continue
            blocks = dp_blocks(devs, dp)
            per_seq = [min_compute_time(tok_rate[b], att_rate[b], float(S), pairs) for b in blocks]
            # equal shares: the slowest block's G / DP sequences bound it (no better share can help)
            bound = max(per_seq) * (G // dp) if even else lower_shares_bound(per_seq, G)
            grids.append((bound, label, blocks))
    grids.sort(key=lambda x: x[0])
    # less recompute is faster for the same layout and strategy: once every strategy fits, stop
    policies = [p for p in RECOMPUTE_POLICIES if str(p) in policies_of(workload)]
    floor = _PolicyFloor(cluster, model, workload, options)
    micro = MicroStepFloors(cluster, model, options)
    for name, family in FAMILIES.items():
        # best first: each (configuration, policy) in the order of its proven bound, the grids expanded
        # when their own bound comes up; a tie of steps goes to the configuration the grids' order
        # lists first (`order`), so the family's best is the one a scan in that order keeps
        heap: list[tuple] = [(lb, (g,), "grid", g) for g, (lb, _, _) in enumerate(grids)]
        heapq.heapify(heap)
        scored: dict[tuple, tuple] = {}  # (replicas' groups, policy) -> (step, plan, all fit)
        best_at: tuple = (math.inf, ())  # (step, order) of the family's best
        while heap:
            bound, order, kind, what = heapq.heappop(heap)
            best = out[f"dp x {name}"]
            if bound > best_at[0] or (bound == best_at[0] and order > best_at[1]):
                best.skipped += 1
                continue  # nothing of it can beat the family's best (nor tie it earlier in the order)
            if kind == "grid":
                lb, label, blocks = grids[what]
                if len(blocks[0]) == 1 and name != "ring":
                    continue  # one device: every family is the same plan (pure data parallelism)
                per_block = [family(b, S, model, workload.block_size) for b in blocks]
                for j, (config, _) in enumerate(per_block[0]):
                    reps = [pb[j][1] for pb in per_block]
                    for k, policy in enumerate(policies):
                        cheap = max(lb, floor.step(blocks, str(policy), even))
                        heapq.heappush(heap, (cheap, (what, j, k), "item", (label, config, reps, policy)))
                continue
            label, config, reps, policy = what
            wl = workload.with_recompute(policy)
            if kind == "item":  # first up: its layout's own work alone (MicroStepFloors), with the exact shares
                per_seq = [micro(r, wl) for r in reps]
                layout_lb = max(per_seq) * (G // len(reps)) if even else lower_shares_bound(per_seq, G)
                if layout_lb > bound:
                    heapq.heappush(heap, (layout_lb, order, "floored", what))
                    continue
            key = tuple(r.groups for r in reps)  # the layouts themselves: factorizations can share rank orders
            if any(scored.get((key, str(p)), (0, 0, False))[2] for p in policies[: policies.index(policy)]):
                continue  # it fits under every strategy with less recompute: more is only slower
            if (key, str(policy)) not in scored:
                best.tried += 1
                scored[key, str(policy)] = best_over_strategies(
                    reps, cluster, model, wl, strategies, options, name, cache, even
                )
            t, plan, _ = scored[key, str(policy)]
            if plan is not None and (t, order) < best_at:
                best_at = (t, order)
                out[f"dp x {name}"] = DPBaseline(
                    best.name,
                    plan,
                    t,
                    f"dp={plan.num_replicas} x {config} on {label}, {plan.sharding.describe()}, recompute {policy}",
                    str(policy),
                    best.tried,
                    best.skipped,
                )
    return out


def dp_blocks(devices: Sequence[int], dp: int) -> list[list[int]]:
    """`dp` equal blocks of consecutive devices: the replicas of a DP x family baseline."""
    n = len(devices) // dp
    return [list(devices[i * n : (i + 1) * n]) for i in range(dp)]


class _PolicyFloor:
    """A proven lower bound of every plan of DP replicas on given blocks under one recompute policy
    (module doc): each block's compute per sequence with the policy's recompute and its devices'
    memory caps (costmodel.bound.memory_capped_work_time, the model states sharded over the whole
    cluster; inf where no plan of the policy fits a sequence), with the exact shares. It reads the
    blocks' GPU types only (no link), so it is kept per multiset of types."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, workload: Workload, options: CostOptions) -> None:
        self.cluster, self.model, self.global_batch = cluster, model, workload.global_batch
        self.workload = replace(workload, global_batch=1, param_sharding="zero3")
        self.options = replace(options, state_shards=cluster.size)
        self.per_sequence: dict[tuple, float] = {}

    def block(self, devices: Sequence[int], policy: str) -> float:
        """Seconds per sequence no plan of the policy on these devices beats."""
        counts: dict[str, int] = {}
        for d in devices:
            counts[self.cluster.devices[d].gpu.name] = counts.get(self.cluster.devices[d].gpu.name, 0) + 1
        key = (tuple(sorted(counts.items())), policy)
        if key not in self.per_sequence:
            node_of = {}
            for dev in self.cluster.devices:
                node_of.setdefault(dev.gpu.name, self.cluster.nodes[dev.node])
            # one node per GPU type (replicas.sub_cluster's way): the bound reads no link
            sub = ClusterSpec.from_nodes("block", [NodeSpec(node_of[g].gpu, c, node_of[g].nic_gbps) for g, c in key[0]])
            self.per_sequence[key] = memory_capped_work_time(
                sub, self.model, self.workload.with_recompute(policy), self.options
            )
        return self.per_sequence[key]

    def step(self, blocks: Sequence[Sequence[int]], policy: str, even: bool) -> float:
        """Seconds no step of these blocks as replicas beats under the policy."""
        G = self.global_batch
        per_seq = [self.block(b, policy) for b in blocks]
        return max(per_seq) * (G // len(blocks)) if even else lower_shares_bound(per_seq, G)
