"""The planner: (I) the candidate search space, (II) best-first search with proven bounds over it,
(III) local refinement under the step replay; the baselines compete too, so the result is never
worse than the best of them.

Recompute policy: a concrete policy of the workload is planned as given; under "auto" every policy
that can fit (explain.may_fit, a proof) is searched, the fastest plan of any policy wins and its
policy is recorded in the plan (meta["recompute"]).

Determinism: no wall-clock limit decides anything. The search stops at a gap or after a number of
cutting-plane rounds, the refinement after a number of moves; candidates are listed and visited in
a fixed order; every LP is solved by HiGHS on one thread, whatever the process solved before
(planner/lp.py), and an LP the solver fails on stops the planner (planner/search.py). The same input
gives the same plan on any machine, under any load, after any other plan.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from ..costmodel import compute_bound, estimate
from ..costmodel.bound import every_plan_bound
from ..costmodel.kernels import CostOptions
from ..errors import HexiSeqError, InfeasibleError
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, RecomputePolicy, Workload
from ..specs.identity import cluster_fingerprint, model_record
from .baselines import BaselineResult, baselines, best_baseline, policies_of
from .candidates import (
    EXHAUSTIVE_DEVICES,
    EXHAUSTIVE_MAX,
    MAX_ORDERED,
    MAX_SPANNING,
    SYMMETRIC_FROM,
    Candidate,
    device_subsets,
    exhaustive_layouts,
    layouts,
)
from .collector import fewer_collections
from .explain import explain_infeasible, may_fit
from .layout import Layout
from .refine import refine
from .result import PlanResult, gap_account
from .search import DEFAULT_GAP, DEFAULT_WORK, Search

MAX_GROUPS = 256  # layouts with more groups are not searched (the exchange has k-1 rounds per layer)
# a baseline's layout is searched on at most this many devices: on mixed-1024 the USP baseline's 640-GPU
# layout took the search's whole work limit (1,500 rounds, 41 s instead of 10 s) and improved nothing
BASELINE_LAYOUT_MAX_DEVICES = 256

SEARCH_SPACE = (
    f"up to {EXHAUSTIVE_DEVICES} devices: every layout at all (every subset, partition, ring order and head split "
    f"in whole KV heads, when there are at most {EXHAUSTIVE_MAX}); otherwise: every device subset of the "
    "candidate list (all devices, each union of GPU types, the fastest n whole-node "
    "prefixes); node groups of every size dividing the KV heads (and groups of such a size plus one of the rest "
    f"where a node's even cuts are all smaller), spanning groups on up to {MAX_SPANNING} devices "
    f"(every head split); node and interleaved ring orders (every order up to {MAX_ORDERED} groups); at most "
    f"{MAX_GROUPS} groups, and layouts beyond {SYMMETRIC_FROM - 1} groups only in a periodic order with periodic "
    f"chunk lengths and shards; heads even "
    f"inside a group of identical devices; every baseline plan (each family also on the fastest n devices for "
    "every n one of its symmetric layouts can use), and the layout of each baseline on at most "
    f"{BASELINE_LAYOUT_MAX_DEVICES} devices (its groups may span nodes) with its chunk lengths and shards chosen by "
    "the search. The reported bound also covers every plan "
    "outside this space (costmodel.bound.every_plan_bound)"
)


def candidate_layouts(cluster: ClusterSpec, model: ModelSpec) -> list[Candidate]:
    """Stage I: every candidate layout of every candidate device subset, in a fixed order (every
    layout at all on clusters of at most EXHAUSTIVE_DEVICES devices)."""
    if cluster.size <= EXHAUSTIVE_DEVICES:
        every = exhaustive_layouts(cluster, model, limit=EXHAUSTIVE_MAX)
        if every is not None:
            return every
    out: list[Candidate] = []
    seen: set = set()
    for label, devs in device_subsets(cluster):
        for cand in layouts(cluster, model, label, devs, max_groups=MAX_GROUPS):
            if cand.layout.k >= SYMMETRIC_FROM and cand.orbits is None:
                continue  # too many groups for the full model and no rotation to reduce it
            if cand.key not in seen:
                seen.add(cand.key)
                out.append(cand)
    return out


def baseline_layouts(base: dict[str, BaselineResult], cands: list[Candidate]) -> list[Candidate]:
    """`cands` and the layout of every baseline that fits on at most BASELINE_LAYOUT_MAX_DEVICES devices
    (unless it is one of them): the search then chooses its sizes (the chunk length of each group, the
    token shard of each rank) instead of the baseline's even ones; its groups and heads stay the
    baseline's, and may span nodes, which no other candidate's do beyond MAX_SPANNING devices. A list
    that holds every layout at all (small clusters) is returned as it is."""
    if cands and all(c.complete for c in cands):
        return cands
    known = {c.key for c in cands}
    out = list(cands)
    for name, b in base.items():
        if b.plan is None:
            continue
        layout = Layout.of(b.plan)
        cand = Candidate(layout, f"the {name} baseline's layout", "baseline")
        if cand.key in known or layout.k >= SYMMETRIC_FROM or len(layout.devices) > BASELINE_LAYOUT_MAX_DEVICES:
            continue
        known.add(cand.key)
        out.append(cand)
    return out


def _progress(enabled: bool):
    """A tqdm bar on stderr that appears only when planning takes more than a moment."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=None, desc="planning", unit="step", file=sys.stderr, delay=1.0, leave=False)


