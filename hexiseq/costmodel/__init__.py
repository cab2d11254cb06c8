"""Cost model: the kernel-time model, exact pair counts, α–β communication, memory, and the step
replay that times a plan (the judge), with the compute bound.

- `simulate(plan, cluster, model, workload) -> SimResult`   the iteration replayed (simulate.py)
- `estimate(plan, cluster, model, workload) -> Estimate`    the replay's time, per-rank phases, memory, MFU
- `durations(plan, ...) -> Durations`                       every duration the replay schedules
- `compute_bound(cluster, model, workload) -> float`        tokens/s no plan can beat
- `kernels.work_times(gpus, model)`                         seconds per unit of work (the one kernel-time model)
- `flops.pairs_per_rank(plan)`                              exact pairs per head per exchange round
"""

from .bound import compute_bound, useful_flops
from .durations import Durations, durations
from .estimate import OOM, Estimate, RankEstimate, estimate
from .flops import causal_pairs_between, group_pair_matrix, needed_kv_tokens, pairs_per_rank
from .kernels import CostOptions, WorkTimes, work_times
from .memory import MEMORY_KEYS
from .policy import RULES, RecomputeRule, rule_of
from .simulate import PHASES, SimResult, simulate, simulate_durations

__all__ = [
    "CostOptions",
    "Durations",
    "Estimate",
    "MEMORY_KEYS",
    "OOM",
    "PHASES",
    "RULES",
    "RankEstimate",
    "RecomputeRule",
    "SimResult",
    "WorkTimes",
    "causal_pairs_between",
    "compute_bound",
    "durations",
    "estimate",
    "group_pair_matrix",
    "needed_kv_tokens",
    "pairs_per_rank",
    "rule_of",
    "simulate",
    "simulate_durations",
    "useful_flops",
    "work_times",
]
