"""Cost model: exact FLOPs, α–β communication, memory, the analytic estimate, its linear form for
the planner, the step simulator (the judge) and the compute bound.

- `estimate(plan, cluster, model, workload) -> Estimate`   analytic, per-rank time by phase + memory
- `simulate(plan, cluster, model, workload) -> SimResult`  step-by-step replay with waits (the judge)
- `compute_bound(cluster, model, workload) -> float`        tokens/s no plan can beat
- `linear.linear_form(cluster, model, workload, groups, heads=None) -> LinearForm`  for the MILP
- `flops.pairs_per_rank(plan)`                                exact pairs per head per exchange round
"""

from .arrays import CostOptions
from .bound import compute_bound, useful_flops
from .estimate import PHASES, Estimate, OOM, RankEstimate, components, estimate
from .flops import causal_pairs_between, group_pair_matrix, needed_kv_tokens, pairs_per_rank
from .linear import Affine, LinearForm, linear_form
from .memory import MEMORY_KEYS
from .simulate import SimResult, simulate

__all__ = [
    "Affine", "CostOptions", "Estimate", "LinearForm", "MEMORY_KEYS", "OOM", "PHASES", "RankEstimate", "SimResult",
    "causal_pairs_between", "components", "compute_bound", "estimate", "group_pair_matrix", "linear_form",
    "needed_kv_tokens", "pairs_per_rank", "simulate", "useful_flops",
]
