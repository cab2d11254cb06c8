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
collective hides behind count against the time): McCormick's planes over the box lo ≤ n ≤ hi (the
one tight at the current point), the tangent of L_g² at the current point, its secant over the box.
The box comes from the best step time known (`box_from_bound`): no plan with a larger time can
have a chunk outside it, so the bound holds for every plan (min(bound, best time)). Collapsing the
box onto a plan makes every estimate exact.

Memory: memory.py's terms are linear in (s, w = η·L, u = κ·L); the K/V receive buffers of every
round are added when a solution violates them.

Scaling: times in milliseconds, chunk lengths in blocks, memory in GiB (HiGHS drops matrix entries
below 1e-9).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..costmodel.arrays import plan_arrays
from ..costmodel.durations import Coefficients, coefficients, evaluate
from ..costmodel.kernels import CostOptions
from ..costmodel.memory import kv_double_buffer, memory_bytes, memory_terms
from ..costmodel.paths import (
    AllToAllPiece,
    AttentionRound,
    BackwardTransfer,
    Barrier,
    Constant,
    ExposedCollective,
    ForwardTransfer,
    OverlapSlowdown,
    OwnWork,
    Pass,
    PathItem,
)
from ..costmodel.simulate import pass_schedule, simulate_durations
from ..errors import HexiSeqError
from ..plan import Group, Plan
from ..rounding import largest_remainder
from ..specs import GIB, ClusterSpec, ModelSpec, Workload

MS = 1e3  # the model's time unit is the millisecond
MAX_CUT_ROUNDS = 80  # cutting-plane rounds per solve (a work limit: the bound stays valid when it binds)
CUT_TOL = 1e-7  # relative: stop when the replay at the LP's solution is this close to the LP value


@dataclass(frozen=True)
class Layout:
    """The structure a model is built for: groups (device indices, ring order) and heads per device."""

    groups: tuple[tuple[int, ...], ...]
    heads: tuple[tuple[int, ...], ...]

    @property
    def k(self) -> int:
        return len(self.groups)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for g in self.groups for d in g)


def unit_plan(layout: Layout, model: ModelSpec) -> Plan:
    """A valid plan of this layout with unit-free sizes (chunk_len = group size, 2 tokens per rank,
    block 1): the exchange schedule and the coefficients do not depend on the sizes."""
    groups = tuple(Group(devs, len(devs), (2,) * len(devs), heads) for devs, heads in zip(layout.groups, layout.heads))
    return Plan(sum(2 * len(d) for d in layout.groups), model.heads, model.kv_heads, groups, 1, "unit")


