"""Stage II of the planner: best-first search over the candidate layouts, bounding as it goes.

Every (candidate layout, recompute policy) is a node with a proven lower bound of the step time of
every plan it contains: at first the bound of its device subset (costmodel.bound: balanced compute
and the subset's parameter collectives), then the optimum of its optimization model
(planner/layout_model.py) as cutting-plane rounds tighten it. The search always works on the node with the
lowest bound: a few rounds of its model (fewer when its bound reaches the incumbent: then no plan of
it can win), whose solution is rounded to a plan and replayed (a new
incumbent when it is faster and fits in memory), and when the
incumbent improves, every model's box shrinks to the chunk lengths that could still beat it. It
stops when the lowest bound is within `gap` of the incumbent, or after `work` cutting-plane rounds
in all (a deterministic work limit, never a wall-clock one). The bound of the whole search is the
lowest bound of all nodes — searched, pruned or never reached — and the incumbent's time: a bound
over the candidates; the planner adds one over every other plan (costmodel.bound.every_plan_bound).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..costmodel import estimate
from ..costmodel.bound import SequenceRoom, subset_time_bound
from ..costmodel.kernels import CostOptions
from ..errors import HexiSeqError
from ..plan import Plan
from ..rounding import round_near
from ..specs import ClusterSpec, ModelSpec, Workload
from .candidates import Candidate
from .layout_model import LayoutModel


def roundings(blocks: list[float], total: int, count: int) -> list[list[int]]:
    """Integer chunk blocks summing to `total` near a fractional solution: the nearest (largest
    remainder), then the ones with one block less on each of the groups whose chunk grew most by
    rounding (a rank at its memory limit may not take the extra block), given to the others."""
    base = round_near(blocks, total, minimum=1)
    out = [base]
    shifted = [b - blocks[i] for i, b in enumerate(base)]  # how far rounding moved each group
    grew = sorted(range(len(blocks)), key=lambda g: (-shifted[g], g))
    for g in grew:
        if len(out) >= count:
            break
        if base[g] <= 1 or shifted[g] <= 0:
            continue
        trial = list(base)
        trial[g] -= 1
        h = min((i for i in range(len(blocks)) if i != g), key=lambda i: (shifted[i], i))  # the group rounded down most
        trial[h] += 1
        if trial not in out:
            out.append(trial)
    return out


STEP_ROUNDS = 12  # cutting-plane rounds per visit of a node
MAX_DEPTH = 8  # branchings on chunk lengths below a node
MAX_TIGHTEN = 6  # box tightenings per node
TIGHTEN_GAIN = 0.2  # ... each after one that closed at least this part of the node's distance to the target
MAX_DIVES = 3  # visits that improved the incumbent continued at once, in a row
ROUNDINGS = 5  # integer chunk lengths tried per solution: nearest, and each of the largest groups' one block less
DEFAULT_WORK = 1500  # cutting-plane rounds in all (a work limit: the bound stays valid when it binds)
DEFAULT_GAP = 0.002  # stop when the lowest bound is this close to the incumbent (relative)


@dataclass
class Node:
    cand: Candidate
    policy: str
    index: int
    bound: float
    status: str = "screened"  # screened | open | final | branched | infeasible
    model: LayoutModel | None = None
    rounds: int = 0
    best_s: float = math.inf  # the fastest plan this node produced
    box_ub: float = math.inf  # the incumbent its box was derived from
    depth: int = 0  # branchings on chunk lengths above it
    tightenings: int = 0  # optimality-based box tightenings done
    tightened_at: float = -math.inf  # its bound when it was last tightened
    stuck: bool = False  # converged below the target with no tightening left to try: branch it
    point: list[float] | None = None  # the chunk blocks of its last solution

    def __lt__(self, other: Node) -> bool:
        return (self.bound, self.index) < (other.bound, other.index)


@dataclass
class SearchResult:
    best_s: float
    best_plan: Plan | None
    best_policy: str | None
    best_source: str
    lower_bound_s: float
    nodes: list[Node] = field(default_factory=list)
    rounds: int = 0

    @property
    def gap(self) -> float:
        if not math.isfinite(self.best_s) or self.best_s <= 0:
            return math.nan
        return max(0.0, 1.0 - self.lower_bound_s / self.best_s)


class Search:
    """Best-first search over (candidate, policy) nodes (module doc)."""

    def __init__(
        self,
        cluster: ClusterSpec,
        model: ModelSpec,
        workload: Workload,
        policies: list[str],
        candidates: list[Candidate],
        incumbent: tuple[float, Plan | None, str | None, str] = (math.inf, None, None, ""),
        options: CostOptions = CostOptions(),
        tick: Callable[[str], None] | None = None,
    ):
        self.cluster, self.model, self.workload, self.options = cluster, model, workload, options
        self.best_s, self.best_plan, self.best_policy, self.best_source = incumbent
        self.tick = tick or (lambda _: None)
        self.nodes: list[Node] = []
        screen: dict[tuple, float] = {}
        # a layout on devices that cannot hold a sequence under a policy has no plan that fits: its node
        # is closed at once (inf) instead of when its model, built and solved, says so
        room = {p: SequenceRoom(cluster, model, workload.with_recompute(p), options) for p in policies}
        for cand in candidates:
            for policy in policies:
                wl = workload.with_recompute(policy)
                key = (cand.layout.devices, policy)
                if key not in screen:
                    devs = sorted(cand.layout.devices)
                    held = room[policy].can_hold(devs)
                    screen[key] = subset_time_bound(cluster, devs, model, wl, options) if held else math.inf
                self.nodes.append(Node(cand, policy, len(self.nodes), screen[key]))
        self.rounds = 0
        self.gap = DEFAULT_GAP

    def _model(self, node: Node) -> LayoutModel | None:
        if node.model is None:
            try:
                node.model = LayoutModel(
                    self.cluster,
                    self.model,
                    self.workload.with_recompute(node.policy),
                    node.cand.layout,
                    self.options,
                    orbits=node.cand.orbits,
                )
            except HexiSeqError:
                node.status = "infeasible"
                node.bound = math.inf
                return None
        return node.model

    def _consider(self, node: Node, blocks: list[int], shards: list[float]) -> None:
        """Replay the rounded plan of a model's solution; keep it when it fits and is the fastest. When
        rounding pushes a rank over its memory, the shards are chosen again for the rounded chunks."""
        lm = node.model
        wl = self.workload.with_recompute(node.policy)
        judged = lm.judge(blocks, shards)
        if judged is None:  # the plan leaves a rank out: a structure of its own
            est = estimate(lm.to_plan(blocks, shards), self.cluster, self.model, wl, self.options)
            judged = (est.iteration_time_s, est.fits)
        if not judged[1]:
            # Choosing the shards again under the memory limits (a model of its own) rarely gives a
            # faster plan than these shards, which the relaxation chose with the limits only relaxed:
            # when these are no faster than the incumbent, the refit is not worth its LPs. (Only
            # which plans are tried changes; no bound depends on it.)
            if judged[0] >= self.best_s:
                return
            plan, _ = lm.best_plan(blocks)
            if plan is None:
                return
            est = estimate(plan, self.cluster, self.model, wl, self.options)
            if not est.fits:
                return
            t = est.iteration_time_s
        else:
            t, plan = judged[0], None
        node.best_s = min(node.best_s, t)
        if t < self.best_s * (1 - 1e-12):
            self.best_s, self.best_policy = t, node.policy
            self.best_plan = plan if plan is not None else lm.to_plan(blocks, shards)
            self.best_source = f"model: {node.cand.label}"

    @property
    def target(self) -> float:
        """The step time a plan must beat to matter: the incumbent less the gap. Every box is derived
        from it, so a node's bound is min(its model's bound, target) — a plan outside the box takes
        longer than the target."""
        return self.best_s * (1 - self.gap) if math.isfinite(self.best_s) else math.inf

    def step(self, node: Node) -> None:
        lm = self._model(node)
        if lm is None:
            return
        self.tick(node.cand.label)
        target = self.target
        if target < node.box_ub:
            lo, hi = lm.box_from_bound(target)
            if np.any(lo > hi):  # no chunk lengths could beat the target
                node.bound, node.status, node.box_ub = max(node.bound, target), "final", target
                return
            lm.set_box(lo, hi)
            node.box_ub = target
        # the loop stops once no plan of the box can beat the incumbent: more rounds would only raise a
        # bound that already prunes the node, and a plan rounded from its solution cannot be faster
        sol = lm.solve(max_rounds=STEP_ROUNDS, stop_at=self.best_s if math.isfinite(self.best_s) else None)
        node.rounds += sol.rounds
        self.rounds += sol.rounds
        if sol.status == "infeasible":  # nothing of this layout fits in memory (or in the box)
            node.bound = max(node.bound, node.box_ub)
            node.status = "final" if math.isfinite(node.box_ub) else "infeasible"
            return
        if not sol.ok:
            # Every LP here has an optimum (bounded variables, a box that is not empty) or is
            # infeasible (above): any other status is the solver failing, a bug to report, not a
            # property of the layout. Dropping the node instead made the plan depend on it (issue 18:
            # HiGHS refused every solve after another thread count's, every node was dropped and a
            # baseline won, planner/lp.py).
            raise HexiSeqError(f"the LP solver failed on layout {node.cand.label!r} ({node.policy}): {sol.status}")
        node.bound = max(node.bound, min(sol.bound_s, node.box_ub))
        if sol.status == "above":  # no plan of the box beats the incumbent: final for every later target
            node.status = "final"
            return
        node.status = "final" if sol.status in ("optimal", "stalled") else "open"
        node.point = list(sol.blocks)
        for blocks in roundings(sol.blocks, lm.nb, ROUNDINGS):
            self._consider(node, blocks, sol.shards)
        target = self.target
        if node.status != "final" or node.bound >= target:
            return
        gained = node.bound - node.tightened_at
        node.stuck = True
        if node.tightenings < MAX_TIGHTEN and gained >= TIGHTEN_GAIN * (target - node.tightened_at):
            # the relaxation is converged for this box: shrink the box to what could still beat the
            # target (optimality-based bound tightening) and solve again with tighter estimates, as
            # long as the last tightening closed a fair part of what was left
            node.tightenings += 1
            node.tightened_at = node.bound
            self.rounds += 2 * lm.NV  # its LPs count as work too
            shrank = lm.tighten_box(target)
            node.box_ub = min(node.box_ub, target)
            if np.any(lm.box_lo > lm.box_hi):  # nothing in this layout can beat the target
                node.bound, node.status = max(node.bound, target), "final"
                node.stuck = False
            elif shrank:
                node.status, node.stuck = "open", False

    def branch(self, node: Node) -> list[Node]:
        """Split a node that converged below the target (its relaxation cannot close the gap in this
        box, or none of its roundings fits in memory) on the chunk variable with the widest box:
        n_v ≤ p or n_v ≥ p + 1, p = floor of its value (every integer plan is in one of the two;
        the McCormick planes of each child are tighter), each child starting with the parent's cuts
        (an orbit model's children: every periodic plan)."""
        lm = node.model
        if lm is None or node.point is None or node.depth >= MAX_DEPTH:
            return []
        # the node's own solution (the model's variables may hold a bound-tightening LP's instead)
        n = np.array([node.point[gs[0]] for gs in lm.orbit_groups], dtype=float)
        lo = np.array([lm.box_lo[gs[0]] for gs in lm.orbit_groups])
        hi = np.array([lm.box_hi[gs[0]] for gs in lm.orbit_groups])
        width = np.where(hi - lo >= 1.0, hi - lo, -1.0)
        if width.max() < 1.0:
            return []
        v = int(np.argmax(width))
        p = float(np.clip(math.floor(n[v] + 1e-9), lo[v], hi[v] - 1.0))
        kids = []
        for c_lo, c_hi in ((None, p), (p + 1.0, None)):
            child = Node(
                node.cand,
                node.policy,
                len(self.nodes),
                node.bound,
                "open",
                lm.child(v, c_lo, c_hi),
                0,
                math.inf,
                node.box_ub,
                node.depth + 1,
            )
            self.nodes.append(child)
            kids.append(child)
        node.status = "branched"
        node.bound = math.inf  # its children carry its bound now
        return kids

    def run(self, work: int = DEFAULT_WORK, gap: float = DEFAULT_GAP) -> SearchResult:
        self.gap = gap
        heap = [n for n in self.nodes if math.isfinite(n.bound)]
        heapq.heapify(heap)
        while heap and self.rounds < work:
            node = heapq.heappop(heap)
            if node.bound >= self.target:
                heapq.heappush(heap, node)
                break  # every other node's bound is at least as high: the incumbent is within `gap`
            if node.status == "final" and node.box_ub <= self.target:
                continue  # its bound is final for the box that still applies
            before = self.best_s
            self.step(node)
            # A visit that improved the incumbent is continued at once (a dive, up to MAX_DIVES): its
            # relaxation is the one nearest to good plans, and a better incumbent shrinks every box.
            for _ in range(MAX_DIVES):
                if not (self.best_s < before and node.status == "open" and self.rounds < work):
                    break
                before = self.best_s
                self.step(node)
            if node.status == "final" and node.bound < self.target and (node.stuck or not math.isfinite(node.best_s)):
                for kid in self.branch(node):
                    heapq.heappush(heap, kid)
                if node.status == "branched":
                    continue
            if node.status in ("open", "screened") or (node.status == "final" and node.box_ub > self.target):
                heapq.heappush(heap, node)
        lb = min([n.bound for n in self.nodes if n.status != "branched"] + [self.best_s])
        return SearchResult(
            self.best_s, self.best_plan, self.best_policy, self.best_source, lb, self.nodes, self.rounds
        )
