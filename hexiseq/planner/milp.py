"""Stage II: the optimization model for one grouping, with a certified lower bound.

Given the groups (devices in ring order), choose chunk lengths L_g (whole blocks), token shards s_r
and head counts η_r minimizing the iteration time T of the cost model's linear form
(`hexiseq.costmodel.linear`):

    min T   s.t.  T ≥ Σ_i t_{r,i},  t_{r,i} ≥ piece   (every rank r, term i, piece of the term)
                  memory piece_r ≤ capacity_r        (every rank, every K/V-buffer piece)
                  Σ_g 2·L_g = S,  L_g = B·ℓ_g, ℓ_g ≥ 1 integer
                  Σ_{r∈g} s_r = 2·L_g,  Σ_{r∈g} η_r = H,  η_r ∈ u·ℤ (u = H/H_kv, whole KV heads)

**Aggregation.** Ranks of one group on identical devices (same GPU type, same node) are
interchangeable: they share one shard and one head variable. The model checks that the linear
form really is symmetric in them (same coefficients on themselves, uniform coefficients on
peers); then the LP relaxation of the aggregated model equals that of the full model (average an
optimal solution over the permutations), so its bound stays valid. Otherwise no aggregation.

**Heads × length.** In a one-class group whose size divides the head units the heads are even and
fixed: η·L is linear. Otherwise η_c = u·Σ_b 2^b y_{c,b} with binaries y, and every product η_c·L_h
the form needs is u·Σ_b 2^b z_{c,h,b} with z = y·L_h linearized exactly (z ≤ L_max·y, z ≤ L_h,
z ≥ L_h − L_max·(1 − y), z ≥ 0).

**Bounds.** The LP relaxation (integers relaxed) and the MILP solver's proven bound are both lower
bounds on the linear model's optimum for this grouping; `lower_bound_s` is the larger one.
When only chunk blocks are integer, the relaxation's chunks are rounded and the LP re-solved; if
that is within `rel_gap` of the relaxation it is taken (certified) and branch-and-bound skipped.
The K/V-buffer memory rows (one per exchange round) are added lazily, when a solution violates them.

**Solvers.** The model is a `solvers.LinearProgram`: solved by the embedded HiGHS on its matrix
(default), or as a Pyomo model by any Pyomo solver by name (see solvers.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..errors import HexiSeqError
from ..plan import Group, Plan
from ..specs import GIB, ClusterSpec, ModelSpec, Workload
from .aggregate import classes as _classes
from .aggregate import sig as _sig
from .aggregate import symmetric as _symmetric
from .groupings import Grouping, head_units
from .solvers import LinearProgram, Outcome, solve

DEFAULT_REL_GAP = 5e-3  # the MILP stops within 0.5% of its bound: inside the 1% target


@dataclass
class MilpSolution:
    """The optimum of one grouping's model (or why there is none)."""

    grouping: Grouping
    status: str  # "optimal", "time limit", "infeasible", "error: ..."
    objective_s: float  # linear-model iteration time of the integer solution (inf if none)
    lower_bound_s: float  # proven lower bound for this grouping (inf when infeasible)
    lp_bound_s: float
    chunk_blocks: list[int] = field(default_factory=list)
    shards: list[list[float]] = field(default_factory=list)  # per group, per rank (continuous)
    heads: list[list[int]] = field(default_factory=list)
    build_time_s: float = 0.0
    solve_time_s: float = 0.0
    aggregated: bool = False
    variables: int = 0
    fixed_heads: bool = True  # False: the linear form's free-heads variant (η·L linearized)

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.objective_s)

    @property
    def gap(self) -> float:
        if not self.feasible:
            return math.inf
        return max(0.0, 1.0 - self.lower_bound_s / self.objective_s) if self.objective_s > 0 else 0.0

    def to_plan(self, workload: Workload, model: ModelSpec, cluster: ClusterSpec, name: str = "hexiseq") -> Plan:
        """Round to whole tokens (largest remainder inside each group); ranks left with no tokens and
        no heads are dropped from their group (left out of the run)."""
        B = workload.block_size
        groups = []
        for devs, cb, sh, hd in zip(self.grouping.groups, self.chunk_blocks, self.shards, self.heads):
            n = 2 * cb * B
            ints = _round_to_sum([max(0.0, x) for x in sh], n)
            keep = [i for i in range(len(devs)) if ints[i] > 0 or hd[i] > 0]
            groups.append(Group(tuple(devs[i] for i in keep), cb * B, tuple(ints[i] for i in keep), tuple(hd[i] for i in keep)))
        return Plan(workload.seq_len, model.heads, model.kv_heads, tuple(groups), B, name, cluster.name, model.name,
                    {"grouping": self.grouping.label, "linear_time_s": self.objective_s})


