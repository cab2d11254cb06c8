"""Planner benchmark over the grid: planning time and certified gap of EVERY sim-128 cell and every
1024-GPU cell of the bundled scenarios (data/scenarios/*.yaml, the cells `hexiseq reproduce` plans),
the worst and the median of each, with the machine and its load; each cell is planned twice, and
the two plans must be the same (no wall-clock limit decides anything).

    .venv/bin/python benchmarks/bench_planner.py             # every sim-128 and 1024-GPU cell, twice
    .venv/bin/python benchmarks/bench_planner.py --once      # each cell once (no determinism check)
    .venv/bin/python benchmarks/bench_planner.py --json out.json

Targets (issue 18, DP = 1): <= 1 s per sim-128 cell and <= 10 s per 1024-GPU cell; gap <= 0.5 %.
Two gaps are reported: "gap" against the bound over every plan the executor can run (any
grouping, ring order and split: PlanResult.lower_bound_s) and "search gap" against the bound over
the search's candidate layouts (PlanResult.search_lower_bound_s).

Joint targets (issue 18): <= 2 s per sim-128 cell and <= 20 s per 1024-GPU cell at G = 8
(`--modes joint`: the joint planner, replicas x sharding x CP x HP, on each cell at a global batch
of 8; its gap is against the bound of every joint plan, its "search gap" against the bound of the
partitions it did not plan in full).

    .venv/bin/python benchmarks/bench_planner.py --modes "DP = 1,joint" --once

`--modes "joint,joint workers"` also plans each cell as `hexiseq plan` does, its replica shapes and
DP = 1 plan on one worker process per core (planner/workers.py), and checks that the plan is the
same as in one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hexiseq.errors import InfeasibleError  # noqa: E402
from hexiseq.planner import JointResult, plan_cluster, plan_joint  # noqa: E402
from hexiseq.reproduce.scenarios import load_scenarios  # noqa: E402
from hexiseq.specs import get_model  # noqa: E402

K = 1024
TARGET_S = {"sim-128": 1.0, "1024 GPUs": 10.0}
JOINT_TARGET_S = {"sim-128": 2.0, "1024 GPUs": 20.0}
JOINT_BATCH = 8
TARGET_GAP = 0.005


def planner_call(**kwargs: Any) -> Any:
    """DP = 1: plan_cluster with one cell's keyword arguments (cluster, model, workload, progress)."""
    return plan_cluster(**kwargs)


@dataclass
class JointAsResult:
    """A JointResult read with the fields plan_once takes of a PlanResult."""

    r: JointResult

    iteration_time_s = property(lambda self: self.r.step_time_s)
    lower_bound_s = property(lambda self: self.r.lower_bound_s)
    gap = property(lambda self: self.r.gap)
    # against the bound of the partitions not planned in full (0 when none was left)
    search_gap = property(
        lambda self: max(0.0, 1.0 - min(self.r.searched_bound_s, self.r.step_time_s) / self.r.step_time_s)
    )
    recompute = property(lambda self: self.r.recompute)
    source = property(lambda self: self.r.partition)
    stage_times_s = property(lambda self: self.r.stage_times_s)
    plan = property(lambda self: self.r.plan)


def joint_call(**kwargs: Any) -> Any:
    """The joint planner on the cell at a global batch of JOINT_BATCH sequences, in this process."""
    wl = kwargs.pop("workload")
    return JointAsResult(plan_joint(workload=dataclasses.replace(wl, global_batch=JOINT_BATCH), **kwargs))


def joint_workers_call(**kwargs: Any) -> Any:
    """The joint planner as `hexiseq plan` runs it: its shapes and DP = 1 plan on one worker per core."""
    return joint_call(workers="auto", **kwargs)


# mode name -> the function that plans one cell from plan_cluster's keyword arguments
MODES: dict[str, Callable[..., Any]] = {
    "DP = 1": planner_call,
    "joint": joint_call,
    "joint workers": joint_workers_call,
}


def grid_cells() -> list[tuple[str, Any]]:
    """Every distinct (family, cell) of the bundled scenarios on sim-128 or on 1024 GPUs, in scenario order."""
    out, seen = [], set()
    for sc in load_scenarios():
        for cell in sc.cells:
            cluster = cell.cluster.build()
            family = "sim-128" if cluster.name == "sim-128" else "1024 GPUs" if cluster.size == 1024 else None
            key = (cluster.name, cell.model, cell.seq_len, cell.workload)
            if family and key not in seen:
                seen.add(key)
                out.append((family, cell))
    return out


class CollectorClock:
    """Seconds this process spends in Python's cyclic garbage collector (gc.callbacks), a figure the
    machine's load moves far less than a wall time (worker processes' collections not counted)."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def plan_once(mode: Callable[..., Any], cell: Any) -> dict[str, Any]:
    """Plan one cell once: wall time, time in the garbage collector, step, both bounds and gaps, and
    the plan (JSON) to compare."""
    cluster = cell.cluster.build()
    kwargs = {"cluster": cluster, "model": get_model(cell.model), "workload": cell.workload_spec(), "progress": False}
    t = time.perf_counter()
    try:
        with CollectorClock() as gc_clock:
            r = mode(**kwargs)
    except InfeasibleError as e:
        return {"time_s": time.perf_counter() - t, "infeasible": str(e).splitlines()[0]}
    return {
        "time_s": time.perf_counter() - t,
        "gc_s": gc_clock.seconds,
        "step_s": r.iteration_time_s,
        "lower_bound_s": r.lower_bound_s,
        "gap": r.gap,
        "search_gap": r.search_gap,
        "recompute": r.recompute,
        "source": r.source,
        "stages": r.stage_times_s,
        "plan_json": json.dumps(r.plan.to_dict(), sort_keys=True),
    }


def machine() -> str:
    """The machine in words: processor, cores, load average."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"


