"""The persistent LP solver behind every layout model: Pyomo's appsi interface to the embedded HiGHS.

The planner solves hundreds of small LPs per layout, each a few cuts away from the last, so two
costs of the generic interface dominate and are removed here (measured on sim-128, llama2-70b,
512K: 816 LPs, 2.0 s in HiGHS, 2.7 s around it):

- every solve redirects the process's stdout at the file-descriptor level through a reader thread
  (to capture HiGHS's log), although the log is off: here the solve runs without the redirection
  when no log is asked for;
- every solve re-scans the whole model for changes of every kind; the layout model only ever adds
  constraints, changes variable bounds and changes mutable parameters, and hands each change over
  itself (planner/layout_model.py: LayoutModel.solve_lp), so nothing is looked for;
- every new instance (one per layout model) captured the process's stdout at the file-descriptor
  level through reader threads while the model was handed over, to swallow HiGHS's banner; HiGHS
  prints it only when the process's first instance is made, so only that one is captured here
  (measured on sim-128, gpt-70b, 128K: 131 instances, 15 % of the search's time);
- every row handed over is walked as an expression twice (its variables, then its standard
  linear form), about 160 us a row; the layout model writes every row from numbers, so it
  registers each one's (variables, coefficients, bounds) (`linear_rows`) and they go to HiGHS as
  they are (measured on sim-128, gpt-70b, 512K: 15,713 rows handed over, 2.6 s of the plan's 9.1 s
  profiled). A row not registered still takes appsi's path.

One thread, whatever ran before: HiGHS keeps one task scheduler per process, made by the process's
first solve with that solve's `threads` option (its default: 2 on this 2-core machine). A later
solve asking for another count fails before it starts (HighsStatus.kError, model status "not set",
which appsi reports as termination "unknown"). So whether the planner's LPs (threads = 1) were
solved depended on what the process had solved before: a solve with HiGHS's defaults first
(planner/explain.py's memory LP, run by pyomo.contrib.solver when a replica shape cannot fit; any
user code) and every LP of the planner failed, each node of the search was dropped as an "error" and
a baseline won (sim-128, gpt-13b, 1M, global batch 8: 591.154 s in a fresh joint plan, 549.420 s
when a 512K plan ran first). A solve that finds the scheduler made for another count remakes it for
one thread and runs again (the same LP on the same thread count: the same answer); a run that still
fails is an error, never a silently dropped node.
"""

from __future__ import annotations

import numpy as np
from pyomo.contrib.appsi.base import TerminationCondition
from pyomo.contrib.appsi.cmodel import cmodel, cmodel_available
from pyomo.contrib.appsi.solvers import Highs
from pyomo.contrib.appsi.solvers.highs import highspy

from .forms import LinearRow

__all__ = ["QuietHighs", "TerminationCondition"]


