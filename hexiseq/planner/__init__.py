"""The HexiSeq planner: homogeneous baselines, the Pyomo model per grouping, the hierarchical
scheduler and infeasibility explanations.

- `plan_cluster(cluster, model, workload, solver="highs", time_limit_s=None, progress=True) -> PlanResult`
- `baselines(cluster, model, workload) -> dict[str, BaselineResult]`
- `solve_grouping(grouping, cluster, model, workload, ...) -> MilpSolution` (one grouping)
- `candidate_groupings(cluster, model) -> list[Grouping]` (stage I)
- `explain_infeasible(cluster, model, workload) -> str`, `memory_report(...) -> MemoryReport`
"""

from .baselines import BaselineResult, baselines, best_baseline, proportional_plan
from .explain import MemoryReport, explain_infeasible, memory_report
from .groupings import Grouping, candidate_groupings
from .milp import MilpSolution, solve_grouping
from .refine import refine
from .result import PlanResult
from .scheduler import plan_cluster
from .solvers import check_solver

__all__ = [
    "BaselineResult", "Grouping", "MemoryReport", "MilpSolution", "PlanResult", "baselines", "best_baseline",
    "candidate_groupings", "check_solver", "explain_infeasible", "memory_report", "plan_cluster", "proportional_plan",
    "refine", "solve_grouping",
]
