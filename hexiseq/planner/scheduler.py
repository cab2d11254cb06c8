"""The hierarchical scheduler: (I) candidate groupings, (II) the MILP per candidate, (III) local
refinement under the simulator; the baselines compete too, so the result is never worse than them.

Search over groupings (stage I/II), each candidate solved by `milp.solve_grouping`:
  A. all GPU types, every uniform sub-group size per node domain;
  B. greedily leave out whole GPU types while that lowers the simulated time; each type alone;
  C. coordinate descent on the sub-group size of each GPU type (neighbouring sizes);
  D. (small clusters) groups spanning nodes.
Every candidate's rounded MILP plan is simulated; the incumbent is the best simulated time so far
(the baselines' included). A candidate whose compute-only bound (bound.py, no communication) is
above the incumbent, or whose devices cannot hold the workload even summed (explain.may_fit), is
pruned without building a model; one whose LP relaxation is above it skips the MILP (linear form <= estimate <= simulator, so neither could win). Candidates with more than
MAX_GROUPS groups are skipped (the model grows with groups^2). Screening solves get a short time
limit; the winner is re-solved through Pyomo + HiGHS (or with the full limit when its gap is above 1%). Stage III moves
blocks of chunk, tokens and heads away from the simulator's busiest rank while that helps.

Recompute policy: a concrete policy of the workload ("none", "selective", "full") is planned as
given. Under "auto" the planner tries "none", "selective" and "full" in that order (increasing
recompute time, decreasing memory), skipping a policy when the solver-free memory check
(`explain.may_fit`) proves nothing can fit under it. The baselines are evaluated once for all the
remaining policies (each candidate with the first policy it fits with, baselines.py), then the
grouping search runs per policy with the incumbent carried over: the best simulated time so far, of
any policy, prunes the next policy's candidates. The compute-only bound of a candidate then
includes the policy's recompute FLOPs (the linear forward again, and for "full" the attention
forward), which prunes most candidates of a costlier policy without a solve when a cheaper one has
already fitted well. A policy that is not the last one searched gives up when the first grouping of
stage A (every device, node-sized groups) does not fit even relaxed: the next policy needs less memory. The fastest
plan of any policy wins; its policy is the result's `recompute`
and the plan's meta["recompute"].
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ..costmodel import compute_bound, estimate, simulate
from ..costmodel.bound import min_compute_time, useful_flops
from ..costmodel.linear import linear_form
from ..errors import HexiSeqError, InfeasibleError
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .baselines import BaselineResult, baselines, best_baseline, policies_of
from .explain import explain_infeasible, may_fit, memory_report
from .groupings import (
    Grouping,
    candidate_groupings,
    head_units,
    node_grouping,
    size_options,
    spanning_groupings,
    type_order,
)
from .milp import MilpSolution, solve_grouping
from .refine import refine
from .result import PlanResult
from .solvers import check_solver

SCREEN_LIMIT_S = 0.3  # MILP time limit while screening candidate groupings
# Candidates are screened by HiGHS on the raw matrix (Pyomo's model building costs ~0.5 s per model
# at 128 GPUs, more than the solve); the winner's model is then built and solved through Pyomo.
FINAL_SOLVER = {"highs": "pyomo_highs"}
MAX_GROUPS = 160  # candidates with more groups are skipped: the model grows as groups^2 (exchange rounds)
TARGET_GAP = 0.01  # the chosen grouping is re-solved with the full time limit when its gap is above this


class _Search:
    """Bookkeeping of stage I/II: every candidate tried, its bound, the incumbent.

    Candidates are compared by the simulated time of their rounded MILP plan (the judge). Pruning is
    safe under the judge because the linear form is a lower bound of the estimate, itself a lower
    bound of the simulator: a candidate whose relaxation bound is above the best simulated time
    cannot win."""

    def __init__(self, cluster, model, workload, solver, time_limit_s, tick: Callable[[str], None], incumbent_s: float = math.inf,
                 give_up_when_nothing_fits: bool = False):
        self.cluster, self.model, self.workload = cluster, model, workload
        # under "auto", a policy that is not the last (a later one needs less memory): stop its search
        # when no grouping of stage A fits (search_groupings)
        self.give_up_when_nothing_fits = give_up_when_nothing_fits
        self.solver, self.time_limit_s, self.tick = solver, time_limit_s, tick
        self.solutions: dict[tuple, MilpSolution] = {}
        self.sim: dict[tuple, tuple[float, Plan]] = {}  # grouping -> (simulated time, plan) when it fits
        self.bounds: list[float] = []  # a lower bound for every candidate considered
        self.pruned = 0
        self.incumbent_s = incumbent_s  # best simulated time so far (baselines and other policies included)
        f_lin, f_att = useful_flops(model, workload)
        # the policy's recompute FLOPs: every layer's linear forward again ("selective", "full") and the
        # attention forward again ("full"); the LM head is never recomputed
        B, S, Lyr = workload.global_batch, workload.seq_len, model.layers
        policy = workload.recompute
        if policy in ("selective", "full"):
            f_lin += B * S * Lyr * model.linear_flops_per_token_per_layer
        if policy == "full":
            f_att += B * Lyr * model.heads * model.attention_flops_per_pair * model.causal_pairs(S)
        self._work = (f_lin, f_att)

    def compute_bound_s(self, g: Grouping) -> float:
        """Time no plan on these devices can beat: useful + recompute FLOPs at their summed effective rates."""
        devs = [self.cluster.devices[d].gpu for d in g.devices]
        return min_compute_time(np.array([x.matmul_flops for x in devs]), np.array([x.attention_flops for x in devs]), *self._work)

    def solve(self, g: Grouping | None) -> float:
        """Solve one candidate; its simulated time (inf when pruned, infeasible or out of memory)."""
        if g is None or (len(g.groups) > MAX_GROUPS and math.isfinite(self.incumbent_s)):
            return math.inf
        if g.key in self.solutions:
            return self.sim.get(g.key, (math.inf, None))[0]
        if not may_fit(self.cluster, self.model, self.workload, devices=g.devices):
            # not even the summed memory of its devices holds the workload (explain.may_fit): no solve
            self.solutions[g.key] = MilpSolution(g, "memory", math.inf, math.inf, math.inf)
            self.pruned += 1
            self.bounds.append(math.inf)  # infeasible: no time at all
            return math.inf
        cut = self.incumbent_s if math.isfinite(self.incumbent_s) else None
        cb = self.compute_bound_s(g)
        if cut is not None and cb >= cut:
            self.pruned += 1
            self.bounds.append(cb)
            return math.inf
        self.tick(g.label)
        # screening solves get a short time limit; the winner is re-solved with the full one
        sol = solve_grouping(g, self.cluster, self.model, self.workload, self.solver, min(self.time_limit_s, SCREEN_LIMIT_S), cutoff_s=cut)
        self.solutions[g.key] = sol
        if sol.status == "pruned":
            self.pruned += 1
        self.bounds.append(max(sol.lower_bound_s, cb) if math.isfinite(sol.lower_bound_s) else math.inf)
        if not sol.feasible:
            return math.inf
        plan = sol.to_plan(self.workload, self.model, self.cluster)
        if not estimate(plan, self.cluster, self.model, self.workload).fits:
            return math.inf  # rounding pushed a rank over its memory; stage III never sees it
        t = simulate(plan, self.cluster, self.model, self.workload).iteration_time_s
        self.sim[g.key] = (t, plan)
        self.incumbent_s = min(self.incumbent_s, t)
        return t


def _out_of_memory(sol: MilpSolution | None) -> bool:
    """The grouping's model has no solution for lack of memory (the LP relaxation, or the memory check)."""
    return sol is not None and (sol.status == "memory" or sol.status.startswith("infeasible: nothing fits in memory"))