def plan_cluster(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    solver: str = "highs",
    progress: bool = True,
    work: int = DEFAULT_WORK,
    gap: float = DEFAULT_GAP,
    options: CostOptions = CostOptions(),
    explain: bool = True,
    certify: bool = True,
) -> PlanResult:
    """Find the fastest asymmetric CP x HP plan that fits (module doc). `work` caps the search's
    cutting-plane rounds and `gap` stops it early (both leave the reported bound valid). Raises
    InfeasibleError with an explanation when nothing fits in memory (`explain` False: a one-line
    reason, for callers that only need to know; the explanation solves a dozen memory models).
    `certify` False: the lower bound covers the searched candidate layouts only (the bound of every
    other plan is not computed), for callers that use the plan and not the bound (the joint
    planner's replica shapes: its own bound covers every joint plan)."""
    with fewer_collections():
        return _plan_cluster(cluster, model, workload, solver, progress, work, gap, options, explain, certify)


def _plan_cluster(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    solver: str,
    progress: bool,
    work: int,
    gap: float,
    options: CostOptions,
    explain: bool,
    certify: bool,
) -> PlanResult:
    def infeasible(wl: Workload) -> InfeasibleError:
        if explain:
            return InfeasibleError(explain_infeasible(cluster, model, wl))
        return InfeasibleError(f"{model.name} at {wl.seq_len:,} tokens does not fit on {cluster.name}")

    if solver != "highs":
        raise HexiSeqError(
            f"solver {solver!r}: the planner solves its models with the embedded HiGHS; export a model with "
            "--write-model to hand it to another solver"
        )
    if work <= 0 or not gap >= 0:
        raise HexiSeqError(f"work must be positive and gap >= 0, got work={work}, gap={gap}")
    t_start = time.perf_counter()
    bar = _progress(progress)
    stages: dict[str, float] = {}

    def tick(what: str) -> None:
        if bar is not None:
            bar.set_postfix_str(what[:40], refresh=False)
            bar.update(1)

    try:
        t = time.perf_counter()
        requested = policies_of(workload)
        policies = [
            p
            for p in requested
            if workload.recompute != "auto" or may_fit(cluster, model, workload.with_recompute(p), options)
        ]
        if not policies:
            raise infeasible(workload.with_recompute(RecomputePolicy.FULL))
        base = baselines(cluster, model, workload, progress=tick, policies=policies, options=options)
        stages["baselines"] = time.perf_counter() - t
        t = time.perf_counter()
        cands = candidate_layouts(cluster, model)
        cands = baseline_layouts(base, cands)
        stages["I candidates"] = time.perf_counter() - t
        t = time.perf_counter()
        bb = best_baseline(base)
        incumbent = (
            (bb.iteration_time_s, bb.plan, bb.recompute, f"baseline {bb.name}") if bb else (math.inf, None, None, "")
        )
        search = Search(cluster, model, workload, policies, cands, incumbent, options, tick)
        res = search.run(work=work, gap=gap)
        stages["II search"] = time.perf_counter() - t
        if res.best_plan is None:
            explain_wl = (
                workload.with_recompute(RecomputePolicy.FULL)
                if workload.recompute == RecomputePolicy.AUTO
                else workload
            )
            raise infeasible(explain_wl)
        t = time.perf_counter()
        wl = workload.with_recompute(res.best_policy)
        plan, sim_t, moves = refine(res.best_plan, res.best_s, cluster, model, wl, tick=tick, options=options)
        stages["III refine"] = time.perf_counter() - t
    finally:
        if bar is not None:
            bar.close()
    source = res.best_source + (f" +refine ({moves} moves)" if moves else "")
    search_lb = min(res.lower_bound_s, sim_t)
    if certify:
        outside_lb, covers = outside_search_bound(cluster, model, workload, policies, cands, options)
    else:
        outside_lb, covers = math.inf, "the searched candidate layouts only (the plans they leave out were not bounded)"
    lb = min(search_lb, outside_lb)
    plan = replace(
        plan,
        name="hexiseq",
        cluster=cluster.name,
        model=model.name,
        meta={
            **plan.meta,
            "source": source,
            "recompute": res.best_policy,
            "cluster_fingerprint": cluster_fingerprint(cluster),
            **({"model_spec": spec} if (spec := model_record(model)) is not None else {}),
        },
    )
    est = estimate(plan, cluster, model, wl, options)
    bound = compute_bound(cluster, model, wl, options)
    notes = []
    if workload.recompute == "auto":
        skipped = [p for p in requested if p not in policies]
        notes.append(
            f"recompute policy {res.best_policy} chosen by auto: the fastest plan among {', '.join(policies)}"
            + (f"; {', '.join(skipped)} cannot fit (memory check)" if skipped else "")
        )
    if res.rounds >= work:
        notes.append(
            f"the search stopped at its work limit ({work} cutting-plane rounds): the bound is valid but weaker"
        )
    notes.append(f"the lower bound covers {covers}")
    if outside_lb < search_lb:  # the every-grouping bound is the one reported: say what it leaves out
        notes.append(gap_account(est, lb))
    visited = [n for n in res.nodes if n.model is not None]
    return PlanResult(
        plan=plan,
        iteration_time_s=sim_t,
        tokens_per_s=workload.tokens / sim_t,
        lower_bound_s=lb,
        gap=max(0.0, 1.0 - lb / sim_t),
        baselines=base,
        bound_tokens_per_s=bound,
        efficiency_vs_bound=(workload.tokens / sim_t) / bound,
        grouping_label=source.split(": ", 1)[-1],
        source=source,
        solver="highs (Pyomo appsi, embedded)",
        plan_time_s=time.perf_counter() - t_start,
        stage_times_s=stages,
        candidates=len(res.nodes),
        solved=len(visited),
        pruned=len(res.nodes) - len(visited),
        work_rounds=res.rounds,
        search_space=SEARCH_SPACE,
        estimate=est,
        notes=notes,
        recompute=res.best_policy,
        policies_searched=policies,
        left_out=left_out_explained(cluster, plan, res.nodes, sim_t),
        search_lower_bound_s=search_lb,
        bound_covers=covers,
    )