def summary(rows: list[dict[str, Any]], family: str, key: str) -> str:
    """'worst W (cell), median M' of `key` over a family's feasible rows."""
    pool = [r for r in rows if r["family"] == family and key in r]
    if not pool:
        return "no feasible cell"
    worst = max(pool, key=lambda r: r[key])
    fmt = (lambda x: f"{x:.2f} s") if key.endswith("_s") else (lambda x: f"{x:.2%}")
    med = statistics.median(r[key] for r in pool)
    return f"worst {fmt(worst[key])} ({worst['cell']}), median {fmt(med)} over {len(pool)} cells"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--once", action="store_true", help="plan each cell once (no determinism check)")
    ap.add_argument("--json", help="also write every row to this JSON file")
    ap.add_argument("--modes", default="DP = 1,joint", help=f"comma-separated, of: {', '.join(MODES)}")
    args = ap.parse_args()
    t_all = time.perf_counter()
    cells = grid_cells()
    print(f"machine: {machine()} at the start; {len(cells)} cells")
    rows: list[dict[str, Any]] = []
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    modes = args.modes.split(",")
    # cells outside, modes inside: the modes of a cell run back to back, so a drift of the machine's
    # speed between cells falls on every mode alike (this VM's speed moves within minutes)
    planned: set[tuple[str, str]] = set()
    for family, cell in cells:
        label = f"{cell.cluster.name} {cell.model} {cell.seq_len // K}K"
        for mode_name in modes:
            # a joint mode plans every cell at G = JOINT_BATCH: cells that differ only in their
            # global batch (the global-batch scenario's G = 1..16) are the same cell there
            wl = cell.workload_spec()
            key = label + repr(dataclasses.replace(wl, global_batch=JOINT_BATCH) if mode_name != "DP = 1" else wl)
            if (mode_name, key) in planned:
                continue
            planned.add((mode_name, key))
            a = plan_once(MODES[mode_name], cell)
            b = None if args.once else plan_once(MODES[mode_name], cell)
            row = {"mode": mode_name, "family": family, "cell": label, "key": key, **a}
            if b is not None:
                row["time_2_s"] = b["time_s"]
                row["same_plan"] = a.get("plan_json") == b.get("plan_json")
            rows.append(row)
            print(f"  {mode_name}: {label} {a['time_s']:.2f} s", file=sys.stderr, flush=True)
    for mode_name in modes:
        print(f"\n== {mode_name}")
        print(
            f"{'cell':>34} {'time s':>7} {'2nd s':>7} {'gc s':>6} {'step s':>9} {'gap':>7} {'search':>7} "
            f"{'same':>5}  rec"
        )
        mine = [r for r in rows if r["mode"] == mode_name]
        for r in mine:
            if "infeasible" in r:
                print(f"{r['cell']:>34} {r['time_s']:>7.2f} infeasible: {r['infeasible'][:60]}")
                continue
            second = f"{r['time_2_s']:>7.2f}" if "time_2_s" in r else f"{'-':>7}"
            same = str(r.get("same_plan", "-"))
            print(
                f"{r['cell']:>34} {r['time_s']:>7.2f} {second} {r['gc_s']:>6.2f} {r['step_s']:>9.4f} {r['gap']:>7.2%} "
                f"{r['search_gap']:>7.2%} {same:>5}  {r['recompute']}"
            )
        for family, target in (JOINT_TARGET_S if mode_name != "DP = 1" else TARGET_S).items():
            print(f"  {family}: time {summary(mine, family, 'time_s')} (target <= {target:g} s)")
            print(f"  {family}: gap {summary(mine, family, 'gap')} (target <= {TARGET_GAP:.1%})")
            print(f"  {family}: search gap {summary(mine, family, 'search_gap')}")
            print(f"  {family}: time in the garbage collector {summary(mine, family, 'gc_s')}")
        same = [r["same_plan"] for r in mine if "same_plan" in r]
        if same:
            print(f"  the same plan on both runs: {sum(same)} of {len(same)} cells")
        if mode_name == "joint workers":  # the workers must not change the plan (planner/workers.py)
            alone = {r["key"]: r for r in rows if r["mode"] == "joint"}
            pairs = [(r, alone[r["key"]]) for r in mine if r["key"] in alone]
            if pairs:
                same_plan = sum(r.get("plan_json") == o.get("plan_json") for r, o in pairs)
                print(f"  the same plan as in one process: {same_plan} of {len(pairs)} cells")
                ratios = sorted(o["time_s"] / r["time_s"] for r, o in pairs)
                print(
                    f"  time in one process / with workers, cell by cell: worst {ratios[0]:.2f}x, median "
                    f"{statistics.median(ratios):.2f}x, best {ratios[-1]:.2f}x over {len(pairs)} cells"
                )
    print(f"\nmachine: {machine()} at the end; total benchmark time {time.perf_counter() - t_all:.0f} s")
    if args.json:
        for r in rows:
            r.pop("plan_json", None)
            r.pop("key", None)
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
