"""How the simulations move with the catalog rates that are ranges, not measurements.

Some catalog GPUs (L40S, RTX-A6000, RTX-4090) have no published training run and no single kernel
measurement of every rate: their eff_attention is a range, the catalog holding its midpoint
(`GPUType.ranges`; data/validation/kernels.yaml `recommended_priors.catalog_rates`). This report
plans the simulation scenario's cells whose cluster holds such a GPU with every ranged field at the
low end, the midpoint (the catalog as it is) and the high end (`specs.gpus.at_range_end`), and
beside them with the rates the catalog used before it had sources for them (`borrowed`: those GPUs
at A100-80GB's effective rates on the default stack, the analogy the sourced rates replaced):

    python -m hexiseq.reproduce.rate_sensitivity [--quick] [--out DIR]

writes DIR/rate_sensitivity.md (the rates of each variant, HexiSeq's speedup over the best
symmetric baseline, mean and max over the cells where both fit, and the compute ceilings,
reproduce/ceilings.py), DIR/rate_sensitivity.csv (one row per variant and cell) and
DIR/rate_sensitivity.png. `--quick`: one cell (sim-32, gpt-13b, 128K). Deterministic: the planner
and the cost model only; no timing enters a number.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from .. import planner
from ..errors import HexiSeqError
from ..specs import GPUType, get_model, load_cluster, load_gpu_catalog, write_text_atomic
from ..specs.gpus import at_range_end
from ..specs.stacks import get_stack
from .ceilings import cluster_ceiling
from .palette import series_colors
from .recipes import Cell
from .scenarios import load_scenario
from .style import new_figure, style, tokens_label

SCENARIO = "simulation"
DONOR = "A100-80GB"  # the GPU whose rates the ranged GPUs borrowed before they had sources (`borrowed`)
VARIANTS = ("borrowed", "low", "mid", "high")
QUICK_CELL = ("sim-32", "gpt-13b", 131072)
DEFAULT_OUT = Path("rate_sensitivity")


def ranged_gpus(catalog: Mapping[str, GPUType]) -> dict[str, GPUType]:
    """The catalog GPUs with at least one ranged field."""
    return {n: g for n, g in catalog.items() if g.ranges}


def borrowed(gpu: GPUType, donor: GPUType) -> GPUType:
    """`gpu` at `donor`'s effective rates on the default stack (eff_matmul, and eff_attention times
    the stack's attention factor on each GPU), as before the catalog had sources for it."""
    stack = get_stack(None)
    attention = donor.eff_attention * stack.factors(donor.name)[2] / stack.factors(gpu.name)[2]
    return dataclasses.replace(gpu, eff_matmul=donor.eff_matmul, eff_attention=attention, ranges={})


def variant_catalog(catalog: Mapping[str, GPUType], variant: str) -> dict[str, GPUType]:
    """The catalog with every ranged GPU at `variant` (one of VARIANTS)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}; one of {', '.join(VARIANTS)}")
    out = dict(catalog)
    for name, g in ranged_gpus(catalog).items():
        out[name] = borrowed(g, catalog[DONOR]) if variant == "borrowed" else at_range_end(g, variant)
    return out


def scenario_cells(quick: bool = False, catalog: Mapping[str, GPUType] | None = None) -> list[Cell]:
    """The simulation scenario's cells whose cluster holds a ranged GPU (quick: QUICK_CELL only)."""
    catalog = catalog if catalog is not None else load_gpu_catalog()
    ranged = set(ranged_gpus(catalog))
    cells = [c for c in load_scenario(SCENARIO).cells if ranged & set(c.cluster.build().gpu_types)]
    if quick:
        cells = [c for c in cells if (c.cluster.name, c.model, c.seq_len) == QUICK_CELL]
    if not cells:
        raise HexiSeqError(f"no cell of the {SCENARIO} scenario holds a GPU with ranged rates ({sorted(ranged)})")
    return cells


@dataclass(frozen=True)
class Row:
    """One cell planned with one variant of the catalog."""

    variant: str
    cluster: str
    model: str
    seq_len: int
    speedup: float | None  # HexiSeq over the best symmetric baseline; None where either does not fit
    speedup_vs_all: float | None  # over the best baseline of any kind
    ceiling: float  # the compute ceiling (reproduce/ceilings.py)
    rates: tuple[tuple[str, float, float], ...]  # (ranged GPU, eff_matmul, eff_attention) of the variant