def search_groupings(cluster: ClusterSpec, model: ModelSpec, workload: Workload, s: _Search) -> None:
    """Stages I and II: explore candidate groupings and solve their models (results in `s`)."""
    units = head_units(model)
    types = type_order(cluster)
    opts = size_options(cluster, types, units)
    all_sizes = sorted({x for v in opts.values() for x in v}, reverse=True)
    # A: all types, uniform sizes
    best_sizes = {t: max(opts[t]) for t in types}
    best_val = math.inf
    for i, size in enumerate(all_sizes):
        sizes = {t: size for t in types}
        g = node_grouping(cluster, types, sizes, units)
        v = s.solve(g)
        if v < best_val:
            best_val, best_sizes = v, sizes
        if i == 0 and s.give_up_when_nothing_fits and g is not None and _out_of_memory(s.solutions.get(g.key)):
            # every device in play in the largest node groups, and not even the LP relaxation fits in
            # memory: the policy is memory-bound here (smaller sub-groups or leaving devices out do not
            # make room), so "auto" moves on to the next policy, which needs less memory. A heuristic
            # that saves the solves (a memory-infeasible model costs the most: its K/V-buffer rows are
            # added lazily); the next policy's search and the baselines are unaffected.
            return
    used = list(types)
    # B: leave out GPU types while it helps (try every type; keep the best removal)
    improved = True
    while improved and len(used) > 1:
        improved = False
        trials = []
        for t in used:
            rest = [x for x in used if x != t]
            v = s.solve(node_grouping(cluster, rest, best_sizes, units))
            trials.append((v, rest))
        v, rest = min(trials, key=lambda x: x[0])
        if v < best_val:
            best_val, used, improved = v, rest, True
    # ... and every GPU type alone (the greedy above can stop before reaching it)
    for t in types:
        v = s.solve(node_grouping(cluster, [t], best_sizes, units))
        if v < best_val:
            best_val, used = v, [t]
    # C: sub-group size per type, coordinate descent
    for _ in range(2):
        changed = False
        for t in used:
            i = opts[t].index(best_sizes[t]) if best_sizes[t] in opts[t] else 0
            for size in opts[t][max(0, i - 1) : i + 2]:  # the neighbouring sizes (halve / double)
                if size == best_sizes[t]:
                    continue
                trial = dict(best_sizes, **{t: size})
                v = s.solve(node_grouping(cluster, used, trial, units))
                if v < best_val:
                    best_val, best_sizes, changed = v, trial, True
        if not changed:
            break
    # D: groups across nodes, only where there are few devices (else the all-to-all crosses NICs at scale)
    if cluster.size <= 32:
        for g in spanning_groupings(cluster, types, units) + spanning_groupings(cluster, used, units):
            s.solve(g)
    # fall back to the full candidate list when nothing at all was found yet (memory-tight cases);
    # candidates pruned against a baseline do not count as "nothing"
    # (skipped when the memory relaxation over node groups says nothing fits: not worth minutes at scale)
    if not s.sim and not math.isfinite(s.incumbent_s) and memory_report(cluster, model, workload).load <= 1.0:
        for g in candidate_groupings(cluster, model):
            if len(g.groups) <= MAX_GROUPS:
                s.solve(g)


