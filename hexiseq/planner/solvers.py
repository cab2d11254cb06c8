"""A small solver-neutral MILP container and its two back ends.

`LinearProgram` holds variables (bounds, integrality) and sparse rows. It is solved either

- by the embedded HiGHS directly on the sparse matrix (`solver="highs"`, the default): the same
  solver Pyomo would call, minus Pyomo's per-constraint expression walk, which at 128 GPUs costs
  ~0.5 s per model (more than the solve itself) and would dominate the scheduler; or
- through Pyomo (`to_pyomo()`), for any other Pyomo solver by name (`appsi_highs`, `scip_direct`
  with pyscipopt, `cbc`, `glpk`, `gurobi`, ...), and `pyomo_highs` for HiGHS through Pyomo's
  own interface (used by the tests to check both paths agree).

Solver failures become statuses; no solver traceback reaches the user.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from ..errors import HexiSeqError

INF = math.inf


@dataclass
class LinearProgram:
    """min x[objective] subject to row_lo ≤ Σ coef·x ≤ row_hi and variable bounds/integrality."""

    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[dict[int, float], float, float]] = field(default_factory=list)
    objective: int = -1

    def add_var(self, lo: float = 0.0, hi: float = INF, integer: bool = False) -> int:
        self.lo.append(lo)
        self.hi.append(hi)
        self.integer.append(integer)
        return len(self.lo) - 1

    def add_row(self, coefs: dict[int, float], lo: float = -INF, hi: float = INF) -> None:
        self.rows.append(({i: c for i, c in coefs.items() if c != 0.0}, lo, hi))

    @property
    def num_vars(self) -> int:
        return len(self.lo)

    def to_pyomo(self, relax: bool = False):
        """The same model as a Pyomo ConcreteModel (x[i], rows as a ConstraintList, objective min x[obj])."""
        import pyomo.environ as pyo

        m = pyo.ConcreteModel()
        m.x = pyo.Var(range(self.num_vars))
        for i in range(self.num_vars):
            v = m.x[i]
            v.domain = pyo.Integers if (self.integer[i] and not relax) else pyo.Reals
            v.setlb(None if self.lo[i] == -INF else self.lo[i])
            v.setub(None if self.hi[i] == INF else self.hi[i])
        m.c = pyo.ConstraintList()
        for coefs, lo, hi in self.rows:
            e = sum(c * m.x[i] for i, c in coefs.items())
            if lo == hi:
                m.c.add(e == lo)
            else:
                m.c.add((None if lo == -INF else lo, e, None if hi == INF else hi))
        m.obj = pyo.Objective(expr=m.x[self.objective], sense=pyo.minimize)
        return m


@dataclass
class Outcome:
    status: str  # "optimal", "time limit", "infeasible", or another solver word
    objective: float | None  # None when there is no solution
    bound: float | None  # proven lower bound (None when unknown)
    values: list[float] | None


def _quiet_highs():
    """A silent highspy.Highs (its constructor prints a banner on fd 1, which would spoil --json)."""
    import highspy

    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    h.setOptionValue("output_flag", False)
    return h


def _solve_highspy(lp: LinearProgram, time_limit_s: float, rel_gap: float, relax: bool) -> Outcome:
    import highspy
    import numpy as np

    h = _quiet_highs()
    model = highspy.HighsLp()
    n = lp.num_vars
    model.num_col_, model.num_row_ = n, len(lp.rows)
    cost = np.zeros(n)
    cost[lp.objective] = 1.0
    model.col_cost_ = cost
    big = highspy.kHighsInf
    model.col_lower_ = np.array([max(x, -big) for x in lp.lo])
    model.col_upper_ = np.array([min(x, big) for x in lp.hi])
    model.row_lower_ = np.array([max(r[1], -big) for r in lp.rows])
    model.row_upper_ = np.array([min(r[2], big) for r in lp.rows])
    start, index, value = [0], [], []
    for coefs, _, _ in lp.rows:
        index.extend(coefs.keys())
        value.extend(coefs.values())
        start.append(len(index))
    model.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    model.a_matrix_.start_ = np.array(start, dtype=np.int32)
    model.a_matrix_.index_ = np.array(index, dtype=np.int32)
    model.a_matrix_.value_ = np.array(value, dtype=np.float64)
    if not relax and any(lp.integer):
        model.integrality_ = [highspy.HighsVarType.kInteger if x else highspy.HighsVarType.kContinuous for x in lp.integer]
    h.passModel(model)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.setOptionValue("threads", 1)
    if h.run() == highspy.HighsStatus.kError:
        # HiGHS's thread scheduler is process-global: when another HiGHS user in this process (Pyomo's
        # highs interface, e.g. explain.memory_report) started it with its default thread count, a run
        # asking for threads=1 fails without solving. Reset the scheduler and run again.
        highspy.Highs.resetGlobalScheduler(True)
        h.run()
    st = h.getModelStatus()
    S = highspy.HighsModelStatus
    if st in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return Outcome("infeasible", None, None, None)
    info = h.getInfo()
    has = info.primal_solution_status == 2  # feasible point available
    status = {S.kOptimal: "optimal", S.kTimeLimit: "time limit"}.get(st, h.modelStatusToString(st).lower())
    if not has:
        return Outcome(status, None, None, None)
    obj = float(info.objective_function_value)
    mip = not relax and any(lp.integer)
    bound = float(info.mip_dual_bound) if mip else (obj if st == S.kOptimal else None)
    if bound is not None and not math.isfinite(bound):
        bound = None
    return Outcome(status, obj, bound, list(h.getSolution().col_value))


_TIME_OPTION = {"scip": "limits/time", "cbc": "seconds", "glpk": "tmlim", "gurobi": "TimeLimit", "cplex": "timelimit"}
_GAP_OPTION = {"scip": "limits/gap", "cbc": "ratioGap", "gurobi": "MIPGap", "cplex": "mipgap"}


def _solve_pyomo(lp: LinearProgram, solver: str, time_limit_s: float, rel_gap: float, relax: bool) -> Outcome:
    import pyomo.environ as pyo

    m = lp.to_pyomo(relax)
    if solver == "pyomo_highs":
        from pyomo.contrib.solver.common.factory import SolverFactory
        from pyomo.contrib.solver.common.results import TerminationCondition as TC

        try:
            r = SolverFactory("highs").solve(m, time_limit=time_limit_s, rel_gap=rel_gap, load_solutions=False,
                                             raise_exception_on_nonoptimal_result=False)
        except Exception as e:  # noqa: BLE001 - a solver failure is a status, not a traceback
            return Outcome(f"error: {e}", None, None, None)
        if r.termination_condition in (TC.provenInfeasible, TC.locallyInfeasible, TC.infeasibleOrUnbounded):
            return Outcome("infeasible", None, None, None)
        if r.incumbent_objective is None:
            return Outcome(str(r.termination_condition).split(".")[-1], None, None, None)
        r.solution_loader.load_vars()
        ok = r.termination_condition == TC.convergenceCriteriaSatisfied
        b = r.objective_bound if r.objective_bound is not None and math.isfinite(r.objective_bound) else None
        return Outcome("optimal" if ok else "time limit", float(r.incumbent_objective), b, [pyo.value(m.x[i]) for i in range(lp.num_vars)])
    opt = pyo.SolverFactory(solver)
    family = next((f for f in _TIME_OPTION if solver.startswith(f)), None)
    if family:
        opt.options[_TIME_OPTION[family]] = time_limit_s
        if family in _GAP_OPTION:
            opt.options[_GAP_OPTION[family]] = rel_gap
    try:
        r = opt.solve(m, load_solutions=False)
    except Exception as e:  # noqa: BLE001
        return Outcome(f"error: {e}", None, None, None)
    tc = str(r.solver.termination_condition)
    if "infeasible" in tc.lower():
        return Outcome("infeasible", None, None, None)
    if len(r.solution) == 0:
        return Outcome(tc, None, None, None)
    m.solutions.load_from(r)
    try:
        lb = float(r.problem.lower_bound)
        lb = lb if math.isfinite(lb) else None
    except (TypeError, ValueError, AttributeError):
        lb = None
    obj = float(pyo.value(m.obj))
    if relax and lb is None and tc == "optimal":
        lb = obj
    return Outcome("optimal" if tc == "optimal" else tc, obj, lb, [pyo.value(m.x[i]) for i in range(lp.num_vars)])


def solve(lp: LinearProgram, solver: str = "highs", time_limit_s: float = 10.0, rel_gap: float = 2e-3, relax: bool = False) -> Outcome:
    """Solve `lp` (its LP relaxation when `relax`) with the named solver."""
    if solver == "highs":
        return _solve_highspy(lp, time_limit_s, rel_gap, relax)
    return _solve_pyomo(lp, solver, time_limit_s, rel_gap, relax)


def check_solver(name: str) -> None:
    """Raise a clear error when a solver cannot be used here."""
    if name in ("highs", "pyomo_highs"):
        try:
            import highspy  # noqa: F401
        except ImportError:  # pragma: no cover - highspy is a dependency
            raise HexiSeqError("solver 'highs' needs the highspy package (pip install highspy)") from None
        return
    if name.startswith("scip"):
        try:
            import pyscipopt  # noqa: F401
        except ImportError:
            raise HexiSeqError(f"solver {name!r} needs pyscipopt: pip install 'hexiseq[scip]' (or pip install pyscipopt)") from None
    import pyomo.environ as pyo

    try:
        ok = bool(pyo.SolverFactory(name).available(exception_flag=False))
    except Exception:  # noqa: BLE001 - any failure to construct means unusable
        ok = False
    if not ok:
        raise HexiSeqError(f"Pyomo solver {name!r} is not available on this machine; the default 'highs' (embedded) always is")
