"""The HexiSeq planner: the candidate search space, the Pyomo model of a layout, best-first search
with proven bounds, the homogeneous baselines and infeasibility explanations.

- `plan_cluster(cluster, model, workload, progress=True) -> PlanResult`
- `plan_joint(cluster, model, workload, dp="auto") -> JointResult` (the whole step: replicas x sharding)
- `baselines(cluster, model, workload) -> dict[str, BaselineResult]`
- `candidate_layouts(cluster, model) -> list[Candidate]` (stage I)
- `LayoutModel(cluster, model, workload, layout)` the optimization model of one layout
- `explain_infeasible(cluster, model, workload) -> str`, `memory_report(...) -> MemoryReport`
"""

from .baselines import FAMILIES, BaselineResult, baselines, best_baseline, plan_lower_bound, proportional_plan
from .candidates import Candidate, device_subsets, layouts
from .dp_baselines import DPBaseline, dp_baselines
from .explain import MemoryReport, explain_infeasible, may_fit, memory_report
from .joint import JointResult, plan_joint
from .layout import Layout
from .layout_model import LayoutModel
from .refine import refine
from .result import PlanResult
from .scheduler import SEARCH_SPACE, candidate_layouts, plan_cluster
from .shares import STRATEGIES, batch_shares

__all__ = [
    "FAMILIES",
    "STRATEGIES",
    "DPBaseline",
    "JointResult",
    "dp_baselines",
    "batch_shares",
    "plan_joint",
    "SEARCH_SPACE",
    "BaselineResult",
    "Candidate",
    "Layout",
    "LayoutModel",
    "MemoryReport",
    "PlanResult",
    "baselines",
    "best_baseline",
    "candidate_layouts",
    "device_subsets",
    "explain_infeasible",
    "layouts",
    "may_fit",
    "memory_report",
    "plan_cluster",
    "plan_lower_bound",
    "proportional_plan",
    "refine",
]