def plan_cluster(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    solver: str = "highs",
    time_limit_s: float | None = None,
    progress: bool = True,
    refine_budget_s: float | None = None,
) -> PlanResult:
    """Find the fastest asymmetric CP x HP plan that fits (see module doc).

    `time_limit_s` caps each MILP solve (default: 5 s, 20 s beyond 256 GPUs). `refine_budget_s`
    caps stage III (default: scaled with the cluster). Raises InfeasibleError with an explanation
    when no plan (and no baseline) fits in memory."""
    check_solver(solver)
    for what, value in (("time_limit_s", time_limit_s), ("refine_budget_s", refine_budget_s)):
        if value is not None and not value > 0:
            raise HexiSeqError(f"{what} must be positive, got {value}")
    t_start = time.perf_counter()
    time_limit_s = time_limit_s if time_limit_s is not None else (5.0 if cluster.size <= 256 else 20.0)
    refine_budget_s = refine_budget_s if refine_budget_s is not None else (1.0 if cluster.size <= 128 else 3.0)
    bar = _progress(progress)
    stages: dict[str, float] = {}

    def tick(what: str) -> None:
        if bar is not None:
            bar.set_postfix_str(what[:40], refresh=False)
            bar.update(1)

    t = time.perf_counter()
    policies = [p for p in policies_of(workload) if workload.recompute != "auto" or may_fit(cluster, model, workload.with_recompute(p))]
    if workload.recompute == "auto":
        stages["memory check"] = time.perf_counter() - t
    if not policies:  # "auto" and nothing can fit even with full recompute: explain that one
        if bar is not None:
            bar.close()
        raise InfeasibleError(explain_infeasible(cluster, model, workload.with_recompute("full")))

    t = time.perf_counter()
    base = baselines(cluster, model, workload, progress=tick, policies=policies)
    stages["baselines"] = time.perf_counter() - t

    t = time.perf_counter()
    best_b = best_baseline(base)
    searches: dict[str, _Search] = {}
    incumbent = best_b.iteration_time_s if best_b else math.inf
    for i, policy in enumerate(policies):  # the incumbent of one policy prunes the next (module doc)
        wl_p = workload.with_recompute(policy)
        s = _Search(cluster, model, wl_p, solver, time_limit_s, tick, incumbent, give_up_when_nothing_fits=i + 1 < len(policies))
        search_groupings(cluster, model, wl_p, s)
        searches[policy], incumbent = s, s.incumbent_s
    stages["I+II groupings+milp"] = time.perf_counter() - t

    t = time.perf_counter()
    pool: list[tuple[float, Plan, str, MilpSolution | None, str]] = []
    for policy, s in searches.items():
        for key, (sim_t, plan) in s.sim.items():
            pool.append((sim_t, plan, "milp", s.solutions[key], policy))
    for b in base.values():
        if b.feasible:
            pool.append((b.iteration_time_s, b.plan, f"baseline {b.name}", None, b.recompute))
    if not pool:
        if bar is not None:
            bar.close()
        explain_wl = workload.with_recompute("full") if workload.recompute == "auto" else workload
        raise InfeasibleError(explain_infeasible(cluster, model, explain_wl))
    pool.sort(key=lambda x: x[0])
    sim_t, plan, source, sol, policy = pool[0]
    wl = workload.with_recompute(policy)  # everything below is for the winner's policy
    final_solver = FINAL_SOLVER.get(solver, solver)
    if sol is not None and (final_solver != solver or (sol.gap > TARGET_GAP and time_limit_s > SCREEN_LIMIT_S)):
        # The winner's model is solved again: through Pyomo when screening used the raw matrix (the
        # returned plan and its bound then come from the Pyomo model), or with the full time limit
        # when the screening solve stopped early.
        full = solve_grouping(sol.grouping, cluster, model, wl, final_solver, time_limit_s)
        if full.feasible:
            fplan = full.to_plan(wl, model, cluster)
            if estimate(fplan, cluster, model, wl).fits:
                ft = simulate(fplan, cluster, model, wl).iteration_time_s
                if ft <= sim_t:
                    sim_t, plan = ft, fplan
                    sol = full
                else:
                    sol.lower_bound_s = max(sol.lower_bound_s, full.lower_bound_s)
    plan, sim_t, moves = refine(plan, sim_t, cluster, model, wl, budget_s=refine_budget_s, tick=tick)
    if moves:
        source += f"+refine ({moves} moves)"
    stages["III refine"] = time.perf_counter() - t
    if bar is not None:
        bar.close()
    label = solver if final_solver == solver or sol is None else f"{final_solver} (screening: {solver})"
    result = _result(cluster, model, wl, plan, sim_t, source, sol, base, searches, stages, t_start, final_solver, label)
    if workload.recompute == "auto":
        skipped = [p for p in policies_of(workload) if p not in policies]
        result.notes.insert(0, f"recompute policy {policy} chosen by auto: the fastest plan among the policies searched "
                               f"({', '.join(policies)})" + (f"; {', '.join(skipped)} cannot fit (memory check)" if skipped else ""))
    return result


