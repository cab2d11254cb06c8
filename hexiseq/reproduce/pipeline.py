"""`reproduce`: scenarios -> cells (cached) -> results table -> figures and the paper comparison.

A results directory holds:

    results.csv          one row per cell and system (table.py)
    meta.json            the version, the command, the stack, per-scenario facts (quick or full), the machine
    paper_comparison.md  every figure the paper publishes vs ours (comparison.py)
    figures/             PNG + PDF of every figure (figures.py, plan_figures.py)
    plans/<scenario>.json  the plan and cluster each allocation picture shows
    cache/               one JSON per finished cell (cache.py; not meant to be committed), and
                         cache/STACK naming the stack its cells were computed on

Rows of scenarios not in a run are kept from the directory's previous results.csv (with their own
version column), so reproducing one scenario does not drop the others.

Every cell of a run is planned and judged on one software stack (`stack=`, data/stacks.yaml; default
the default stack), named in results.csv's `stack` column and meta.json. A results directory holds
one stack: a run on another stack into a directory that holds results or cached cells of a different
one is refused before any planning (`check_out_dir`), so no table ever mixes two stacks' numbers.
Without `out`, a non-default stack writes to its own directory (`default_out`). A results.csv written
before the column existed, and a cache without its STACK file, are the default stack's.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import HexiSeqError, SpecError
from ..plan import Plan
from ..specs import DATA_DIR, ClusterSpec, LinkOverride, NodeSpec, get_gpu
from ..specs.stacks import DEFAULT_STACK_NAME, get_stack
from .cache import REPO_DIR, CellCache, cell_key, model_version, version_inputs, write_atomic
from .cells import machine_info, run_cell
from .table import frame, read_csv, rows_of, write_csv

RESULT_DIR = DATA_DIR / "results"
QUICK_DIR = REPO_DIR / "out" / "reproduce-quick"
STACK_FILE = "STACK"  # in the cache directory: the stack its cells were computed on
GENERATED_PREFIXES = ("systems_", "allocation_", "phases_", "sensitivity_")
FIXED_FIGURES = ("speedup_vs_length", "speedup_vs_gpu_types", "flop_comparable_pairs", "planner_time")


def cluster_to_dict(c: ClusterSpec) -> dict[str, Any]:
    return {
        "name": c.name,
        "description": c.description,
        "inter_node_latency_us": c.inter_node_latency_us,
        "nodes": [
            {"gpu": n.gpu.name, "count": n.count, "nic_gbps": n.nic_gbps, "link_bandwidth_gbps": n.link_bandwidth_gbps}
            for n in c.nodes
        ],
        "overrides": [
            {"a": o.a, "b": o.b, "bandwidth_gbps": o.bandwidth_gbps, "latency_us": o.latency_us} for o in c.overrides
        ],
    }


def cluster_from_dict(d: dict[str, Any]) -> ClusterSpec:
    nodes = tuple(
        NodeSpec(get_gpu(n["gpu"]), n["count"], n["nic_gbps"], n.get("link_bandwidth_gbps")) for n in d["nodes"]
    )
    return ClusterSpec(
        d["name"],
        nodes,
        d.get("inter_node_latency_us", 10.0),
        tuple(LinkOverride(**o) for o in d.get("overrides", ())),
        d.get("description", ""),
    )


@dataclass
class Results:
    """A results directory read back (or just written)."""

    directory: Path
    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def quick(self) -> bool:
        return any(s.get("quick") for s in self.meta.get("scenarios", {}).values())

    @property
    def stack(self) -> str:
        """The software stack of these results (meta.json, else the table's column; the default
        stack for results written before either existed)."""
        named = self.meta.get("stack") or next(iter(_table_stacks(self.table)), None)
        return named or DEFAULT_STACK_NAME

    @property
    def stale(self) -> bool:
        """Computed with other code or data than this checkout's (see cache.model_version)."""
        return bool(len(self.table)) and set(self.table["version"]) != {model_version()}

    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(self.table["scenario"]))

    def comparison(self) -> list[Any]:
        from .comparison import compare

        return compare(self.table)

    def comparison_markdown(self) -> str:
        from .comparison import markdown

        return markdown(self.comparison(), self.meta)

    def allocation(self, scenario: str) -> tuple[Any, ClusterSpec, dict[str, Any]] | None:
        """(plan, cluster, cell labels) of the scenario's allocation picture, if saved."""
        p = self.directory / "plans" / f"{scenario}.json"
        if not p.exists():
            return None
        d = json.loads(p.read_text())
        return Plan.from_dict(d["plan"]), cluster_from_dict(d["cluster"]), d["cell"]

    def figures(self) -> Iterator[tuple[str, Any]]:
        """(name, Figure) for every figure of these results, made one at a time."""
        from . import figures as F
        from .plan_figures import plot_allocation

        df = self.table
        fixed: dict[str, Callable[[], Any]] = {
            "speedup_vs_length": lambda: F.fig_speedup_vs_length(df),
            "speedup_vs_gpu_types": lambda: F.fig_speedup_vs_gpu_types(df),
            "flop_comparable_pairs": lambda: F.fig_pairs(df),
            "planner_time": lambda: F.fig_planner_time(df),
        }
        for name in FIXED_FIGURES:
            yield name, fixed[name]()
        if (df["sweep"] == "global_batch").any():
            yield "global_batch", F.fig_global_batch(df)
        for sweep in F.sensitivity_sweeps(df):
            yield f"sensitivity_{sweep}", F.fig_sensitivity(df, sweep)
        for sc in self.scenarios():
            yield f"systems_{sc}", F.fig_systems(df, sc)
            yield f"phases_{sc}", F.fig_phases(df, sc)
            alloc = self.allocation(sc)
            if alloc is not None:
                plan, cluster, cell = alloc
                yield f"allocation_{sc}", plot_allocation(plan, cluster, title=f"{sc}: {cell['label']}")


