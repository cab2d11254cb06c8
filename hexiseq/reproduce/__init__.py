"""Reproduce the paper's experiments on the cost model, and show them.

    from hexiseq.reproduce import reproduce, load_results
    results = reproduce(quick=True)           # plan every cell, write results.csv, figures, paper_comparison.md
    results.table                             # one row per cell and system (pandas)
    for name, fig in results.figures(): ...   # every figure, drawn from the table

Modules: `scenarios` (scenario files -> cells), `sensitivity` (sweeps), `recipes` (cluster recipes and
cells), `cells` (one cell planned),
`cache` (per-cell cache and the cost-model version), `table` (the tidy results table),
`pipeline` (`reproduce`, `compute_cells`: a run's cells on one software stack), `stack_report` (the
headline speedups under every stack), `comparison` (paper_comparison.md), `paper` (the paper's figures),
`figures` / `plan_figures` (plots), `palette` / `style` (the one look of every figure).
The CLI is `hexiseq reproduce [SCENARIO...] [--quick] [--out DIR] [--force] [--stack NAME]`, and
`hexiseq reproduce --stacks [NAME...] [--quick]` for the stacks report.
"""

from .pipeline import (
    QUICK_DIR,
    RESULT_DIR,
    Results,
    check_out_dir,
    compute_cells,
    default_out,
    draw_outputs,
    load_results,
    notebook_results,
    redraw,
    reproduce,
)
from .recipes import mixed_cluster
from .scenarios import bundled_scenarios, load_scenario, load_scenarios

__all__ = [
    "QUICK_DIR",
    "RESULT_DIR",
    "Results",
    "bundled_scenarios",
    "check_out_dir",
    "compute_cells",
    "default_out",
    "draw_outputs",
    "load_results",
    "load_scenario",
    "load_scenarios",
    "mixed_cluster",
    "notebook_results",
    "redraw",
    "reproduce",
]
