"""Python's cyclic garbage collector, held back while a plan is made.

A plan allocates millions of small objects (Pyomo rows, cutting planes, replays) and keeps most of
them until it ends, so the collector's default thresholds (a young collection every 700 net
allocations) scan the same survivors again and again. Measured by `benchmarks/bench_planner.py`'s
"gc s" (gc.callbacks; 2-core Intel VM, 2026-12-06, data/results/planner.txt), joint plans at G = 8:
median 1.32 s, worst 2.62 s of the sim-128 cells' 6-26 s, and 5.4 s on mixed-1024, with the
default thresholds; 0.44 s, 0.66 s and 0.8 s with a young collection every 100,000. In three
alternating pairs of fresh processes (sim-128 gpt-70b 256K) the plan took 13.97 s on average with
the defaults and 13.26 s with these; its peak memory moved from 421 to 430 MB (gpt-70b 128K). The
thresholds go back to the caller's when the plan ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PLANNING_THRESHOLDS", "fewer_collections"]

PLANNING_THRESHOLDS = (100_000, 50, 20)  # young, middle, old (gc.set_threshold)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's thresholds to PLANNING_THRESHOLDS for the block (not lower any the
    caller set higher); restore them after, also on an error."""
    before = gc.get_threshold()
    raised = tuple(max(a, b) for a, b in zip(before, PLANNING_THRESHOLDS))
    gc.set_threshold(*raised)
    try:
        yield
    finally:
        gc.set_threshold(*before)
