"""Scenario sweeps moved to `hexiseq.reproduce` (scenarios -> cached cells -> results table ->
figures and the paper comparison; `hexiseq reproduce` on the command line). The names below are
kept for existing callers."""

from __future__ import annotations

from .reproduce.pipeline import RESULT_DIR, load_results, reproduce
from .reproduce.scenarios import SCENARIO_DIR, Scenario, load_scenario, mixed_cluster
from .reproduce.table import speedup_stats

__all__ = [
    "RESULT_DIR",
    "SCENARIO_DIR",
    "Scenario",
    "load_results",
    "load_scenario",
    "mixed_cluster",
    "reproduce",
    "speedup_stats",
]
