"""Plots of one plan, for notebooks. They live in `hexiseq.reproduce.plan_figures` (with the one
palette and style every figure uses); these names are kept for existing callers, and their
figures are pyplot figures (`plt.show()` shows them), as they were.

- `plot_layout(plan, cluster)`: where the tokens and heads go (readable from 4 to 1024 ranks)
- `plot_rank_breakdown(estimate)`: time by cost-model phase and memory per rank (or GPU type)
- `plot_comparison(throughputs)`: tokens/s of HexiSeq and every baseline
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .reproduce.palette import gpu_colors, phase_colors
from .reproduce.plan_figures import plot_allocation, plot_cell_systems, plot_rank_phases
from .reproduce.style import pyplot_figures


def plot_layout(plan: Any, cluster: Any, title: str | None = None) -> Any:
    """The allocation picture of a plan (see `plan_figures.plot_allocation`)."""
    with pyplot_figures():
        return plot_allocation(plan, cluster, title)


def plot_rank_breakdown(estimate: Any, title: str | None = None) -> Any:
    """Time by phase and memory, per rank (see `plan_figures.plot_rank_phases`)."""
    with pyplot_figures():
        return plot_rank_phases(estimate, title)


def plot_comparison(throughputs: Mapping[str, float], bound: float | None = None, title: str = "") -> Any:
    """Bars of tokens/s per system ({name: tokens/s}; 0 or None = does not fit)."""
    rows = [{"system": k, "feasible": bool(v), "tokens_per_s": v or 0.0} for k, v in throughputs.items()]
    with pyplot_figures():
        return plot_cell_systems(rows, title=title, bound_tokens_per_s=bound)


__all__ = [
    "gpu_colors",
    "phase_colors",
    "plot_allocation",
    "plot_cell_systems",
    "plot_comparison",
    "plot_layout",
    "plot_rank_breakdown",
    "plot_rank_phases",
]