def run_cell(cell: Cell, catalog: Mapping[str, GPUType], variant: str) -> Row:
    """Plan one cell on the catalog's `variant` (the cluster file read with that catalog)."""
    cat = variant_catalog(catalog, variant)
    cluster = load_cluster(cell.cluster.source, catalog=cat)
    model, wl = get_model(cell.model), cell.workload_spec()
    try:
        result = planner.plan_cluster(cluster, model, wl, progress=False)
        speedup, vs_all = result.speedup_vs_best_symmetric, result.speedup_vs_best_baseline
    except HexiSeqError:  # nothing fits: no speedup, the ceiling still stands
        speedup = vs_all = None
    rates = tuple((n, cat[n].eff_matmul, cat[n].eff_attention) for n in ranged_gpus(catalog) if n in cluster.gpu_types)
    ceiling = cluster_ceiling(cluster, model, cell.seq_len, wl.global_batch)
    return Row(variant, cluster.name, cell.model, cell.seq_len, speedup, vs_all, ceiling, rates)


def run(quick: bool = False, catalog: Mapping[str, GPUType] | None = None) -> list[Row]:
    """Every cell of `scenario_cells` under every variant, in VARIANTS order."""
    catalog = catalog if catalog is not None else load_gpu_catalog()
    cells = scenario_cells(quick, catalog)
    return [run_cell(c, catalog, v) for v in VARIANTS for c in cells]