def load_results(directory: Path | str = RESULT_DIR) -> Results | None:
    """The results in `directory`, or None when it has no results.csv."""
    directory = Path(directory)
    csv = directory / "results.csv"
    if not csv.exists():
        return None
    meta_path = directory / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return Results(directory, read_csv(csv), meta)


class _Progress:
    """A bar in a terminal or a notebook; one line per computed cell in a log (no redraws)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.bar, self.lines = total, 0, None, False
        if not enabled:
            return
        if "ipykernel" in sys.modules:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="reproduce", unit="cell")
        elif sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="reproduce", unit="cell", file=sys.stderr)
        else:
            self.lines = True

    def step(self, label: str, seconds: float | None) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label + (" (cached)" if seconds is None else ""), refresh=False)
            self.bar.update()
        elif self.lines and seconds is not None:
            print(f"[{self.done}/{self.total}] {label}: {seconds:.1f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _identity(cell: Any) -> tuple:
    return (cell.scenario, cell.cluster.name, cell.model, cell.seq_len, cell.role, cell.sweep, cell.sweep_value)


def default_out(quick: bool = False, stack: str | None = None) -> Path:
    """The results directory of a run without `out`: data/results (the quick grid: out/reproduce-quick)
    on the default stack; out/reproduce-STACK (out/reproduce-quick-STACK) on another, so that the
    default directories only ever hold the default stack."""
    if stack is None or stack == DEFAULT_STACK_NAME:
        return QUICK_DIR if quick else RESULT_DIR
    return REPO_DIR / "out" / (f"reproduce-quick-{stack}" if quick else f"reproduce-{stack}")


def _table_stacks(table: pd.DataFrame) -> list[str]:
    """The stacks a results table names, in order ("" or no column: written before the column, the
    default stack's)."""
    if "stack" not in table.columns:
        return [DEFAULT_STACK_NAME] if len(table) else []
    return list(dict.fromkeys(s or DEFAULT_STACK_NAME for s in table["stack"]))


def directory_stacks(out: Path | str) -> dict[str, str]:
    """{what in `out` names a stack: that stack}: its results.csv and meta.json, and its cache (the
    STACK file; a cache of cells without one is the default stack's). Empty for a new directory."""
    out = Path(out)
    found: dict[str, str] = {}
    results = load_results(out)
    if results is not None:
        for i, st in enumerate(_table_stacks(results.table)):  # (more than one: a table mixed by hand)
            found[str(out / "results.csv") + (f", rows of {st}" if i else "")] = st
        if results.meta.get("stack"):
            found[str(out / "meta.json")] = results.meta["stack"]
    marker = out / "cache" / STACK_FILE
    if marker.exists():
        found[str(marker)] = marker.read_text().strip()
    elif (out / "cache").is_dir() and any((out / "cache").glob("*.json")):
        found[str(out / "cache")] = DEFAULT_STACK_NAME
    return found


def check_out_dir(out: Path | str, stack: str = DEFAULT_STACK_NAME) -> None:
    """The results directory can be made and written, and holds no results or cached cells of
    another stack than `stack`: checked before any planning."""
    out = Path(out)
    try:
        (out / "cache").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(f"--out {out}: cannot create the results directory: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise SpecError(f"--out {out}: the directory is not writable")
    other = {where: st for where, st in directory_stacks(out).items() if st != stack}
    if other:
        where, st = next(iter(other.items()))
        raise SpecError(
            f"--out {out} holds results of the stack {st!r} ({where}), not {stack!r}: a results directory holds "
            f"one stack. Give --stack {stack} its own directory (--out DIR; without --out it writes to "
            f"{default_out(False, stack)}), or remove {out} to recompute it on {stack!r}"
        )


@dataclass
class CellRun:
    """The cells of one run computed on one stack (`compute_cells`): their table rows in order, each
    cell's record by identity, and how many were computed rather than read from the cache."""

    stack: str
    rows: list[dict[str, Any]]
    by_cell: dict[tuple, dict[str, Any]]
    computed: int
    total: int


def compute_cells(
    loaded: list[Any],
    stack: str,
    cache: CellCache,
    version: str,
    force: bool = False,
    progress: bool = True,
) -> CellRun:
    """Every cell of the scenarios `loaded`, planned for HexiSeq and every baseline and judged on the
    software stack `stack`; each from `cache` unless `force` or absent (then computed and stored).
    The one place a run's cells are computed: `reproduce` and the stacks report both call it."""
    cells = [dataclasses.replace(c, stack=stack) for sc in loaded for c in sc.cells]
    records: dict[str, dict[str, Any]] = {}
    by_cell: dict[tuple, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    computed = 0
    marker = cache.directory / STACK_FILE
    if marker.exists() and marker.read_text().strip() != stack:  # (reproduce checked the whole directory)
        raise SpecError(f"{cache.directory} holds cells of the stack {marker.read_text().strip()!r}, not {stack!r}")
    write_atomic(marker, stack + "\n")
    bar = _Progress(len(cells), progress)
    try:
        for cell in cells:
            key = cell_key(cell, version)
            rec = records.get(key) or (None if force else cache.get(key))
            seconds = None
            if rec is None:
                t = time.perf_counter()
                rec = run_cell(cell)
                cache.put(key, rec)
                computed += 1
                seconds = time.perf_counter() - t
            records[key] = rec
            by_cell[_identity(cell)] = rec
            rows += rows_of(cell, rec, version)
            bar.step(cell.label, seconds)
    finally:
        bar.close()
    return CellRun(stack, rows, by_cell, computed, len(cells))


def reproduce(
    scenarios: list[str] | tuple[str, ...] | None = None,
    quick: bool = False,
    out: Path | str | None = None,
    force: bool = False,
    progress: bool = True,
    draw: bool = True,
    command: str | None = None,
    stack: str | None = None,
) -> Results:
    """Plan every cell of the scenarios (default: all bundled) for HexiSeq and every baseline on the
    software stack `stack` (data/stacks.yaml; None: the default stack), reusing cached cells unless
    `force`; write results.csv, meta.json, the figures and the paper comparison into `out`
    (default: `default_out(quick, stack)`). A directory holding another stack's results is refused."""
    from .scenarios import load_scenarios

    t0 = time.perf_counter()
    stack_name = get_stack(stack).name  # an unknown stack fails here, with the known ones
    out = Path(out) if out is not None else default_out(quick, stack_name)
    loaded = load_scenarios(scenarios, quick=quick)  # every bad input fails here, before any planning
    check_out_dir(out, stack_name)
    version = model_version()
    run = compute_cells(loaded, stack_name, CellCache(out / "cache"), version, force=force, progress=progress)
    names = [sc.name for sc in loaded]
    previous = load_results(out)
    table = frame(run.rows)
    meta_scenarios = {}
    if previous is not None:
        kept = previous.table[~previous.table["scenario"].isin(names)].copy()
        # rows from before the column are the default stack's (check_out_dir let them through)
        kept["stack"] = kept["stack"].replace("", DEFAULT_STACK_NAME) if "stack" in kept else DEFAULT_STACK_NAME
        table = pd.concat([kept, table], ignore_index=True) if len(kept) else table
        meta_scenarios = {k: v for k, v in previous.meta.get("scenarios", {}).items() if k not in names}
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    for sc in loaded:
        meta_scenarios[sc.name] = {
            "file": str(Path(sc.path).resolve().relative_to(REPO_DIR))
            if Path(sc.path).resolve().is_relative_to(REPO_DIR)
            else sc.path,
            "description": sc.description,
            "quick": sc.quick,
            "cells": len(sc.cells),
            "version": version,
            "at": now,
        }
    meta = {
        "command": command
        or " ".join(["hexiseq reproduce", *names])
        + (" --quick" if quick else "")
        + (f" --stack {stack_name}" if stack_name != DEFAULT_STACK_NAME else "")
        + (f" --out {out}" if out != default_out(quick, stack_name) else ""),
        "version": version,
        "version_inputs": version_inputs(),
        "stack": stack_name,
        "cells": int(table["system"].eq("hexiseq").sum()),
        "scenarios": meta_scenarios,
        "last_run": {
            "at": now,
            "computed": run.computed,
            "cached": run.total - run.computed,
            "wall_s": None,
            "machine": machine_info(),
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    write_csv(table, out / "results.csv")
    results = Results(out, read_csv(out / "results.csv"), meta)
    _save_plans(results, loaded, run.by_cell)
    if draw:
        draw_outputs(results)
    meta["last_run"]["wall_s"] = round(time.perf_counter() - t0, 1)
    write_atomic(out / "meta.json", json.dumps(meta, indent=1, default=str) + "\n")
    return results


def _save_plans(results: Results, loaded: list[Any], by_cell: dict[tuple, dict[str, Any]]) -> None:
    """plans/<scenario>.json for each scenario of this run: the allocation picture's plan."""
    from .figures import cell_label, representative_cell

    for sc in loaded:
        row = representative_cell(results.table, sc.name)
        path = results.directory / "plans" / f"{sc.name}.json"
        if row is None:
            path.unlink(missing_ok=True)
            continue
        cell = next(
            c
            for c in sc.cells
            if c.cluster.name == row["cluster"]
            and c.model == row["model"]
            and c.seq_len == row["seq_len"]
            and c.role == row["pair_role"]
            and c.sweep == row["sweep"]
        )
        rec = by_cell[_identity(cell)]
        doc = {
            "cell": {
                "scenario": sc.name,
                "label": cell_label(row),
                "cluster": row["cluster"],
                "model": row["model"],
                "seq_len": int(row["seq_len"]),
            },
            "cluster": cluster_to_dict(cell.cluster.build()),
            "plan": rec["plan"],
        }
        write_atomic(path, json.dumps(doc) + "\n")


def draw_outputs(results: Results, log: Callable[[str], None] | None = None) -> list[Path]:
    """Every figure (PNG + PDF) and paper_comparison.md into the results directory; figures of
    earlier runs that these results no longer make are removed."""
    from .style import save

    fig_dir = results.directory / "figures"
    written: list[Path] = []
    for name, fig in results.figures():
        written += save(fig, fig_dir, name)
        if log:
            log(f"figure {name}")
    keep = set(written)
    for p in list(fig_dir.glob("*.png")) + list(fig_dir.glob("*.pdf")):
        if p not in keep and (p.stem.startswith(GENERATED_PREFIXES) or p.stem in FIXED_FIGURES):
            p.unlink()
    write_atomic(results.directory / "paper_comparison.md", results.comparison_markdown())
    return written


def redraw(directory: Path | str = RESULT_DIR) -> Results:
    """Figures and comparison again from a results directory's CSV and plans (no planning)."""
    results = load_results(directory)
    if results is None:
        raise HexiSeqError(f"{directory}: no results.csv to draw from; run `hexiseq reproduce --out {directory}` first")
    draw_outputs(results)
    return results


def notebook_results(
    directory: Path | str = RESULT_DIR,
    quick_out: Path | str | None = None,
    progress: bool = True,
    stack: str | None = None,
) -> Results:
    """What the paper-figures notebook shows on the software stack `stack` (None: the default): the
    results in `directory` when it holds that stack's, else the quick grid on that stack, computed (or
    taken from its cache) into `quick_out` (default: `default_out(True, stack)`)."""
    stack_name = get_stack(stack).name
    found = load_results(directory)
    if found is not None and found.stack == stack_name:
        return found
    quick_out = Path(quick_out) if quick_out is not None else default_out(True, stack_name)
    held = f"results of the stack {found.stack}" if found is not None else "no results"
    print(
        f"{directory} holds {held}: computing the quick grid on {stack_name} into {quick_out} "
        f"(the full grid: `hexiseq reproduce"
        + (f" --stack {stack_name}" if stack_name != DEFAULT_STACK_NAME else "")
        + "`)",
        flush=True,
    )
    return reproduce(quick=True, out=quick_out, progress=progress, stack=stack_name)