def rank_classes(cluster: ClusterSpec, layout: Layout, aggregate: bool = True) -> np.ndarray:
    """[R] class of every rank: identical members of a group (type, node, NIC, link, heads) share one
    (every rank its own without `aggregate`)."""
    keys: dict[tuple, int] = {}
    out = []
    for g, (devs, heads) in enumerate(zip(layout.groups, layout.heads)):
        for d, h in zip(devs, heads):
            dev = cluster.devices[d]
            key = (g, dev.gpu.name, dev.node, dev.nic_gbps, dev.link_bandwidth_gbps, h) if aggregate else (d,)
            out.append(keys.setdefault(key, len(keys)))
    return np.array(out, dtype=np.int64)


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
        return self.status in ("optimal", "stalled", "work limit") and math.isfinite(self.bound_s)


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
        pr = self.coef.peer_r
        self._peers = [np.nonzero(pr == r)[0] for r in range(a.R)]
        self.box_lo = np.ones(k)
        self.box_hi = np.full(k, float(self.nb - (k - 1)))
        self._schedule = pass_schedule(self.coef)
        self._cut_forms: list[tuple] = []
        self._mem_rows: set[tuple[int, int]] = set()
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
        m.total = pyo.Constraint(expr=m.T >= sum(st.count * m.D[st.name] for st in passes) + MS * const)
        m.cover = pyo.Constraint(
            expr=sum(float(len(self.orbit_groups[o])) * m.n[o] for o in range(self.NV)) == float(self.nb)
        )
        m.shards = pyo.ConstraintList()
        for o in range(self.NV):
            g = int(self.orbit_groups[o][0])
            cs = [c for c in range(C) if self.cls_group[c] == g]
            m.shards.add(sum(float(self.members[c]) * m.s[int(self.svar[c])] for c in cs) == 2.0 * B * m.n[o])
        # a pass is never shorter than its collective and the slowdown it causes on any rank
        # (simulate._pass: chain_r + max(0, c - window_r) + slowdown_r·c ≥ c·(1 + slowdown_r))
        slow = float(np.max(self.coef.slowdown)) if len(self.coef.slowdown) else 0.0
        for st in passes:
            if st.collective_s > 0:
                m.D[st.name].setlb(MS * st.collective_s * (1.0 + slow))
        m.cuts = pyo.ConstraintList()
        m.mem = pyo.ConstraintList()
        if self.with_memory:
            self._memory_terms()
            for v in range(self.SV):
                m.mem.add(self._memory_expr(int(self.svar_rep[v])) <= self._capacity(int(self.svar_rep[v])))

    # ------------------------------------------------------------------ linear forms of the durations

    def _L(self, g: int):
        return self.workload.block_size * self.m.n[int(self.nvar[g])]

    # A linear form of (n, s) is kept as (const, coef_n [k], coef_s [C]) in seconds, tokens and
    # blocks while a cut is assembled (numpy, fast), and becomes one Pyomo LinearExpression at the end.

    def _prod(self, f: _Form, scale: float, g: int, h: int, over: bool, n0: np.ndarray) -> None:
        """f += scale × an under- (or over-) estimate of L_g·L_h (tokens²) linear in n, tight at n0
        where it can be: McCormick's plane of the box, the tangent (under) or secant (over) of L_g²."""
        B2 = float(self.workload.block_size) ** 2
        lo, hi = self.box_lo, self.box_hi
        if g == h:
            if over:
                f.n[g] += scale * B2 * (lo[g] + hi[g])
                f.const -= scale * B2 * lo[g] * hi[g]
            else:
                x = float(n0[g])
                f.n[g] += scale * B2 * 2 * x
                f.const -= scale * B2 * x * x
            return
        planes = [(hi[g], lo[h]), (lo[g], hi[h])] if over else [(lo[g], lo[h]), (hi[g], hi[h])]
        vals = [a_ * n0[h] + b_ * n0[g] - a_ * b_ for a_, b_ in planes]
        a_, b_ = planes[int(np.argmin(vals) if over else np.argmax(vals))]
        f.n[h] += scale * B2 * a_
        f.n[g] += scale * B2 * b_
        f.const -= scale * B2 * a_ * b_

    def _item(self, f: _Form, it: PathItem) -> None:
        """f += the linear form (seconds) of one path item of simulate.py (attention: `_attention_sum`)."""
        c, B = self.coef, float(self.workload.block_size)
        match it:
            case Constant(seconds):
                f.const += seconds
            case ExposedCollective(chain, r, comm):
                f.const += comm
                self._window(f, -1.0, chain, int(r))
            case OwnWork(part, r):
                f.s[self.cls[r]] += getattr(c, part)[r]
            case AllToAllPiece(direction, r, piece):
                f.const += c.a2a_lat[r]
                if (direction == "in") == (piece == 0):  # in: piece 0 is the own send; out: piece 1 is the own recv
                    f.s[self.cls[r]] += c.in_send[r] if direction == "in" else c.out_recv[r]
                else:
                    sel = self._peers[r]
                    coef = (c.in_recv if direction == "in" else c.out_send)[sel]
                    np.add.at(f.s, self.cls[c.peer_q[sel]], coef)
            case OverlapSlowdown(r, j, backward):
                g, h = int(c.a.grp[r]), int(c.pair_src[r, j])
                rc, sc = c.x_recv[r, j] * B, c.x_send[r, j] * B  # per block of L_h, of L_g
                both = 2.0 if backward else 1.0  # backward: K/V in and dK/dV back
                f.n[h] += both * c.slowdown[r] * rc
                f.n[g] += both * c.slowdown[r] * sc
            case ForwardTransfer(r, j, piece):
                f.const += c.x_lat[r, j]
                if piece == 0:
                    f.n[int(c.pair_src[r, j])] += c.x_recv[r, j] * B
                else:
                    f.n[int(c.a.grp[r])] += c.x_send[r, j] * B
            case BackwardTransfer(r, j):
                f.const += 2 * c.x_lat[r, j]
                f.n[int(c.pair_src[r, j])] += c.x_recv[r, j] * B
                f.n[int(c.a.grp[r])] += c.x_send[r, j] * B
            case _:  # pragma: no cover - a new item kind needs its linear form here
                raise HexiSeqError(f"the model has no linear form for path item {it!r}")

    def _attention_sum(self, f: _Form, scale: float, r: int, rounds: set, n0: np.ndarray) -> None:
        """f += scale × Σ_{j in rounds} of rank r's forward attention, as tight as linear forms allow:
        the products of all rounds sum to L_g·S/2 exactly (the chunks cover the sequence), so a complete
        set is exact, and a set missing few rounds is the total minus over-estimates of the rest."""
        c, g, k, B = self.coef, int(self.coef.a.grp[r]), self.k, float(self.workload.block_size)
        f.n[g] += scale * B * sum(c.att_lin[r, j] for j in rounds)
        ap = scale * c.att_prod[r, 0]
        missing = [j for j in range(k) if j not in rounds]
        if len(missing) < len(rounds):
            f.n[g] += ap * B * (self.workload.seq_len / 2.0)  # Σ_h L_g·L_h = L_g·S/2
            for j in missing:
                self._prod(f, -ap, g, int(c.pair_src[r, j]), True, n0)
        else:
            for j in rounds:
                self._prod(f, ap, g, int(c.pair_src[r, j]), False, n0)

    def _window(self, f: _Form, scale: float, kind: str, r: int) -> None:
        """f += scale × a rank's compute window (exact: it sums every round's attention)."""
        c, cl = self.coef, self.cls[r]
        if kind == "h":
            f.s[cl] += scale * (2.0 / 3.0) * c.head[r]
            return
        again = c.rule.backward_factors()
        fwd, att = (c.pre_f[r] + c.post_f[r]), 1.0
        if kind == "b":
            f.s[cl] += scale * ((c.pre_b[r] + c.post_b[r]) + again.replay_layer * fwd)
            att = again.attention(c.attn_bwd_factor)
        else:
            f.s[cl] += scale * fwd
        self._attention_sum(f, scale * att, r, set(range(self.k)), np.zeros(self.k))

    def _add_cut(self, name: str, items: list, n0: np.ndarray, s0: np.ndarray) -> float:
        """Add D_name >= the path's length, a linear form of (n, s) that under-estimates it (exact at a
        plan); returns how far the solution (n0, s0) violates it (ms; > 0: the cut makes progress)."""
        f = _Form(self.k, self.C)
        att: dict[tuple[bool, int], set] = {}
        for it in items:
            if isinstance(it, AttentionRound):
                att.setdefault((it.backward, int(it.rank)), set()).add(int(it.round))
            else:
                self._item(f, it)
        for (backward, r), rounds in att.items():
            self._attention_sum(f, self.coef.attn_bwd_factor if backward else 1.0, r, rounds, n0)
        cn = np.bincount(self.nvar, f.n, minlength=self.NV)
        cs = np.bincount(self.svar, f.s, minlength=self.SV)
        self._add_form(name, MS * f.const, MS * cn, MS * cs)
        D = self.m.D[name].value
        return MS * (f.const + float(f.n @ n0) + float(f.s @ s0)) - (D if D is not None else 0.0)

    def _add_form(self, name: str, const: float, cn: np.ndarray, cs: np.ndarray) -> None:
        """D_name >= const + cn·n + cs·s (ms), kept so that a sub-box's model can start from it."""
        from pyomo.core.expr.numeric_expr import LinearExpression

        m = self.m
        nz_n, nz_s = np.nonzero(cn)[0], np.nonzero(cs)[0]
        expr = LinearExpression(
            constant=float(const),
            linear_coefs=[float(cn[o]) for o in nz_n] + [float(cs[v]) for v in nz_s] + [-1.0],
            linear_vars=[m.n[int(o)] for o in nz_n] + [m.s[int(v)] for v in nz_s] + [m.D[name]],
        )
        self._register(m.cuts.add(expr <= 0.0))
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

    def _memory_terms(self) -> None:
        terms = memory_terms(self.model, self.workload, self.coef.a.R, options=self.options)
        self._mem_const = sum(t.const for t in terms.values())
        self._mem_s, self._mem_w, self._mem_u = (
            sum(getattr(t, f) for t in terms.values()) for f in ("c_s", "c_w", "c_u")
        )

    def _capacity(self, c: int) -> float:
        r = self.rep[c]
        return float(self.coef.a.capacity[r]) * (1.0 - self.options.reserved_fraction) / GIB

    def _memory_expr(self, c: int, extra=0.0):
        """GiB of class c, all but the K/V receive buffers (plus `extra` bytes)."""
        m, r = self.m, self.rep[c]
        a = self.coef.a
        g = int(a.grp[r])
        s, L = m.s[int(self.svar[c])], self._L(g)
        per_n = float(self._mem_w * a.eta[r] + self._mem_u * a.kvc[r])
        expr = float(self._mem_const) + float(self._mem_s) * s + per_n * L
        return (expr + extra) / GIB

    def _add_kv_row(self, c: int, j: int) -> None:
        """Class c's memory with round j's double-buffered K/V receive pieces ≤ its capacity:
        2·(B_j + B_{j+1}), B_j = bytes received in round j (memory.py)."""
        (a, h1), (b, h2) = self._kv_buffer_terms(c, j)
        piece = a * self.m.n[int(self.nvar[h1])]
        if j + 1 < self.k:
            piece = piece + b * self.m.n[int(self.nvar[h2])]
        self._mem_rows.add((c, j))
        self._register(self.m.mem.add(self._memory_expr(c, piece) <= self._capacity(c)))

    def _kv_buffer_terms(self, c: int, j: int) -> tuple[tuple[float, int], tuple[float, int]]:
        """Class c's K/V receive buffers while round j runs as a linear form of the chunk blocks:
        (a, source group of round j), (b, source group of round j+1; b = 0 in the last round), the
        buffers a·n_h1 + b·n_h2 bytes (memory.kv_double_buffer of the rounds' bytes per block)."""
        cf, r, k, B = self.coef, self.rep[c], self.k, float(self.workload.block_size)
        this = float(cf.x_recv_bytes[r, j]) * B
        nxt = float(cf.x_recv_bytes[r, j + 1]) * B if j + 1 < k else 0.0
        a, b = kv_double_buffer(np.array([this, 0.0]), np.array([0.0, nxt]))
        return (float(a), int(cf.pair_src[r, j])), (float(b), int(cf.pair_src[r, j + 1]) if j + 1 < k else 0)

    def _register(self, con) -> None:
        """Keep a row added after the first solve for the persistent solver, which does not rescan
        the model for new rows (planner/lp.py); `_lp` hands them over in one call."""
        if self._solver is not None:
            self._unsent.append(con)

    def memory_forms(self) -> list[dict]:
        """Per class, its memory as numbers (bytes): const (states, the reserve), per token of its
        shard ("s"), per block of its group's chunk ("n"), and the K/V-buffer pieces
        (a, source group, b, next source group): 2·(B_j + B_{j+1}) = a·n_h1 + b·n_h2. Used by
        planner.explain.memory_report."""
        if not hasattr(self, "_mem_const"):
            self._memory_terms()
        cf, B, k = self.coef, float(self.workload.block_size), self.k
        out = []
        for c in range(self.C):
            r = self.rep[c]
            per_s = self._mem_s
            kv = []
            for j in range(1, k):
                (a, h1), (b, h2) = self._kv_buffer_terms(c, j)
                kv.append((a, h1, b, h2))
            out.append(
                {
                    "group": int(cf.a.grp[r]),
                    "const": self._mem_const + self.options.reserved_fraction * float(cf.a.capacity[r]),
                    "s": per_s,
                    "n": B * (self._mem_w * cf.a.eta[r] + self._mem_u * cf.a.kvc[r]),
                    "kv": kv,
                    "capacity": float(cf.a.capacity[r]),
                }
            )
        return out

    def _memory_cuts(self, x_n: np.ndarray, x_s: np.ndarray) -> int:
        """Add, per class, the row of its most violated K/V-buffer round not yet in the model (lazy:
        the rows of the other rounds are added if a later solution violates them); returns how many
        were added."""
        if not self.with_memory or self.k <= 1:
            return 0
        cf, B = self.coef, self.workload.block_size
        L = B * x_n
        reps = self.rep
        rb = cf.x_recv_bytes[reps] * L[cf.pair_src[reps]]  # [C, k] bytes received per round
        piece = kv_double_buffer(rb, np.concatenate([rb[:, 1:], np.zeros((len(reps), 1))], axis=1))
        piece[:, 0] = -np.inf  # round 0 receives nothing
        a = cf.a
        base = (
            self._mem_const
            + self._mem_s * np.asarray(x_s)
            + (self._mem_w * a.eta[reps] + self._mem_u * a.kvc[reps]) * L[a.grp[reps]]
        )
        cap = np.array([self._capacity(c) for c in range(self.C)])
        over = (base[:, None] + piece) / GIB > cap[:, None] * (1 + 1e-9)
        added = 0
        for c in np.nonzero(over.any(axis=1))[0]:
            for j in np.argsort(-piece[c], kind="stable"):
                if not over[c, j]:
                    break
                if (int(c), int(j)) not in self._mem_rows:
                    self._add_kv_row(int(c), int(j))
                    added += 1
                    break
        return added

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

    def _lp(self):
        from .lp import QuietHighs
        from .lp import TerminationCondition as TC

        if self._solver is None:
            self._solver = QuietHighs()
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

    def solve(self, max_rounds: int = MAX_CUT_ROUNDS) -> Solution:
        """The cutting-plane loop (module doc): every LP optimum is a valid bound; stop when the replay
        at the solution matches it (to CUT_TOL), when no critical path's cut is violated there (the
        relaxation's minimum), or after `max_rounds` (status "work limit"). The first cuts are taken
        at the box's centre with even shards (fixed variables at their values)."""
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
            st, obj = self._lp()
            if obj is None:
                return Solution(st, math.inf, rounds=rounds)
            bound = obj / MS
            n0, s0 = self.point()
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
        """Optimality-based bound tightening: the least and the largest chunk length of every variable
        over the model's constraints with T ≤ best_s, rounded inwards to whole blocks. Every plan at
        least as fast as `best_s` satisfies all of them (its cuts hold in the current box), so the new
        box keeps every such plan, and its
        McCormick planes are tighter; an empty box proves that no plan of the layout reaches
        `best_s` (the rounding makes this an argument about integer plans, stronger than the LP's).
        True when the box shrank."""
        m = self.m
        if any(m.n[o].fixed for o in range(self.NV)):
            return False
        m.T.setub(MS * best_s)
        m.w_T = 0.0
        self._moved["T"], self._params_changed = m.T, True
        lo, hi = self.box_lo.copy(), self.box_hi.copy()
        try:
            for o, gs in enumerate(self.orbit_groups):
                for sign, target in ((1.0, lo), (-1.0, hi)):
                    m.w_n[o] = sign
                    self._params_changed = True
                    st, val = self._lp()
                    m.w_n[o] = 0.0
                    if val is None:  # no plan at least this fast in the box
                        self.box_lo, self.box_hi = np.ones(self.k), np.zeros(self.k)
                        return True
                    v = sign * float(val)
                    target[gs] = np.ceil(v - 1e-6) if sign > 0 else np.floor(v + 1e-6)  # chunk lengths are whole blocks
        finally:
            m.T.setub(None)
            m.w_T = 1.0
            for o in range(self.NV):
                m.w_n[o] = 0.0
            self._moved["T"], self._params_changed = m.T, True
        shrank = bool(np.any(lo > self.box_lo + 0.5) or np.any(hi < self.box_hi - 0.5))
        if np.any(lo > hi):
            self.box_lo, self.box_hi = lo, hi
            return True
        self.set_box(lo, hi)
        return shrank

    def write(self, path: str) -> None:
        """Export the model with its current cuts (.lp or .mps, by the file name)."""
        self.m.write(path, io_options={"symbolic_solver_labels": True})

    # ------------------------------------------------------------------ bounds and plans

    def box_from_bound(self, best_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Chunk lengths (blocks) no plan of this layout with a step time ≤ `best_s` can leave: each
        rank's own work is at least α_r·L_g + β_r·s_r plus the exposed collectives and the optimizer
        (durations.py's forms summed over the passes; waits, transfers and all-to-alls only add), and
        the group's shards cover 2·L_g, so L_g ≤ U·Σ_r 1/β_r / (2 + Σ_r α_r/β_r) and ≤ U/α_r."""
        cf, a, B = self.coef, self.coef.a, self.workload.block_size
        sched = self._schedule
        passes = [st for st in sched if isinstance(st, Pass)]
        n_f = sum(st.count for st in passes if st.chain == "f")
        n_b = sum(st.count for st in passes if st.chain == "b")
        n_h = sum(st.count for st in passes if st.chain == "h")
        const = sum(st.count * st.seconds for st in sched if isinstance(st, Barrier)) + float(cf.optimizer.max())
        U = best_s - const
        # forward attention of a rank per unit L_g: Σ_j att_prod·L_h (Σ_h L_h = S/2) + Σ_j att_lin
        att = cf.att_prod[:, 0] * (self.workload.seq_len / 2.0) + cf.att_lin.sum(axis=1)
        again = cf.rule.backward_factors()
        alpha = att * (n_f + n_b * again.attention(cf.attn_bwd_factor))
        beta = (cf.pre_f + cf.post_f) * (n_f + n_b * again.replay_layer) + (cf.pre_b + cf.post_b) * n_b + cf.head * n_h
        hi = np.zeros(self.k)
        for g in range(self.k):
            rr = np.nonzero(a.grp == g)[0]
            cap = U * np.sum(1.0 / beta[rr]) / (2.0 + np.sum(alpha[rr] / beta[rr]))
            pos = alpha[rr] > 0
            if pos.any():
                cap = min(cap, float(np.min(U / alpha[rr][pos])))
            hi[g] = max(cap, 0.0) / B
        hi = np.minimum(np.floor(hi + 1e-9), self.nb - (self.k - 1))
        lo = np.maximum(1.0, self.nb - (hi.sum() - hi))
        return lo, hi

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

    def _whole_tokens(self, blocks: Sequence[int], shards: Sequence[float]) -> list[list[int]]:
        """Per group, its ranks' shards rounded to whole tokens summing to 2·blocks·B (largest remainder)."""
        B = self.workload.block_size
        per_rank = np.maximum(np.asarray(shards, dtype=float)[self.cls], 0.0)
        out, r0 = [], 0
        for g, devs in enumerate(self.layout.groups):
            n = len(devs)
            out.append(largest_remainder(list(per_rank[r0 : r0 + n]), 2 * int(blocks[g]) * B))
            r0 += n
        return out

    def judge(self, blocks: Sequence[int], shards: Sequence[float]) -> tuple[float, bool] | None:
        """(replayed step time, fits in memory) of to_plan(blocks, shards), from this layout's
        coefficients (the plan's structure is the layout's: no schedule or coefficients to derive
        again); None when the plan would leave a rank out (its structure differs: estimate it)."""
        ints = self._whole_tokens(blocks, shards)
        if any(t == 0 and h == 0 for tok, heads in zip(ints, self.layout.heads) for t, h in zip(tok, heads)):
            return None
        s = np.array([t for tok in ints for t in tok], dtype=float)
        L = self.workload.block_size * np.asarray(blocks, dtype=float)
        d = evaluate(self.coef, s, L)
        t = simulate_durations(d).iteration_time_s
        a = replace(self.coef.a, s=s, L=L)
        mem = sum(memory_bytes(a, self.model, self.workload, d.recv_bytes, self.options).values())
        return t, bool(np.all(mem <= a.capacity))

    def to_plan(self, blocks: Sequence[int], shards: Sequence[float], name: str = "hexiseq") -> Plan:
        """The plan of integer chunk blocks and per-class shards, rounded to whole tokens inside each
        group (largest remainder); heads as the layout has them. A rank left with neither tokens nor
        heads is left out of the run (it would only wait)."""
        B, layout = self.workload.block_size, self.layout
        groups = []
        for g, (devs, heads, ints) in enumerate(zip(layout.groups, layout.heads, self._whole_tokens(blocks, shards))):
            keep = [i for i in range(len(devs)) if ints[i] > 0 or heads[i] > 0]
            groups.append(
                Group(
                    tuple(devs[i] for i in keep),
                    int(blocks[g]) * B,
                    tuple(ints[i] for i in keep),
                    tuple(heads[i] for i in keep),
                )
            )
        return Plan(
            self.workload.seq_len,
            self.model.heads,
            self.model.kv_heads,
            tuple(groups),
            B,
            name,
            self.cluster.name,
            self.model.name,
        )


class _Form:
    """const + coef_n·n + coef_s·s (seconds; n in blocks, s in tokens) while a cut is assembled."""

    __slots__ = ("const", "n", "s")

    def __init__(self, k: int, C: int):
        self.const = 0.0
        self.n = np.zeros(k)
        self.s = np.zeros(C)