def summary(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Per variant: mean and max speedup over the cells where it is defined under every variant (the
    same cells for each, so the variants compare), their count, and the mean compute ceiling per cluster."""
    key = lambda r: (r.cluster, r.model, r.seq_len)  # noqa: E731
    defined = {key(r) for r in rows if r.speedup is not None}
    for r in rows:
        if r.speedup is None:
            defined.discard(key(r))
    out: dict[str, dict[str, float]] = {}
    for v in dict.fromkeys(r.variant for r in rows):
        rs = [r for r in rows if r.variant == v]
        sp = [r.speedup for r in rs if key(r) in defined and r.speedup is not None]
        d: dict[str, float] = {
            "cells": float(len(sp)),
            "speedup_mean": mean(sp) if sp else math.nan,
            "speedup_max": max(sp) if sp else math.nan,
        }
        for c in dict.fromkeys(r.cluster for r in rs):
            d[f"ceiling_{c}"] = mean(r.ceiling for r in rs if r.cluster == c)
        out[v] = d
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def csv_text(rows: Sequence[Row]) -> str:
    """One line per (variant, cell), with the ranged GPUs' rates of the variant."""
    names = list(dict.fromkeys(n for r in rows for n, _, _ in r.rates))
    head = ["variant", "cluster", "model", "seq_len", "speedup", "speedup_vs_all", "ceiling"]
    head += [f"{n}_{f}" for n in names for f in ("eff_matmul", "eff_attention")]
    lines = [",".join(head)]
    for r in rows:
        rates = {n: (m, a) for n, m, a in r.rates}
        vals = [r.variant, r.cluster, r.model, str(r.seq_len), _fmt(r.speedup, 6), _fmt(r.speedup_vs_all, 6)]
        vals.append(_fmt(r.ceiling, 6))
        vals += [_fmt(rates[n][i], 6) if n in rates else "" for n in names for i in (0, 1)]
        lines.append(",".join(vals))
    return "\n".join(lines) + "\n"


def markdown(rows: Sequence[Row], catalog: Mapping[str, GPUType], quick: bool) -> str:
    """The report: the rates of each variant, then the speedups and ceilings."""
    s = summary(rows)
    ranged = ranged_gpus(catalog)
    out = [
        "# Simulations at both ends of the catalog's rate ranges",
        "",
        "Written by `python -m hexiseq.reproduce.rate_sensitivity"
        + (" --quick" if quick else "")
        + "` (hexiseq/reproduce/rate_sensitivity.py). The catalog's value of a ranged field is the "
        "midpoint (`mid`, the catalog as it is); `low` and `high` set every ranged field of every such GPU "
        f"to that end; `borrowed` gives those GPUs {DONOR}'s effective rates on the default stack, as the "
        "catalog did before they had sources (data/validation/kernels.yaml `recommended_priors.catalog_rates`).",
        "",
        "## Rates",
        "",
        "| variant | " + " | ".join(f"{n} eff_matmul | {n} eff_attention" for n in ranged) + " |",
        "|---|" + "---:|---:|" * len(ranged),
    ]
    for v in VARIANTS:
        cat = variant_catalog(catalog, v)
        out.append(
            f"| {v} | " + " | ".join(f"{cat[n].eff_matmul:.4f} | {cat[n].eff_attention:.4f}" for n in ranged) + " |"
        )
    clusters = list(dict.fromkeys(r.cluster for r in rows))
    out += [
        "",
        "## HexiSeq speedup over the best symmetric baseline, and the compute ceilings",
        "",
        f"Mean and max over the {int(s[VARIANTS[0]]['cells'])} cells where HexiSeq and a symmetric baseline "
        "fit under every variant; ceilings: the mean over the cluster's cells of the symmetric compute-only "
        "time over the compute-bound time (reproduce/ceilings.py).",
        "",
        "| variant | speedup mean | speedup max | " + " | ".join(f"ceiling {c}" for c in clusters) + " |",
        "|---|---:|---:|" + "---:|" * len(clusters),
    ]
    for v, d in s.items():
        cols = [_fmt(d["speedup_mean"]), _fmt(d["speedup_max"])] + [_fmt(d[f"ceiling_{c}"]) for c in clusters]
        out.append(f"| {v} | " + " | ".join(cols) + " |")
    out += [
        "",
        "## Per cell",
        "",
        "| cluster | model | tokens | " + " | ".join(f"{v} speedup | {v} ceiling" for v in VARIANTS) + " |",
        "|---|---|---|" + "---:|---:|" * len(VARIANTS),
    ]
    by = {(r.variant, r.cluster, r.model, r.seq_len): r for r in rows}
    for c, m, n in dict.fromkeys((r.cluster, r.model, r.seq_len) for r in rows):
        cols = []
        for v in VARIANTS:
            r = by[v, c, m, n]
            cols += [_fmt(r.speedup), _fmt(r.ceiling)]
        out.append(f"| {c} | {m} | {tokens_label(n)} | " + " | ".join(cols) + " |")
    return "\n".join(out) + "\n"


def figure(rows: Sequence[Row]) -> Any:
    """HexiSeq's speedup per cell under each variant (markers), cells along x."""
    cells = list(dict.fromkeys((r.cluster, r.model, r.seq_len) for r in rows))
    colors = series_colors(VARIANTS)
    with style():
        fig, ax = new_figure(max(6.0, 0.45 * len(cells) + 2.0), 3.6)
        for k, v in enumerate(VARIANTS):
            xs, ys = [], []
            for i, cell in enumerate(cells):
                r = next(r for r in rows if r.variant == v and (r.cluster, r.model, r.seq_len) == cell)
                if r.speedup is not None:
                    xs.append(i + (k - 1.5) * 0.12)
                    ys.append(r.speedup)
            ax.plot(xs, ys, "o", color=colors[v], label=v, markersize=4)
        ax.axhline(1.0, color="#7f7f7f", lw=0.8, ls=":")
        ax.set_xlim(-0.5, len(cells) - 0.5)
        ax.set_xticks(range(len(cells)))
        ax.set_xticklabels([f"{c} {m.removeprefix('gpt-')} {tokens_label(n)}" for c, m, n in cells], rotation=70)
        ax.set_ylabel("speedup vs best symmetric")
        ax.set_title("simulations at the ends of the ranged GPU rates")
        ax.legend(title="rates", fontsize="small")
    return fig


def write_report(rows: Sequence[Row], out: Path, catalog: Mapping[str, GPUType], quick: bool) -> list[Path]:
    """DIR/rate_sensitivity.{md,csv,png}; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    md, csv, png = (out / f"rate_sensitivity.{x}" for x in ("md", "csv", "png"))
    write_text_atomic(md, markdown(rows, catalog, quick))
    write_text_atomic(csv, csv_text(rows))
    figure(rows).savefig(png, dpi=120)
    return [md, csv, png]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module doc)."""
    ap = argparse.ArgumentParser(
        prog="python -m hexiseq.reproduce.rate_sensitivity", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help=f"one cell ({' '.join(map(str, QUICK_CELL))})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} exists and is not a folder")
    catalog = load_gpu_catalog()
    if not ranged_gpus(catalog):
        ap.error("no catalog GPU has a ranged rate (data/gpus.yaml `ranges`): nothing to vary")
    rows = run(args.quick, catalog)
    for p in write_report(rows, args.out, catalog, args.quick):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