class QuietHighs(Highs):
    """appsi's HiGHS with the log off and only the model changes the layout model makes synced."""

    def __init__(self, linear_rows: dict | None = None, **kwargs) -> None:
        kept = getattr(self, "linear_rows", None)  # appsi's _reinit (a new instance) calls __init__ again
        super().__init__(**kwargs)
        self.linear_rows: dict = linear_rows if linear_rows is not None else kept if kept is not None else {}
        self.config.load_solution = False
        self.highs_options = {"threads": 1, "output_flag": False, "solver": "simplex", "presolve": "off"}
        u = self.update_config
        # the layout model hands over the rows it adds, the variables whose bounds it changes (boxes)
        # and its parameters when it changes them (the objective's weights in bound tightening)
        u.check_for_new_or_removed_constraints = False
        u.update_vars = False
        u.update_params = False
        u.check_for_new_or_removed_vars = False
        u.check_for_new_or_removed_params = False
        u.check_for_new_objective = False
        u.update_objective = False
        u.update_constraints = False
        u.update_named_expressions = False

    def sync(self, rows: list, variables: list, params: bool) -> None:
        """Hand over what the model changed since the last solve: rows added, variables whose bounds
        moved, parameters changed. Before the first solve there is nothing to hand over (the solve
        reads the whole model)."""
        if self._model is None:
            return
        if rows:
            self.add_constraints(rows)
        if variables:
            self.update_variables(variables)
        if params:
            self.update_params()

    def update(self, timer=None) -> None:
        """Nothing to look for: `sync` has handed over every change (appsi's update, with every
        check off as here, only makes empty calls)."""

    def add_constraints(self, cons: list) -> None:
        """appsi's add_constraints, with the registered linear rows handed over from their numbers;
        the rows keep their order (runs of registered and other rows alternate as given)."""
        known = [con in self.linear_rows for con in cons]
        start = 0
        for i in range(1, len(cons) + 1):
            if i == len(cons) or known[i] != known[start]:
                (self._add_linear_rows if known[start] else super().add_constraints)(cons[start:i])
                start = i

    def _add_linear_rows(self, cons: list) -> None:
        """The bookkeeping of appsi's add_constraints and Highs._add_constraints for rows known as
        numbers: a fixed variable's term goes into the bound, as appsi does."""
        self._sol = None
        if self._last_results_object is not None:
            self._last_results_object.solution_loader.invalidate()
        new_vars: dict[int, object] = {}
        for con in cons:
            for v in self.linear_rows[con].variables:
                if id(v) not in self._referenced_variables:
                    new_vars.setdefault(id(v), v)
        if new_vars:
            self.add_variables(list(new_vars.values()))
        col = self._pyomo_var_to_solver_var_map
        row = len(self._pyomo_con_to_solver_con_map)
        lowers, uppers, starts, index, values = [], [], [], [], []
        for con in cons:
            if con in self._named_expressions:
                raise ValueError(f"constraint {con.name} has already been added")
            form: LinearRow = self.linear_rows[con]
            self._active_constraints[con] = con.expr
            self._named_expressions[con] = []
            self._vars_referenced_by_con[con] = form.variables
            shift = 0.0
            starts.append(len(values))
            for v, a in zip(form.variables, form.coefs):
                self._referenced_variables[id(v)][0][con] = None
                if v.fixed:
                    shift += a * v.value
                else:
                    index.append(col[id(v)])
                    values.append(a)
            lowers.append(max(form.lower - shift, -highspy.kHighsInf))
            uppers.append(min(form.upper - shift, highspy.kHighsInf))
            self._pyomo_con_to_solver_con_map[con] = row
            self._solver_con_to_pyomo_con_map[row] = con
            row += 1
        self._solver_model.addRows(
            len(uppers),
            np.array(lowers, dtype=np.double),
            np.array(uppers, dtype=np.double),
            len(values),
            np.array(starts),
            np.array(index),
            np.array(values, dtype=np.double),
        )

    _banner_shown = False  # HiGHS prints its banner when the process makes its first instance

    def set_instance(self, model) -> None:
        """appsi's set_instance, without capturing the output once HiGHS's banner is out: the same
        steps (a fresh HiGHS instance, the model's block handed over, its objective)."""
        if not QuietHighs._banner_shown or self.config.stream_solver or self.config.logfile:
            super().set_instance(model)
            QuietHighs._banner_shown = True
            return
        if self._last_results_object is not None:
            self._last_results_object.solution_loader.invalidate()
        self._reinit()
        self._model = model
        if self.use_extensions and cmodel_available:
            self._expr_types = cmodel.PyomoExprTypes()
        self._solver_model = highspy.Highs()
        self._solver_model.setOptionValue("output_flag", False)
        self.add_block(model)
        if self._objective is None:
            self.set_objective(None)

    def _solve(self, timer):
        if self.config.stream_solver or self.config.logfile:
            return super()._solve(timer)
        highs = self._solver_model
        for key, option in self.highs_options.items():
            highs.setOptionValue(key, option)
        timer.start("optimize")
        status = highs.run()
        if status == highspy.HighsStatus.kError and highs.getModelStatus() == highspy.HighsModelStatus.kNotset:
            # the process's scheduler was made for another thread count (module doc): remake it for ours
            highspy.Highs.resetGlobalScheduler(True)
            status = highs.run()
        timer.stop("optimize")
        if status == highspy.HighsStatus.kError and highs.getModelStatus() == highspy.HighsModelStatus.kNotset:
            raise RuntimeError("HiGHS refused to start the solve (HighsStatus.kError, model status not set)")
        return self._postsolve(timer)