def outside_search_bound(
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    policies: list[str],
    candidates: list[Candidate],
    options: CostOptions = CostOptions(),
) -> tuple[float, str]:
    """A lower bound of every plan (DP = 1) the search space leaves out, and in words what the
    planner's bound then covers. When the candidates are every layout at all (small clusters) nothing
    is left out (inf); otherwise costmodel.bound.every_plan_bound under each policy searched (a policy
    left out cannot fit: explain.may_fit's proof), which holds for every grouping, ring order and
    split on every device subset."""
    if candidates and all(c.complete for c in candidates):
        return math.inf, (
            "every plan the executor can run at DP = 1: every device subset, grouping, ring order and head split "
            "was a candidate, the token split and chunk lengths are the models' variables"
        )
    bound = min(every_plan_bound(cluster, model, workload.with_recompute(p), options) for p in policies)
    return bound, (
        "every plan the executor can run at DP = 1 (any device subset that can hold a sequence, any grouping into "
        "HP groups, groups of different sizes inside a node or spanning nodes, any ring order and split): the "
        "least of the search's bound over its candidate layouts and a bound valid for every grouping (balanced "
        "compute with the recompute counted, parameter collectives, optimizer; all-to-all and exchange costs are "
        "not counted there, so the bound is weaker than the search's own)"
    )


def left_out_explained(cluster: ClusterSpec, plan: Plan, nodes, best_s: float) -> list[str]:
    """One line per GPU type with devices the plan leaves out: how many, and the fastest plan found
    that uses them (how much slower), or why none could be found."""
    used = set(plan.rank_devices)
    out = []
    by_type: dict[str, list[int]] = {}
    for d in cluster.devices:
        if d.index not in used:
            by_type.setdefault(d.gpu.name, []).append(d.index)
    for gpu, devs in by_type.items():
        with_them = [n for n in nodes if set(devs) <= set(n.cand.layout.devices)]
        tried = [n.best_s for n in with_them if math.isfinite(n.best_s)]
        bounds = [n.bound for n in with_them]
        lb = min(bounds) if bounds else math.inf
        head = f"{len(devs)} x {gpu} left out (devices {devs[0]}..{devs[-1]})"
        if tried:
            out.append(
                f"{head}: the fastest plan found with them takes {min(tried):.4g} s, {min(tried) / best_s - 1:+.1%} "
                f"against {best_s:.4g} s without; no plan with them can beat {lb:.4g} s"
            )
        elif math.isfinite(lb):
            out.append(f"{head}: no plan with them can beat {lb:.4g} s (bound), against {best_s:.4g} s without")
        else:
            out.append(f"{head}: no plan that uses them fits in memory")
    return out


__all__ = ["plan_cluster", "candidate_layouts", "BaselineResult", "best_baseline", "Callable"]
