"""What the planner returns: the plan, how fast it is, how it compares, and how good it provably is."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..costmodel.simulate import DEVICE_PHASES
from ..plan import Plan
from .baselines import BaselineResult


@dataclass
class PlanResult:
    """The HexiSeq plan for one (cluster, model, workload) and the evidence around it.

    Times are seconds per iteration, all from the step replay (the judge). `lower_bound_s` is a
    proven lower bound of the replayed step time of every plan the executor can run at DP = 1
    (`bound_covers` says so in words): the least of the search's bound over its candidate layouts
    (`search_lower_bound_s`: the optimization models of the layouts the search visited, the bounds
    of the device subsets of those it pruned; `search_space` describes the candidates) and a bound
    of everything outside them (costmodel.bound.every_plan_bound: any grouping, ring order and
    split on any device subset). `gap = 1 - lower_bound_s / iteration_time_s` is how far the returned
    plan can be from the best plan at all, `search_gap` how far from the best candidate layout. A
    work limit leaves both valid, only weaker.
    """

    plan: Plan
    iteration_time_s: float
    tokens_per_s: float
    lower_bound_s: float
    gap: float
    baselines: dict[str, BaselineResult]
    bound_tokens_per_s: float
    efficiency_vs_bound: float
    grouping_label: str
    source: str  # "model: <layout>", "... +refine (n moves)", or the baseline the plan came from
    solver: str
    plan_time_s: float
    stage_times_s: dict[str, float]
    candidates: int  # (layout, policy) nodes in the search space
    solved: int  # nodes whose model was solved at least once
    pruned: int  # nodes bounded by their subset's compute bound only
    work_rounds: int  # cutting-plane rounds in all (the deterministic work measure)
    search_space: str
    estimate: Any = None  # the Estimate of the plan (per-rank time by phase and memory)
    notes: list[str] = field(default_factory=list)
    recompute: str = "none"  # the plan's recompute policy (chosen under "auto"; also plan.meta["recompute"])
    policies_searched: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # why devices were left out (one line per GPU type)
    search_lower_bound_s: float = math.nan  # the bound over the candidate layouts alone (>= lower_bound_s)
    bound_covers: str = ""  # in words: which plans lower_bound_s is a bound of

    @property
    def search_gap(self) -> float:
        """1 - search_lower_bound_s / iteration_time_s: how far the plan can be from the best candidate layout."""
        if not math.isfinite(self.search_lower_bound_s) or self.iteration_time_s <= 0:
            return math.nan
        return max(0.0, 1.0 - self.search_lower_bound_s / self.iteration_time_s)

    @property
    def estimate_time_s(self) -> float:
        return self.iteration_time_s

    @property
    def best_baseline(self) -> BaselineResult | None:
        pool = [b for b in self.baselines.values() if b.feasible]
        return min(pool, key=lambda b: (b.iteration_time_s, b.name)) if pool else None

    @property
    def best_symmetric_baseline(self) -> BaselineResult | None:
        pool = [b for b in self.baselines.values() if b.feasible and b.name != "proportional"]
        return min(pool, key=lambda b: (b.iteration_time_s, b.name)) if pool else None

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
        bb, bs = self.best_baseline, self.best_symmetric_baseline
        d: dict[str, Any] = {
            "cluster": self.plan.cluster,
            "model": self.plan.model,
            "seq_len": self.plan.seq_len,
            "recompute": self.recompute,
            "policies_searched": list(self.policies_searched),
            "throughput_tokens_per_s": self.tokens_per_s,
            "iteration_time_s": self.iteration_time_s,
            "lower_bound_s": self.lower_bound_s,
            "gap": self.gap,
            "bound_covers": self.bound_covers,
            "search_lower_bound_s": self.search_lower_bound_s,
            "search_gap": self.search_gap,
            "baselines": {n: b.tokens_per_s for n, b in self.baselines.items()},
            "baseline_details": {n: b.to_dict() for n, b in self.baselines.items()},
            "best_baseline": bb.name if bb else None,
            "speedup_vs_best_baseline": self.speedup_vs_best_baseline,
            "best_symmetric_baseline": bs.name if bs else None,
            "speedup_vs_best_symmetric": self.speedup_vs_best_symmetric,
            "bound_tokens_per_s": self.bound_tokens_per_s,
            "efficiency_vs_bound": self.efficiency_vs_bound,
            "grouping": self.grouping_label,
            "source": self.source,
            "solver": self.solver,
            "plan_time_s": self.plan_time_s,
            "stage_times_s": dict(self.stage_times_s),
            "candidates": {
                "total": self.candidates,
                "solved": self.solved,
                "pruned": self.pruned,
                "work_rounds": self.work_rounds,
            },
            "search_space": self.search_space,
            "left_out": list(self.left_out),
            "notes": list(self.notes),
        }
        if self.estimate is not None and hasattr(self.estimate, "to_dict"):
            d["estimate"] = self.estimate.to_dict()
        if include_plan:
            d["plan"] = self.plan.to_dict()
        return _finite(d)


# the critical rank's phases the every-grouping bound does not count (costmodel.bound.every_plan_bound), in words
_UNCOUNTED = (("kv_exchange", "in exposed K/V exchange"), ("alltoall", "in all-to-all"), ("wait", "waiting"))


def gap_account(estimate: Any, lower_bound_s: float) -> str:
    """Where the gap to a bound valid for every grouping lies, in words: the plan's critical rank's
    step split into its own work, the time that bound does not count (exposed K/V exchange,
    all-to-all, waiting) and its exposed parameter traffic (counted there only as the collectives of
    a device set), beside the bound. `estimate`: the plan's costmodel Estimate."""
    rank = estimate.ranks[estimate.critical_rank]
    t = rank.time_s
    own = sum(t.get(k, 0.0) for k in DEVICE_PHASES)
    left = [(t.get(k, 0.0), words) for k, words in _UNCOUNTED if t.get(k, 0.0) > 0.0]
    left_words = ", ".join(f"{v:.3g} s {w}" for v, w in left) if left else "nothing"
    return (
        f"where the gap lies: the step's critical rank (rank {rank.rank}, {rank.gpu}) works {own:.4g} s itself, "
        f"spends {left_words} (not counted by the every-grouping bound) and {t.get('param_comm', 0.0):.3g} s in "
        f"exposed parameter traffic, against the bound's {lower_bound_s:.4g} s"
    )


def _finite(x: Any) -> Any:
    """NaN/inf become None so the dict is valid JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