def _round_to_sum(xs: list[float], total: int) -> list[int]:
    s = sum(xs)
    scaled = [x * total / s for x in xs] if s > 0 else [total / len(xs)] * len(xs)
    out = [int(math.floor(x)) for x in scaled]
    for i in sorted(range(len(xs)), key=lambda i: scaled[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return out


# ---------------------------------------------------------------------------- structure


# ---------------------------------------------------------------------------- model


def solve_grouping(
    grouping: Grouping,
    cluster: ClusterSpec,
    model: ModelSpec,
    workload: Workload,
    solver: str = "highs",
    time_limit_s: float = 10.0,
    rel_gap: float = DEFAULT_REL_GAP,
    lp_only: bool = False,
    cutoff_s: float | None = None,
) -> MilpSolution:
    """Build and solve the model of one grouping. With `lp_only` only the relaxation is solved (a bound).
    When the relaxation is already ≥ `cutoff_s` the MILP is skipped (status "pruned")."""
    from ..costmodel.linear import linear_form

    t0 = time.perf_counter()
    groups = [list(g) for g in grouping.groups]
    S, B, H = workload.seq_len, workload.block_size, model.heads
    units = head_units(model)
    u = H // units
    k = len(groups)
    nblocks = S // (2 * B) if S % (2 * B) == 0 else 0
    if nblocks < k:
        return MilpSolution(grouping, f"infeasible: {S} tokens do not give {k} groups whole chunks of {B}", math.inf, math.inf, math.inf)
    cls = _classes(cluster, groups)
    units_ok = lambda g: units % len(groups[g]) == 0  # noqa: E731
    # a one-class group whose size does not divide the heads needs uneven heads: no aggregation there
    cls = [[[i] for i in cg[0]] if len(cg) == 1 and not units_ok(g) else cg for g, cg in enumerate(cls)]
    # Heads fixed where a one-class group divides the head units evenly; free (binary) otherwise.
    fixed_heads = all(len(c) == 1 and units % len(groups[g]) == 0 for g, c in enumerate(cls))
    heads_arg = [[H // len(g)] * len(g) for g in groups] if fixed_heads else None
    lf = linear_form(cluster, model, workload, groups, heads=heads_arg)
    R = lf.num_ranks
    starts = [0]
    for g in groups:
        starts.append(starts[-1] + len(g))
    rank_cls: list[int] = [0] * R
    members: list[list[int]] = []
    cls_group: list[int] = []
    for g, cg in enumerate(cls):
        for c in cg:
            members.append([starts[g] + i for i in c])
            cls_group.append(g)
            for i in c:
                rank_cls[starts[g] + i] = len(members) - 1
    aggregated = _symmetric(lf, rank_cls, members)
    if not aggregated:  # every rank its own class
        members = [[r] for r in range(R)]
        cls_group = [lf.rank_group[r] for r in range(R)]
        rank_cls = list(range(R))
    C = len(members)
    lp = LinearProgram()
    Lmax = float(B * (nblocks - (k - 1)))
    lvar = [lp.add_var(1, nblocks - (k - 1), integer=True) for _ in range(k)]  # chunk length in blocks
    svar = [lp.add_var(0.0, float(S)) for _ in range(C)]  # shard per class member
    T = lp.add_var(0.0)
    lp.objective = T
    # heads: constant per class where even and fixed, else a binary expansion in KV-head units
    eta_const: dict[int, float] = {}
    for c in range(C):
        g = cls_group[c]
        if fixed_heads or (len(cls[g]) == 1 and aggregated and units % len(groups[g]) == 0):
            eta_const[c] = float(H // len(groups[g]))
    free = [c for c in range(C) if c not in eta_const]
    nbits = max(1, units.bit_length())
    ybits = {c: [lp.add_var(0, 1, integer=True) for _ in range(nbits)] for c in free}
    zbits: dict[tuple[int, int], list[int]] = {}

    def add(acc: dict, e: dict, f: float) -> None:
        for i, v in e.items():
            acc[i] = acc.get(i, 0.0) + f * v

    def eta_lin(c: int) -> tuple[float, dict]:
        if c in eta_const:
            return eta_const[c], {}
        return 0.0, {y: u * 2**b for b, y in enumerate(ybits[c])}

    def w_lin(c: int, h: int) -> dict:
        """η_c · L_h as a linear expression (exact: McCormick on binaries)."""
        if c in eta_const:
            return {lvar[h]: eta_const[c] * B}
        if (c, h) not in zbits:
            zs = []
            for y in ybits[c]:
                z = lp.add_var(0.0, Lmax)
                lp.add_row({z: 1.0, y: -Lmax}, hi=0.0)  # z ≤ Lmax·y
                lp.add_row({z: 1.0, lvar[h]: -B}, hi=0.0)  # z ≤ L_h
                lp.add_row({z: 1.0, lvar[h]: -B, y: -Lmax}, lo=-Lmax)  # z ≥ L_h − Lmax·(1 − y)
                zs.append(z)
            zbits[(c, h)] = zs
        return {z: u * 2**b for b, z in enumerate(zbits[(c, h)])}

    def lin(aff) -> tuple[float, dict]:
        """The Affine in model variables (rank variables → their class's)."""
        const, acc = aff.const, {}
        for key, cf in aff.coef.items():
            kind = key[0]
            if kind == "L":
                add(acc, {lvar[key[1]]: float(B)}, cf)
            elif kind == "s":
                add(acc, {svar[rank_cls[key[1]]]: 1.0}, cf)
            elif kind == "eta":
                c0, e = eta_lin(rank_cls[key[1]])
                const += cf * c0
                add(acc, e, cf)
            elif kind == "w":
                add(acc, w_lin(rank_cls[key[1]], lf.rank_group[key[1]]), cf)
            elif kind == "wx":
                add(acc, w_lin(rank_cls[key[1]], key[2]), cf)
            else:  # pragma: no cover - a variable the planner does not know
                raise HexiSeqError(f"linear form uses an unknown variable {key!r}")
        return const, acc

    # sums: chunks cover S; shards cover the group; heads cover H
    lp.add_row({x: 1.0 for x in lvar}, lo=nblocks, hi=nblocks)
    for g in range(k):
        cs = [c for c in range(C) if cls_group[c] == g]
        row = {svar[c]: float(len(members[c])) for c in cs}
        row[lvar[g]] = row.get(lvar[g], 0.0) - 2.0 * B
        lp.add_row(row, lo=0.0, hi=0.0)
        if any(c in free for c in cs):
            const, acc = 0.0, {}
            for c in cs:
                c0, e = eta_lin(c)
                const += len(members[c]) * c0
                add(acc, e, float(len(members[c])))
            lp.add_row(acc, lo=H - const, hi=H - const)
        for c in cs:
            if c in free:
                lp.add_row(eta_lin(c)[1], hi=float(H))
    # time (T ≥ Σ_terms max(pieces)) and memory (GiB), one representative rank per class
    seen_rows: set = set()
    pending: list[tuple[dict, float]] = []  # memory rows not yet in the model
    for c in range(C):
        r = members[c][0]
        total_const, total = 0.0, {T: 1.0}
        for term in lf.time_terms[r]:
            if len(term) == 1:
                c0, e = lin(term[0])
                total_const += c0
                add(total, e, -1.0)
            else:
                t = lp.add_var(0.0)
                for p in term:
                    c0, e = lin(p)
                    row = {t: 1.0}
                    add(row, e, -1.0)
                    lp.add_row(row, lo=c0)  # t ≥ piece
                total[t] = total.get(t, 0.0) - 1.0
        lp.add_row(total, lo=total_const)  # T − Σ ≥ constants
        cap = lf.capacity_bytes[r] / GIB
        c0, e = lin(lf.memory[r])  # memory without the K/V buffers: always in the model
        lp.add_row({i: v / GIB for i, v in e.items()}, hi=cap - c0 / GIB)
        for p in lf.kv_buffer[r]:  # each round's K/V buffers: added when violated (lazy)
            c0, e = lin(lf.memory[r] + p)
            row = {i: v / GIB for i, v in e.items()}
            key = (tuple(sorted((i, _sig(v)) for i, v in row.items())), _sig(cap - c0 / GIB))
            if key not in seen_rows:  # pieces repeat across rounds and classes: skip duplicates
                seen_rows.add(key)
                pending.append((row, cap - c0 / GIB))
    build = time.perf_counter() - t0

    t1 = time.perf_counter()

    def solve_lazy(relax: bool) -> Outcome:
        """Solve, add the K/V-buffer memory rows the solution violates, repeat. Dropping rows only
        relaxes the model, so bounds stay valid; the returned solution satisfies every row."""
        while True:
            out = solve(lp, solver, time_limit_s, rel_gap, relax=relax)
            if out.values is None:
                return out
            x = out.values
            bad = [i for i, (row, hi) in enumerate(pending) if sum(v * x[j] for j, v in row.items()) > hi + 1e-6 * max(1.0, abs(hi))]
            if not bad:
                return out
            for i in bad:
                lp.add_row(*pending[i][:1], hi=pending[i][1])
            for i in reversed(bad):
                pending.pop(i)
    sol = MilpSolution(grouping, "", math.inf, math.inf, math.inf, build_time_s=build, aggregated=aggregated, variables=lp.num_vars,
                       fixed_heads=fixed_heads)
    relaxed = solve_lazy(relax=True)  # a bound, and a cheap screen
    if relaxed.status == "infeasible":
        sol.status = "infeasible: nothing fits in memory with this grouping"
        sol.solve_time_s = time.perf_counter() - t1
        return sol
    if relaxed.objective is None:
        sol.status = f"relaxation not solved: {relaxed.status}"
        sol.solve_time_s = time.perf_counter() - t1
        return sol
    sol.lp_bound_s = relaxed.bound if relaxed.bound is not None else relaxed.objective
    sol.lower_bound_s = sol.lp_bound_s
    if lp_only or (cutoff_s is not None and sol.lp_bound_s >= cutoff_s):
        sol.status = "relaxation only" if lp_only else "pruned"
        sol.solve_time_s = time.perf_counter() - t1
        return sol
    res = None
    if not free and relaxed.values is not None:
        # Only the chunk blocks are integer: round the relaxation's chunks (largest remainder) and
        # re-solve the LP with them fixed. When that is within rel_gap of the relaxation it is a
        # certified solution and the branch-and-bound is skipped (it dominates the time at 100+ groups).
        blocks = _round_to_sum([max(relaxed.values[v] - 1.0, 0.0) for v in lvar], nblocks - k)
        saved = [(lp.lo[v], lp.hi[v]) for v in lvar]
        for v, b in zip(lvar, blocks):
            lp.lo[v] = lp.hi[v] = float(b + 1)
        fixed = solve_lazy(relax=True)
        for v, (lo, hi) in zip(lvar, saved):
            lp.lo[v], lp.hi[v] = lo, hi
        if fixed.objective is not None and fixed.objective <= sol.lp_bound_s * (1 + rel_gap):
            res = Outcome("optimal", fixed.objective, sol.lp_bound_s, fixed.values)
    if res is None:
        res = solve_lazy(relax=False)
    sol.solve_time_s = time.perf_counter() - t1
    if res.objective is None:
        sol.status = "infeasible: no integer chunk/head split fits" if res.status == "infeasible" else res.status
        return sol
    x = res.values
    sol.status = res.status
    sol.objective_s = float(x[T])
    if res.bound is not None:
        sol.lower_bound_s = max(sol.lp_bound_s, min(res.bound, sol.objective_s))
    sol.chunk_blocks = [int(round(x[v])) for v in lvar]
    shards = [[0.0] * len(g) for g in groups]
    heads = [[0] * len(g) for g in groups]
    for c in range(C):
        g = cls_group[c]
        c0, e = eta_lin(c)
        eta = int(round(c0 + sum(v * x[i] for i, v in e.items())))
        for r in members[c]:
            shards[g][r - starts[g]] = float(x[svar[c]])
            heads[g][r - starts[g]] = eta
    sol.shards, sol.heads = shards, heads
    return sol
