"""Stage III: local refinement of a plan under the step replay (the judge).

The model's solution is rounded to whole blocks and tokens; a few local moves may still help.
Starting from the best plan, repeatedly try small moves away from the busiest rank (by its own
work) — a block of chunk to the least busy group, tokens or a KV-head unit of heads to the least
busy rank of its group — and keep a move when the replayed iteration time drops and every rank still
fits in memory. First improvement, at most `max_moves` kept and `max_tries` tried: a deterministic
work limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from ..costmodel import CostOptions, estimate, simulate
from ..errors import PlanError
from ..plan import Group, Plan
from ..rounding import largest_remainder
from ..specs import ClusterSpec, ModelSpec, Workload


def _with_groups(plan: Plan, groups: list[Group]) -> Plan:
    """The plan with other groups (everything else, its metadata included, kept)."""
    return replace(plan, groups=tuple(groups))


def _moves(plan: Plan, busy: np.ndarray, unit: int) -> Iterator[Plan]:
    """Candidate neighbours of `plan`, most promising first."""
    groups = list(plan.groups)
    g_of = plan.group_of_rank
    crit = int(np.argmax(busy))
    gc = g_of[crit]
    gbusy = np.array([busy[list(plan.group_ranks(g))].max() for g in range(plan.num_groups)])
    B = plan.block_size
    # 1. one block of chunk from the critical group to the least busy group
    if plan.num_groups > 1 and groups[gc].chunk_len > B:
        order = np.argsort(gbusy)
        for gl in [int(x) for x in order[:2] if int(x) != gc]:
            new = list(groups)
            a, b = groups[gc], groups[gl]
            shards_c = largest_remainder(a.shards, 2 * (a.chunk_len - B))
            shards_l = largest_remainder(b.shards, 2 * (b.chunk_len + B))
            new[gc] = Group(a.devices, a.chunk_len - B, tuple(shards_c), a.heads)
            new[gl] = Group(b.devices, b.chunk_len + B, tuple(shards_l), b.heads)
            yield _with_groups(plan, new)
    ranks = list(plan.group_ranks(gc))
    if len(ranks) > 1:
        i = crit - ranks[0]
        j = int(np.argmin(busy[ranks]))
        g = groups[gc]
        if j != i:
            # 2. tokens from the critical rank to the least busy one in its group
            for frac in (0.02, 0.005):
                d = max(1, int(g.shards[i] * frac))
                if g.shards[i] - d >= 0 and (g.shards[i] - d > 0 or g.heads[i] > 0):
                    sh = list(g.shards)
                    sh[i] -= d
                    sh[j] += d
                    new = list(groups)
                    new[gc] = Group(g.devices, g.chunk_len, tuple(sh), g.heads)
                    yield _with_groups(plan, new)
            # 3. one KV-head unit of heads, likewise
            if g.heads[i] >= unit and (g.heads[i] > unit or g.shards[i] > 0):
                hd = list(g.heads)
                hd[i] -= unit
                hd[j] += unit
                new = list(groups)
                new[gc] = Group(g.devices, g.chunk_len, g.shards, tuple(hd))
                yield _with_groups(plan, new)


def refine(
    plan: Plan,
    sim_time_s: float,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    max_moves: int = 100,
    max_tries: int = 400,
    tick: Callable[[str], None] | None = None,
    options: CostOptions = CostOptions(),
) -> tuple[Plan, float, int]:
    """Improve `plan` by local moves while the replay says so: (plan, replayed time, moves kept).
    `options` are the search's (its software stack above all): `sim_time_s` was replayed under them,
    and every move is judged under them too."""
    unit = model.group_size
    cur, cur_t = plan, sim_time_s
    busy = simulate(cur, cluster, model, workload, options).busy_s
    kept = tries = 0
    while kept < max_moves and tries < max_tries:
        for cand in _moves(cur, busy, unit):
            tries += 1
            try:
                est = estimate(cand, cluster, model, workload, options)
            except PlanError:
                continue  # a move that breaks a rule of the layout: skip it
            if est.iteration_time_s < cur_t * (1 - 1e-7) and est.fits:
                cur, cur_t = cand, est.iteration_time_s
                busy = np.array([r.busy_s for r in est.ranks])
                kept += 1
                if tick:
                    tick(f"refine {kept}")
                break
            if tries >= max_tries:
                break
        else:
            break  # no improving move
    return cur, cur_t, kept
