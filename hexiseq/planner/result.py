"""What the planner returns: the plan, how fast it is, how it compares, and how good it provably is."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..plan import Plan
from .baselines import BaselineResult


@dataclass
class PlanResult:
    """The HexiSeq plan for one (cluster, model, workload) and the evidence around it.

    Times are seconds per iteration. `iteration_time_s` is the simulator's (the judge);
    `estimate_time_s` the cost model's analytic estimate; `linear_time_s` the MILP objective of the
    chosen grouping (the cost model's linear form, before rounding to whole tokens).

    Gap (what it means): `lower_bound_s` is a proven lower bound on the linear model's iteration
    time over the chosen grouping (the best of the LP relaxation and the MILP solver's bound);
    `gap = 1 - lower_bound_s / linear_time_s` says how far the solver's plan can be from the optimum
    of that model for that grouping; it is measured on the returned plan, so stage III moves (made for
    the simulator) count against it. `solver_gap` is the MILP's own certified gap (objective vs bound).
    `search_lower_bound_s` is a bound over every candidate grouping
    of stage I (solved or pruned), and `search_gap` the same ratio over the whole candidate set.
    Neither covers the difference between the linear model and the simulator, reported separately.
    """

    plan: Plan
    iteration_time_s: float
    tokens_per_s: float
    estimate_time_s: float
    linear_time_s: float
    lower_bound_s: float
    gap: float
    solver_gap: float  # the MILP's own certified gap (its objective vs its bound), before rounding/refinement
    search_lower_bound_s: float
    search_gap: float
    solver: str
    solver_status: str
    baselines: dict[str, BaselineResult]
    bound_tokens_per_s: float
    efficiency_vs_bound: float
    grouping_label: str
    source: str  # "milp", "milp+refine", or the baseline the plan came from
    plan_time_s: float
    stage_times_s: dict[str, float]
    candidates: int
    solved: int
    pruned: int
    estimate: Any = None  # the cost model's Estimate of the plan (per-rank time and memory)
    notes: list[str] = field(default_factory=list)
    recompute: str = "none"  # the plan's recompute policy (chosen by the planner under "auto"; also plan.meta["recompute"])
    policies_searched: list[str] = field(default_factory=list)  # the policies whose groupings were searched

    @property
    def best_baseline(self) -> BaselineResult | None:
        pool = [b for b in self.baselines.values() if b.feasible]
        return min(pool, key=lambda b: b.iteration_time_s) if pool else None

    @property
    def best_symmetric_baseline(self) -> BaselineResult | None:
        pool = [b for b in self.baselines.values() if b.feasible and b.name != "proportional"]
        return min(pool, key=lambda b: b.iteration_time_s) if pool else None

    @property
    def speedup_vs_best_baseline(self) -> float | None:
        """Throughput over the best baseline of all (symmetric CP/HP and the proportional heuristic)."""
        b = self.best_baseline
        return b.iteration_time_s / self.iteration_time_s if b else None

    @property
    def speedup_vs_best_symmetric(self) -> float | None:
        """Throughput over the best symmetric CP/HP baseline (what the paper reports)."""
        b = self.best_symmetric_baseline
        return b.iteration_time_s / self.iteration_time_s if b else None

    def to_dict(self, include_plan: bool = True) -> dict[str, Any]:
        """JSON-friendly summary (the `hexiseq plan --json` object)."""
        bb = self.best_baseline
        bs = self.best_symmetric_baseline
        d: dict[str, Any] = {
            "cluster": self.plan.cluster,
            "model": self.plan.model,
            "seq_len": self.plan.seq_len,
            "recompute": self.recompute,
            "policies_searched": list(self.policies_searched),
            "throughput_tokens_per_s": self.tokens_per_s,
            "iteration_time_s": self.iteration_time_s,
            "estimate_time_s": self.estimate_time_s,
            "linear_time_s": self.linear_time_s,
            "baselines": {n: b.tokens_per_s for n, b in self.baselines.items()},
            "baseline_details": {n: b.to_dict() for n, b in self.baselines.items()},
            "best_baseline": bb.name if bb else None,
            "speedup_vs_best_baseline": self.speedup_vs_best_baseline,
            "best_symmetric_baseline": bs.name if bs else None,
            "speedup_vs_best_symmetric": self.speedup_vs_best_symmetric,
            "bound_tokens_per_s": self.bound_tokens_per_s,
            "efficiency_vs_bound": self.efficiency_vs_bound,
            "lower_bound_s": self.lower_bound_s,
            "gap": self.gap,
            "solver_gap": self.solver_gap,
            "search_lower_bound_s": self.search_lower_bound_s,
            "search_gap": self.search_gap,
            "solver": self.solver,
            "solver_status": self.solver_status,
            "grouping": self.grouping_label,
            "source": self.source,
            "plan_time_s": self.plan_time_s,
            "stage_times_s": dict(self.stage_times_s),
            "candidates": {"total": self.candidates, "solved": self.solved, "pruned": self.pruned},
            "notes": list(self.notes),
        }
        if self.estimate is not None and hasattr(self.estimate, "to_dict"):
            d["estimate"] = self.estimate.to_dict()
        if include_plan:
            d["plan"] = self.plan.to_dict()
        return _finite(d)


def _finite(x: Any) -> Any:
    """NaN/inf become None so the dict is valid JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