def _result(cluster, model, workload, plan, sim_t, source, sol, base, searches: dict[str, _Search], stages, t_start, solver, label) -> PlanResult:
    """Assemble the PlanResult for the winner's (concrete) policy `workload.recompute`; the
    linear-model value and bound refer to the plan's grouping, the search bound and counts to every
    policy searched."""
    policy = workload.recompute
    s = searches.get(policy) or next(iter(searches.values()))
    plan = Plan(plan.seq_len, plan.num_heads, plan.num_kv_heads, plan.groups, plan.block_size, "hexiseq", cluster.name, model.name,
                {**plan.meta, "source": source, "recompute": policy})
    groups = [list(x.devices) for x in plan.groups]
    if sol is None or not sol.feasible or [list(g) for g in sol.grouping.groups] != groups:
        # the plan came from a baseline or refinement changed its ranks: bound its grouping afresh
        g = Grouping(tuple(tuple(x) for x in groups), f"grouping of {source}")
        wl_b = replace(workload, block_size=min(workload.block_size, plan.block_size))
        cached = s.solutions.get(g.key) if wl_b == workload and s.workload == workload else None
        sol = cached if cached is not None and cached.feasible else solve_grouping(g, cluster, model, wl_b, solver, s.time_limit_s)
    est = estimate(plan, cluster, model, workload)
    bound = compute_bound(cluster, model, workload)
    tps = workload.tokens / sim_t
    # the linear model's value of the returned plan itself (heads as the plan has them)
    # (in the same variant the bound is for: fixed heads, or free heads where the MILP chose them)
    lf = linear_form(cluster, model, workload, groups, heads=[list(x.heads) for x in plan.groups] if sol.fixed_heads else None)
    linear_t = float(lf.evaluate(plan)[0].max())
    lb = sol.lower_bound_s if math.isfinite(sol.lower_bound_s) else math.nan
    # every policy's candidates were bounded under that policy: the least is a bound over all of them
    all_bounds = [b for x in searches.values() for b in x.bounds if math.isfinite(b)]
    search_lb = min(all_bounds + ([lb] if math.isfinite(lb) else []), default=math.nan)
    notes = []
    if not math.isfinite(lb):
        notes.append(f"the chosen plan's grouping has no bound from the MILP ({sol.status})")
    if workload.seq_len < 256 * 1024 and est.efficiency_vs_bound < 0.85:
        notes.append("short sequences are communication- and overhead-bound: efficiency vs the compute bound is lower")
    return PlanResult(
        plan=plan,
        iteration_time_s=sim_t,
        tokens_per_s=tps,
        estimate_time_s=est.iteration_time_s,
        linear_time_s=linear_t,
        lower_bound_s=lb,
        gap=max(0.0, 1.0 - lb / linear_t) if math.isfinite(lb) and math.isfinite(linear_t) else math.nan,
        solver_gap=sol.gap if sol.feasible else math.nan,
        search_lower_bound_s=search_lb,
        search_gap=max(0.0, 1.0 - search_lb / sim_t) if math.isfinite(search_lb) else math.nan,
        solver=label,
        solver_status=sol.status,
        baselines=base,
        bound_tokens_per_s=bound,
        efficiency_vs_bound=tps / bound,
        grouping_label=sol.grouping.label,
        source=source,
        plan_time_s=time.perf_counter() - t_start,
        stage_times_s=stages,
        candidates=sum(len(x.bounds) for x in searches.values()),
        solved=sum(1 for x in searches.values() for y in x.solutions.values() if y.status not in ("pruned", "memory")),
        pruned=sum(x.pruned for x in searches.values()),
        estimate=est,
        notes=notes,
        recompute=policy,
        policies_searched=list(searches),
    )


def _progress(enabled: bool):
    """A tqdm bar on stderr that appears only when planning takes more than a moment."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=None, desc="planning", unit="step", file=sys.stderr, delay=1.0, leave=False)


__all__ = ["plan_cluster", "search_groupings", "BaselineResult", "best_baseline"]
