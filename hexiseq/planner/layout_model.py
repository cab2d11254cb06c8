"""The optimization model of one layout, in Pyomo: the step replay as a linear program.

A *layout* fixes the devices, their HP groups, the ring order and the head split; what is left of a
plan is continuous (relaxed) or integer data the model chooses: the chunk lengths n_g (blocks) and
the token shard s_c of every member of each class c of identical ranks (same group, device type,
node, links and heads: permuting them maps the problem onto itself, so an optimum can be averaged
into a symmetric one and one variable per class loses nothing in the relaxation).

The replayed step time (costmodel/simulate.py) is a sum over pass kinds of count × D, each D the
longest path of an event graph whose edges are durations.py's durations — linear forms of (s, L)
and of the products L_g·L_h of the exchange rounds' attention. The model is

    min T = Σ count·D_pass + exposed collectives + optimizer
    s.t. D_pass ≥ length of path π(x)      for the paths π of the pass's event graph
         Σ n_g = S/(2B);  Σ_{c in g} members·s_c = 2·B·n_g;  memory of every class ≤ its capacity

with every path written as a linear constraint. There are exponentially many paths, so they are
generated: at the LP's solution the replay is run (`simulate_durations(..., trace=True)`) and each
pass's critical path becomes a constraint (Kelley's cutting planes on the convex, piecewise-linear
replay time). Every LP along the way is a relaxation, so its optimum is a valid lower bound at
every iteration (a work limit on iterations leaves a valid, weaker bound), and the loop stops when
the replay at the LP's solution equals the LP's value: then that value is the minimum. For a fixed
plan (n and s fixed) the model's value is the replayed step time exactly.

Products: L_g·L_h (h != g) is bilinear, L_g² convex. A path constraint needs an under-estimate of
each product it adds and an over-estimate of each it subtracts (the compute windows a prefetched
collective hides behind count against the time), linear over the box lo ≤ n ≤ hi. The box comes
from the best step time known: no plan with a larger time can have a chunk outside it, so the bound
holds for every plan (min(bound, best time)). Collapsing the box onto a plan makes every estimate
exact.

Memory: memory.py's terms are linear in (s, w = η·L, u = κ·L); the K/V receive buffers of every
round are added when a solution violates them.

Scaling: times in milliseconds, chunk lengths in blocks, memory in GiB (HiGHS drops matrix entries
below 1e-9).

The rooms of the model, by job:
    layout.py         the structure a model is built for (Layout) and its classes of identical ranks
    model.py          this module: the variables and rows, the cuts, the cutting-plane loop
    forms.py          a critical path's items (costmodel/paths.py) as linear forms of the variables
    products.py       McCormick / tangent / secant estimates of the products of chunk lengths
    box.py            the box from the best time known, and its optimality-based tightening
    memory_rows.py    memory within capacity, the K/V-buffer rows added lazily
    integer_plans.py  a solution rounded to whole blocks and tokens: plans, and the replay's verdict
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..costmodel.arrays import plan_arrays
from ..costmodel.durations import Coefficients, coefficients, evaluate
from ..costmodel.kernels import CostOptions
from ..costmodel.paths import Barrier, Pass, PathItem
from ..costmodel.simulate import pass_schedule, simulate_durations
from ..errors import HexiSeqError
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Workload
from .box import box_from_bound, tighten_box
from .forms import LinearRow, PathForms
from .integer_plans import judge, plan_of
from .layout import Layout, rank_classes, unit_plan
from .memory_rows import MemoryRows

MS = 1e3  # the model's time unit is the millisecond
MAX_CUT_ROUNDS = 80  # cutting-plane rounds per solve (a work limit: the bound stays valid when it binds)
CUT_TOL = 1e-7  # relative: stop when the replay at the LP's solution is this close to the LP value


@dataclass
class Solution:
    """One solve: status, the LP's optimum (seconds per iteration; a lower bound unless the loop
    converged, then the minimum), the replay at its solution, the chunk blocks and class shards."""

    status: str
    bound_s: float
    replay_s: float = math.inf
    blocks: list[float] = field(default_factory=list)
    shards: list[float] = field(default_factory=list)  # per class
    rounds: int = 0

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "stalled", "work limit", "above") and math.isfinite(self.bound_s)


class LayoutModel:
    """The model of one (layout, recompute policy) (module doc). Build once; `set_box`, `fix_blocks`,
    `fix_shards` change bounds; `solve` runs the cutting-plane loop on a
    persistent HiGHS instance."""

    def __init__(
        self,
        cluster: ClusterSpec,
        model: ModelSpec,
        workload: Workload,
        layout: Layout,
        options: CostOptions = CostOptions(),
        aggregate: bool = True,
        memory: bool = True,
        orbits: Sequence[int] | None = None,
        _coef: Coefficients | None = None,
        _cls: np.ndarray | None = None,
    ):
        import pyomo.environ as pyo

        self.pyo = pyo
        self.cluster, self.model, self.workload, self.layout, self.options = cluster, model, workload, layout, options
        k = self.k = layout.k
        S, B = workload.seq_len, workload.block_size
        if S % (2 * B):
            raise HexiSeqError(f"seq_len {S} is not a multiple of 2 x block size {B}")
        self.nb = S // (2 * B)
        if self.nb < k:
            raise HexiSeqError(f"{S} tokens do not give {k} groups a whole chunk of {B} tokens each")
        self.unit = unit_plan(layout, model)
        a = _coef.a if _coef is not None else plan_arrays(self.unit, cluster, model, None, options)
        # Orbits (periodic layouts): groups that a rotation of the ring maps onto each other
        # (identical devices at positions p apart) share one chunk variable, and their classes one
        # shard variable. This restricts the model to periodic plans — the zigzag makes a group's K/V
        # need depend on its position, so the problem is not invariant under the rotation and a
        # periodic optimum need not be a global one. Its bound holds for the periodic plans of the
        # layout (the search space says so), and at a fixed periodic plan it is the replay exactly.
        self.orbits = np.arange(k) if orbits is None else np.asarray(orbits, dtype=np.int64)
        self.periodic = orbits is not None
        self.coef: Coefficients = _coef if _coef is not None else coefficients(a, model, workload, options)
        self.cls = _cls if _cls is not None else rank_classes(cluster, layout, aggregate)
        self.C = int(self.cls.max()) + 1
        self.members = np.bincount(self.cls, minlength=self.C)
        self.rep = np.array([int(np.argmax(self.cls == c)) for c in range(self.C)])  # a representative rank per class
        self.cls_group = a.grp[self.rep]
        # variables: one chunk per orbit; one shard per class of the orbit's first group (its classes
        # in order stand for the corresponding classes of the other groups of the orbit)
        self.nvar = self.orbits
        self.NV = int(self.nvar.max()) + 1
        pos_in_group = np.zeros(self.C, dtype=np.int64)
        for g in range(k):
            cs = [c for c in range(self.C) if self.cls_group[c] == g]
            for i, c in enumerate(cs):
                pos_in_group[c] = i
        keys: dict[tuple, int] = {}
        self.svar = np.zeros(self.C, dtype=np.int64)
        for c in range(self.C):
            self.svar[c] = keys.setdefault((int(self.orbits[self.cls_group[c]]), int(pos_in_group[c])), len(keys))
        self.SV = len(keys)
        self.svar_rep = np.array([int(np.argmax(self.svar == v)) for v in range(self.SV)])  # a class per shard variable
        self.orbit_groups = [np.nonzero(self.orbits == o)[0] for o in range(self.NV)]
        self.with_memory = memory
        self.forms = PathForms(self.coef, self.cls, workload.block_size, workload.seq_len)
        self.box_lo = np.ones(k)
        self.box_hi = np.full(k, float(self.nb - (k - 1)))
        self._schedule = pass_schedule(self.coef)
        self._cut_forms: list[tuple] = []
        self._linear_rows: dict = {}  # every row -> its LinearRow, handed to HiGHS as numbers (planner/lp.py)
        self._mem_rows: set[tuple[int, int]] = set()
        self._memory: MemoryRows | None = None
        self._build()
        self._solver = None
        # changes since the last solve, handed to the persistent solver at the next (planner/lp.py)
        self._unsent: list = []  # rows
        self._moved: dict = {}  # variables whose bounds changed
        self._params_changed = False

    # ------------------------------------------------------------------ the model

    def _build(self) -> None:
        pyo, k, C = self.pyo, self.k, self.C
        B = self.workload.block_size
        m = pyo.ConcreteModel(name="hexiseq_layout")
        self.m = m
        m.n = pyo.Var(
            range(self.NV), bounds=(1.0, float(self.nb - (k - 1))), initialize=self.nb / k
        )  # blocks per group of the orbit
        m.s = pyo.Var(range(self.SV), bounds=(0.0, float(self.workload.seq_len)), initialize=0.0)  # tokens per member
        passes = [st for st in self._schedule if isinstance(st, Pass)]
        self.pass_names = [st.name for st in passes]
        m.D = pyo.Var(self.pass_names, bounds=(0.0, None))  # ms
        const = sum(st.count * st.seconds for st in self._schedule if isinstance(st, Barrier)) + float(
            self.coef.optimizer.max()
        )
        m.T = pyo.Var(bounds=(0.0, None))
        # the objective is T; bound tightening turns its weights to ±1 on one chunk variable instead
        # (parameters: the persistent solver keeps its model, planner/lp.py)
        m.w_T = pyo.Param(mutable=True, initialize=1.0)
        m.w_n = pyo.Param(range(self.NV), mutable=True, initialize=0.0)
        m.obj = pyo.Objective(expr=m.w_T * m.T + sum(m.w_n[o] * m.n[o] for o in range(self.NV)), sense=pyo.minimize)
        m.total = pyo.ConstraintList()  # T ≥ the passes and barriers (one row)
        total = [(m.T, -1.0)] + [(m.D[st.name], float(st.count)) for st in passes]
        self._add_row(m.total, MS * const, total, None, 0.0)
        m.cover = pyo.ConstraintList()  # the chunks cover the sequence (one row)
        cover = [(m.n[o], float(len(self.orbit_groups[o]))) for o in range(self.NV)]
        self._add_row(m.cover, 0.0, cover, float(self.nb), float(self.nb))
        m.shards = pyo.ConstraintList()
        for o in range(self.NV):
            g = int(self.orbit_groups[o][0])
            terms = [(m.s[int(self.svar[c])], float(self.members[c])) for c in range(C) if self.cls_group[c] == g]
            self._add_row(m.shards, 0.0, terms + [(m.n[o], -2.0 * B)], 0.0, 0.0)
        # a pass is never shorter than its collective and the slowdown it causes on any rank
        # (simulate._pass: chain_r + max(0, c - window_r) + slowdown_r·c ≥ c·(1 + slowdown_r))
        slow = float(np.max(self.coef.slowdown)) if len(self.coef.slowdown) else 0.0
        for st in passes:
            if st.collective_s > 0:
                m.D[st.name].setlb(MS * st.collective_s * (1.0 + slow))
        m.cuts = pyo.ConstraintList()
        m.mem = pyo.ConstraintList()
        if self.with_memory:
            for v in range(self.SV):
                const, terms, cap = self.memory_rows.row(int(self.svar_rep[v]))
                self._add_row(m.mem, const, terms, None, cap)

    def _add_row(self, rows, const: float, terms: list, lower: float | None, upper: float | None):
        """Add lower ≤ const + Σ coefficient·variable over `terms` ((variable, coefficient), ...; a
        variable may repeat) ≤ upper to the constraint list `rows` as a Pyomo expression, with its
        numbers registered for the solver (planner/lp.py); returns the constraint."""
        from pyomo.core.expr.numeric_expr import LinearExpression

        merged: dict[int, list] = {}  # by id: Pyomo's scalar components are not hashable
        for v, a in terms:
            merged.setdefault(id(v), [v, 0.0])[1] += float(a)
        variables, coefs = [v for v, _ in merged.values()], [a for _, a in merged.values()]
        body = LinearExpression(constant=float(const), linear_coefs=coefs, linear_vars=variables)
        con = rows.add((lower, body, upper))
        self._linear_rows[con] = LinearRow(
            variables,
            coefs,
            -math.inf if lower is None else lower - float(const),
            math.inf if upper is None else upper - float(const),
        )
        return con

    # ------------------------------------------------------------------ cuts

    def _add_cut(self, name: str, items: list[PathItem], n0: np.ndarray, s0: np.ndarray) -> float:
        """Add D_name >= the path's length, a linear form of (n, s) that under-estimates it (exact at a
        plan); returns how far the solution (n0, s0) violates it (ms; > 0: the cut makes progress)."""
        f = self.forms.path(items, n0, self.box_lo, self.box_hi)
        cn = np.bincount(self.nvar, f.n, minlength=self.NV)
        cs = np.bincount(self.svar, f.s, minlength=self.SV)
        self._add_form(name, MS * f.const, MS * cn, MS * cs)
        D = self.m.D[name].value
        return MS * (f.const + float(f.n @ n0) + float(f.s @ s0)) - (D if D is not None else 0.0)

    def _add_form(self, name: str, const: float, cn: np.ndarray, cs: np.ndarray) -> None:
        """D_name >= const + cn·n + cs·s (ms), kept so that a sub-box's model can start from it."""
        m = self.m
        terms = [(m.n[int(o)], cn[o]) for o in np.nonzero(cn)[0]] + [(m.s[int(v)], cs[v]) for v in np.nonzero(cs)[0]]
        self._register(self._add_row(m.cuts, const, terms + [(m.D[name], -1.0)], None, 0.0))
        self._cut_forms.append((name, const, cn, cs))

    def child(self, var: int, lo: float | None = None, hi: float | None = None) -> LayoutModel:
        """The same model on a sub-box (chunk variable `var` at least `lo` / at most `hi` blocks): it
        starts with every cut and memory row of this one, all valid in the sub-box."""
        sub = LayoutModel(
            self.cluster,
            self.model,
            self.workload,
            self.layout,
            self.options,
            memory=self.with_memory,
            orbits=self.orbits if self.periodic else None,
            _coef=self.coef,
            _cls=self.cls,
        )
        lo_b, hi_b = self.box_lo.copy(), self.box_hi.copy()
        gs = self.orbit_groups[var]
        if lo is not None:
            lo_b[gs] = np.maximum(lo_b[gs], lo)
        if hi is not None:
            hi_b[gs] = np.minimum(hi_b[gs], hi)
        sub.set_box(lo_b, hi_b)
        for form in self._cut_forms:
            sub._add_form(*form)
        for c, j in sorted(self._mem_rows):
            sub._add_kv_row(c, j)
        return sub

    # ------------------------------------------------------------------ memory

    @property
    def memory_rows(self) -> MemoryRows:
        """The memory rows of this model's variables (planner/memory_rows.py), made on first use."""
        if self._memory is None:
            self._memory = MemoryRows(
                self.model, self.workload, self.options, self.coef, self.rep, self.svar, self.nvar, self.m.n, self.m.s
            )
        return self._memory

    def _add_kv_row(self, c: int, j: int) -> None:
        """Class c's memory with round j's double-buffered K/V receive pieces ≤ its capacity (lazy)."""
        self._mem_rows.add((c, j))
        const, terms, cap = self.memory_rows.kv_row(c, j)
        self._register(self._add_row(self.m.mem, const, terms, None, cap))

    def _register(self, con) -> None:
        """Keep a row added after the first solve for the persistent solver, which does not rescan
        the model for new rows (planner/lp.py); `solve_lp` hands them over in one call."""
        if self._solver is not None:
            self._unsent.append(con)

    def memory_forms(self) -> list[dict]:
        """Per class, its memory as numbers (MemoryRows.forms; planner.explain.memory_report)."""
        return self.memory_rows.forms()

    def _memory_cuts(self, x_n: np.ndarray, x_s: np.ndarray) -> int:
        """Add the K/V-buffer rows the point violates (MemoryRows.violated); returns how many."""
        if not self.with_memory:
            return 0
        rows = self.memory_rows.violated(x_n, x_s, self._mem_rows)
        for c, j in rows:
            self._add_kv_row(c, j)
        return len(rows)

    # ------------------------------------------------------------------ parameters

    def set_box(self, lo: Sequence[float], hi: Sequence[float]) -> None:
        """Chunk lengths (blocks, per group) every plan of interest lies in: the estimates' box and the
        bounds of n (an orbit takes the hull of its groups' boxes)."""
        lo = np.maximum(np.asarray(lo, dtype=float), 1.0)
        hi = np.minimum(np.asarray(hi, dtype=float), float(self.nb - (self.k - 1)))
        for o, gs in enumerate(self.orbit_groups):
            lo[gs], hi[gs] = lo[gs].min(), hi[gs].max()
            if not self.m.n[o].fixed:
                self.m.n[o].setlb(float(lo[gs[0]]))
                self.m.n[o].setub(float(hi[gs[0]]))
                self._moved[o] = self.m.n[o]
        self.box_lo, self.box_hi = lo, hi

    def fix_blocks(self, blocks: Sequence[float] | None) -> None:
        """Fix the chunk lengths (blocks per group; equal within an orbit) and collapse the box onto
        them; None frees them."""
        self._refix()
        if blocks is None:
            for o in range(self.NV):
                self.m.n[o].unfix()
            return
        b = np.asarray(blocks, dtype=float)
        for o, gs in enumerate(self.orbit_groups):
            if np.ptp(b[gs]) > 0:
                raise HexiSeqError("a model with orbits evaluates symmetric chunk lengths only")
            self.m.n[o].fix(float(b[gs[0]]))
        self.box_lo = self.box_hi = b

    def fix_shards(self, shards: Sequence[float] | None) -> None:
        """Fix the shard of every class (per class; equal across an orbit), or free them (None)."""
        self._refix()
        for v in range(self.SV):
            if shards is None:
                self.m.s[v].unfix()
            else:
                self.m.s[v].fix(float(shards[int(self.svar_rep[v])]))

    def _refix(self) -> None:
        """Fixing or freeing variables changes how the solver holds the rows that use them: after a
        solve, the next one hands the whole model over again."""
        self._solver, self._unsent, self._moved, self._params_changed = None, [], {}, False

    # ------------------------------------------------------------------ solving

    def point(self) -> tuple[np.ndarray, np.ndarray]:
        """The current (blocks per group, shard per class) of the model's variables."""
        n = np.array([self.m.n[o].value for o in range(self.NV)], dtype=float)
        sv = np.array([self.m.s[v].value or 0.0 for v in range(self.SV)], dtype=float)
        return n[self.nvar], sv[self.svar]

    def replay(self, n: np.ndarray, s_cls: np.ndarray, trace: bool = True):
        """The replay at a (fractional) point: its critical paths are the cuts, its time says whether
        the LP's solution is evaluated exactly (then the LP's value is the minimum)."""
        d = evaluate(self.coef, s_cls[self.cls], self.workload.block_size * n)
        return simulate_durations(d, trace=trace)

    def changed(self, var=None, key=None, params: bool = False) -> None:
        """Note a change for the persistent solver's next solve: a variable whose bounds moved
        (under `key`), or the mutable parameters (the objective's weights)."""
        if var is not None:
            self._moved[key] = var
        if params:
            self._params_changed = True

    def limit_time(self, best_s: float | None) -> None:
        """Bound the step time by `best_s` and take it out of the objective (`weigh_chunk` puts a
        chunk variable in), for bound tightening; None restores T as the objective, unbounded."""
        m = self.m
        if best_s is None:
            m.T.setub(None)
            m.w_T = 1.0
            for o in range(self.NV):
                m.w_n[o] = 0.0
        else:
            m.T.setub(MS * best_s)
            m.w_T = 0.0
        self.changed(m.T, "T", params=True)

    def weigh_chunk(self, o: int, weight: float) -> None:
        """The objective's weight on chunk variable o (0 unless a bound tightening asks for ±1)."""
        self.m.w_n[o] = weight
        self.changed(params=True)

    def solve_lp(self) -> tuple[str, float | None]:
        """Solve the LP as it stands on the persistent solver: (status, optimum in ms or None)."""
        from .lp import QuietHighs  # the solver interface is imported when a model is first solved
        from .lp import TerminationCondition as TC

        if self._solver is None:
            self._solver = QuietHighs(linear_rows=self._linear_rows)
        try:
            self._solver.sync(self._unsent, list(self._moved.values()), self._params_changed)
            self._unsent, self._moved, self._params_changed = [], {}, False
            res = self._solver.solve(self.m)
        except Exception as e:  # noqa: BLE001 - a solver failure is a status, not a traceback
            return f"error: {e}", None
        tc = res.termination_condition
        if tc in (TC.infeasible, TC.infeasibleOrUnbounded):
            return "infeasible", None
        if tc != TC.optimal or res.best_feasible_objective is None:
            return str(tc).split(".")[-1], None
        res.solution_loader.load_vars()
        return "optimal", float(res.best_feasible_objective)

    def solve(self, max_rounds: int = MAX_CUT_ROUNDS, stop_at: float | None = None) -> Solution:
        """The cutting-plane loop (module doc): every LP optimum is a valid bound; stop when the replay
        at the solution matches it (to CUT_TOL), when no critical path's cut is violated there (the
        relaxation's minimum), after `max_rounds` (status "work limit"), or as soon as the bound
        reaches `stop_at` seconds (status "above": the search needs no more of this model than
        that no plan of it beats `stop_at`). The first cuts are taken at the box's centre with even
        shards (fixed variables at their values)."""
        k = self.k
        B = self.workload.block_size
        fixed_n, fixed_s = self.point()
        n0 = np.where([self.m.n[o].fixed for o in self.nvar], fixed_n, 0.5 * (self.box_lo + self.box_hi))
        if not self.m.n[0].fixed:
            n0 *= self.nb / n0.sum()
        per_group = np.bincount(self.cls_group, weights=self.members, minlength=k)
        even = 2.0 * B * n0[self.cls_group] / per_group[self.cls_group]
        s0 = np.where([self.m.s[v].fixed for v in self.svar], fixed_s, even)
        sim = self.replay(n0, s0)
        for name in self.pass_names:
            self._add_cut(name, sim.paths[name], n0, s0)
        bound, replay_s, status, rounds = math.inf, math.inf, "work limit", 0
        for rounds in range(1, max_rounds + 1):
            st, obj = self.solve_lp()
            if obj is None:
                return Solution(st, math.inf, rounds=rounds)
            bound = obj / MS
            n0, s0 = self.point()
            if stop_at is not None and bound >= stop_at:
                status = "above"
                break
            if self._memory_cuts(n0, s0):
                continue
            sim = self.replay(n0, s0)
            replay_s = sim.iteration_time_s
            if replay_s <= bound * (1 + CUT_TOL):
                status = "optimal"  # the LP's solution is evaluated exactly: its value is the minimum
                break
            added = 0
            for name in self.pass_names:
                D_lp = self.m.D[name].value
                if MS * sim.passes[name][1] > D_lp * (1 + CUT_TOL):
                    if self._add_cut(name, sim.paths[name], n0, s0) > CUT_TOL * max(1.0, D_lp):  # violated: progress
                        added += 1
            if not added:
                status = "stalled"  # the cuts of the critical paths hold at the solution: the relaxation's minimum
                break
        return Solution(status, bound, replay_s, list(n0), list(s0), rounds)

    def tighten_box(self, best_s: float) -> bool:
        """Optimality-based bound tightening of the box (planner/box.py); True when it shrank."""
        return tighten_box(self, best_s)

    def write(self, path: str) -> None:
        """Export the model with its current cuts (.lp or .mps, by the file name)."""
        self.m.write(path, io_options={"symbolic_solver_labels": True})

    # ------------------------------------------------------------------ bounds and plans

    def box_from_bound(self, best_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Chunk lengths (blocks) no plan of this layout with a step time ≤ `best_s` can leave
        (planner/box.py)."""
        return box_from_bound(
            self.coef, self._schedule, self.workload.seq_len, self.workload.block_size, self.nb, best_s
        )

    def best_plan(self, blocks: Sequence[int]) -> tuple[Plan | None, float]:
        """The fastest plan of this layout with these chunk blocks: a model of its own (the chunks fixed,
        so its cuts are exact) picks the shards under the memory limits; (None, inf) when nothing fits.
        Its value is the replayed time of the plan with continuous shards; the returned plan has them
        rounded to whole tokens."""
        if self.periodic:  # the rounded blocks need not be periodic: choose the shards on the full structure
            sub = LayoutModel(self.cluster, self.model, self.workload, self.layout, self.options)
        else:
            sub = LayoutModel(
                self.cluster, self.model, self.workload, self.layout, self.options, _coef=self.coef, _cls=self.cls
            )
        sub.fix_blocks(list(blocks))  # a collapsed box: exact cuts
        sol = sub.solve()
        if not sol.ok:
            return None, math.inf
        return self.to_plan(blocks, sol.shards), sol.bound_s

    def judge(self, blocks: Sequence[int], shards: Sequence[float]) -> tuple[float, bool] | None:
        """(replayed step time, fits in memory) of to_plan(blocks, shards) from this layout's
        coefficients; None when the plan would leave a rank out (planner/integer_plans.py)."""
        return judge(self.coef, self.layout, self.cls, blocks, shards, self.model, self.workload, self.options)

    def to_plan(self, blocks: Sequence[int], shards: Sequence[float], name: str = "hexiseq") -> Plan:
        """The plan of integer chunk blocks and per-class shards, whole tokens inside each group
        (planner/integer_plans.py)."""
        return plan_of(self.layout, self.cls, blocks, shards, self.cluster, self.model, self.workload, name)
