"""`hexiseq reproduce --stacks [NAME...] [--quick]`: how the headline speedups move under each
software stack (data/stacks.yaml).

The headline cells are the ones the paper comparison's speedup rows summarize: every grid cell of
the testbed and simulation scenarios (HexiSeq's speedup over the best symmetric CP/HP baseline, the
paper's measure) and every FLOP-comparable pair (HexiSeq on the mixed cluster over the best baseline
on the homogeneous one). Each stack's cells are planned and judged on that stack by the one pipeline
(`pipeline.reproduce`, whose `compute_cells` computes them) into a results directory of its own,
`OUT/<stack>/` (results.csv, meta.json, cache: one stack per directory), and the report is made from
those tables alone:

    OUT/stacks.md                      the headline figures per stack, per-scenario spreads, largest moves
    OUT/stacks.csv                     one row per headline cell and stack (`value`, and `vs_default`:
                                       over the default stack's value of the same cell)
    OUT/figures/stack_headlines.*      each stack's value of every cell against the default stack's
    OUT/stacks.json                    the command, the version, the stacks computed and their aliases

A stack whose factors equal an earlier listed stack's on every GPU of the headline clusters computes
the same numbers: it is named beside that one (`same_as`) and not computed again. The default stack
is always computed first (the reference of `vs_default`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..errors import SpecError
from ..specs.stacks import DEFAULT_STACK_NAME, Stack, get_stack, stack_catalog
from . import paper
from .cache import REPO_DIR, model_version, write_atomic
from .comparison import compare
from .palette import PAPER_COLOR, series_colors
from .pipeline import Results, reproduce
from .scenarios import load_scenarios
from .style import empty, legend_outside, new_figure, note, save, styled, tokens_label
from .table import grid_rows, pair_ratios, speedup_stats

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

HEADLINE_SCENARIOS = (paper.TESTBED, paper.SIMULATION, paper.PAIRS)
STACKS_DIR = REPO_DIR / "out" / "reproduce-stacks"
FIGURE = "stack_headlines"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
CELL_COLUMNS = (
    "stack",
    "scenario",
    "kind",
    "cluster",
    "model",
    "seq_len",
    "pair",
    "value",
    "baseline",
    "speedup_vs_all",
    "hexiseq_tokens_per_s",
    "default_value",
    "vs_default",
)
MOVE = 0.01  # a cell's value "moves" under a stack when it differs from the default's by more than this (relative)


def default_stacks_out(quick: bool = False) -> Path:
    """The report's directory without `out`: out/reproduce-stacks (out/reproduce-stacks-quick)."""
    return STACKS_DIR.with_name(STACKS_DIR.name + "-quick") if quick else STACKS_DIR


def headline_gpus(quick: bool = False) -> list[str]:
    """The GPU types of every cluster of the headline cells, in first-seen order."""
    gpus: dict[str, None] = {}
    for sc in load_scenarios(list(HEADLINE_SCENARIOS), quick=quick):
        for cell in sc.cells:
            gpus.update(dict.fromkeys(cell.cluster.build().gpu_types))
    return list(gpus)


def same_as(names: Sequence[str], gpus: Sequence[str], stacks: dict[str, Stack] | None = None) -> dict[str, str]:
    """{stack: the first stack of `names` with its factors on every GPU of `gpus`} (itself when none
    earlier has them): stacks mapped to another give the same numbers on these GPUs."""
    stacks = stacks if stacks is not None else stack_catalog()
    out: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for n in names:
        key = tuple(get_stack(n, stacks).factors(g) for g in gpus)
        out[n] = seen.setdefault(key, n)
    return out


def headline_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The headline cells of one results table (module doc), one row each: `value` is HexiSeq's
    speedup over the best symmetric CP/HP baseline (`kind` "grid") or the pair's ratio ("pair");
    NaN where it has none (no baseline fits, or nothing does)."""
    rows: list[dict[str, Any]] = []
    for sc in (paper.TESTBED, paper.SIMULATION):
        for _, r in grid_rows(df, sc).iterrows():
            rows.append(
                {
                    "scenario": sc,
                    "kind": "grid",
                    "cluster": r["cluster"],
                    "model": r["model"],
                    "seq_len": int(r["seq_len"]),
                    "pair": "",
                    "value": r["speedup"],
                    "baseline": r["best_symmetric"],
                    "speedup_vs_all": r["speedup_vs_all"],
                    "hexiseq_tokens_per_s": r["tokens_per_s"],
                }
            )
    pr = pair_ratios(df)
    for _, r in pr[pr["scenario"] == paper.PAIRS].iterrows():
        rows.append(
            {
                "scenario": paper.PAIRS,
                "kind": "pair",
                "cluster": r["pair"].split(" vs ")[0],
                "model": r["model"],
                "seq_len": int(r["seq_len"]),
                "pair": r["pair"],
                "value": r["ratio"],
                "baseline": r["homogeneous_best"],
                "speedup_vs_all": math.nan,
                "hexiseq_tokens_per_s": r["mixed_tokens_per_s"],
            }
        )
    return pd.DataFrame(rows, columns=[c for c in CELL_COLUMNS if c not in ("stack", "default_value", "vs_default")])


def headline_figures() -> list[paper.PaperFigure]:
    """The paper's figures the report follows: its speedups and ratios (not the planner's time)."""
    return [f for f in paper.FIGURES if f.unit != "s"]


@dataclass
class StackReport:
    """The report (module doc): the stacks computed, the ones that equal them, every headline cell
    per computed stack, the paper's headline figures per stack, and each stack's results."""

    directory: Path
    stacks: list[str]
    same_as: dict[str, str]
    cells: pd.DataFrame
    headlines: pd.DataFrame
    results: dict[str, Results] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def _check_names(names: Sequence[str]) -> list[str]:
    for n in names:
        get_stack(n)  # an unknown name fails here, before any planning
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise SpecError(f"--stacks names {', '.join(dup)} more than once")
    return [DEFAULT_STACK_NAME] + [n for n in names if n != DEFAULT_STACK_NAME]


def stack_report(
    stacks: Sequence[str] | None = None,
    quick: bool = False,
    out: Path | str | None = None,
    force: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> StackReport:
    """Compute the headline cells on each stack of `stacks` (default: every stack of data/stacks.yaml;
    the default stack always, first) and write the report (module doc) into `out` (default
    `default_stacks_out(quick)`)."""
    names = _check_names(list(stacks) if stacks else list(stack_catalog()))
    out = Path(out) if out is not None else default_stacks_out(quick)
    alias = same_as(names, headline_gpus(quick))
    computed = [n for n in names if alias[n] == n]
    results = {
        n: reproduce(
            list(HEADLINE_SCENARIOS), quick=quick, out=out / n, force=force, progress=progress, draw=False, stack=n
        )
        for n in computed
    }
    cells = stack_cells({n: r.table for n, r in results.items()})
    headlines = pd.DataFrame(
        [
            {
                "figure": f.what,
                "key": f.key,
                "paper": f.value,
                **{n: _value(rows, f.key) for n, rows in ((n, compare(r.table)) for n, r in results.items())},
            }
            for f in headline_figures()
        ]
    )
    meta = {
        "command": command
        or "hexiseq reproduce --stacks "
        + " ".join(names)
        + (" --quick" if quick else "")
        + (f" --out {out}" if out != default_stacks_out(quick) else ""),
        "version": model_version(),
        "quick": quick,
        "stacks": names,
        "computed": computed,
        "same_as": {n: a for n, a in alias.items() if a != n},
        "cells": {n: int(len(cells[cells["stack"] == n])) for n in computed},
    }
    report = StackReport(out, computed, alias, cells, headlines, results, meta)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "stacks.csv", cells.to_csv(index=False, float_format="%.10g"))
    write_atomic(out / "stacks.md", markdown(report))
    write_atomic(out / "stacks.json", json.dumps(meta, indent=1) + "\n")
    save(fig_stack_headlines(cells), out / "figures", FIGURE)
    return report


def _value(rows: list[Any], key: str) -> float:
    c = next(c for c in rows if c.figure.key == key)
    return math.nan if c.ours is None else float(c.ours)


def stack_cells(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """stacks.csv: the headline cells of each stack's results table (`tables`, the default stack's
    first), with the default stack's value of the same cell and the ratio to it."""
    names = list(tables)
    if not names or names[0] != DEFAULT_STACK_NAME:
        raise SpecError(f"the stacks report compares with the default stack {DEFAULT_STACK_NAME!r}: it comes first")
    keys = ["scenario", "cluster", "model", "seq_len", "pair"]
    ref = headline_cells(tables[DEFAULT_STACK_NAME])[keys + ["value"]].rename(columns={"value": "default_value"})
    parts = []
    for n in names:
        h = headline_cells(tables[n]).merge(ref, on=keys, how="left")
        h.insert(0, "stack", n)
        h["vs_default"] = h["value"] / h["default_value"]
        parts.append(h)
    return pd.concat(parts, ignore_index=True)[list(CELL_COLUMNS)]


def _fmt(v: float, unit: str = "x") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.2f}x" if unit == "x" else f"{v:.3f}"


def _factors(st: Stack, gpus: Sequence[str]) -> str:
    """The stack's non-unit factors on the headline GPUs, grouped by equal factors."""
    by: dict[tuple, list[str]] = {}
    for g in gpus:
        by.setdefault(st.factors(g), []).append(g)
    parts = []
    for (m, lg, a), gs in by.items():
        f = [f"{k} {v:.5g}" for k, v in (("matmul", m), ("layer GEMMs", lg), ("attention", a)) if v != 1.0]
        parts.append(f"{'/'.join(gs)}: {', '.join(f) if f else 'catalog rates'}")
    return "; ".join(parts)


def markdown(report: StackReport) -> str:
    """stacks.md: what each stack is on these GPUs, the paper's headline figures per stack, each
    scenario's spread per stack, and the cells that move most."""
    meta, cells = report.meta, report.cells
    gpus = headline_gpus(bool(meta.get("quick")))
    names = report.stacks
    lines = [
        "# Headline speedups under each software stack",
        "",
        f"Generated by `{meta.get('command', 'hexiseq reproduce --stacks')}`; do not edit by hand. Cost-model "
        f"version `{meta.get('version', '?')}`"
        + (", QUICK grid (a subset of the headline cells)" if meta.get("quick") else "")
        + ". Every cell of the testbed, simulation and pairs scenarios planned for HexiSeq and every baseline, "
        "all judged on the stack's kernel rates (data/stacks.yaml); each stack's results are in its own "
        "directory (`<stack>/results.csv`). Speedups are over the best symmetric CP/HP baseline (the paper's "
        "measure); a pair's value is HexiSeq on the mixed cluster over the best baseline on the homogeneous one.",
        "",
        "## The stacks on the headline GPUs",
        "",
        "| stack | factors over the catalog's rates | |",
        "|---|---|---|",
    ]
    for n in meta.get("stacks", names):
        st = get_stack(n)
        alias = report.same_as.get(n, n)
        where = "computed" if alias == n else f"same factors as {alias} on these GPUs: same numbers, not recomputed"
        lines.append(f"| {n}{' (default)' if n == DEFAULT_STACK_NAME else ''} | {_factors(st, gpus)} | {where} |")
    lines += [
        "",
        "## The paper's headline figures",
        "",
        "| figure | paper | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for _, r in report.headlines.iterrows():
        unit = paper.figure(r["key"]).unit
        lines.append(
            f"| {r['figure']} | {_fmt(r['paper'], unit)} | " + " | ".join(_fmt(r[n], unit) for n in names) + " |"
        )
    lines += [
        "",
        "## Per scenario",
        "",
        f'Mean, min and max of the headline value over the cells that have one; "moved": cells whose value differs '
        f"from the default stack's by more than {MOVE:.0%}.",
        "",
        "| scenario | stack | cells | mean | min | max | moved up | moved down |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sc in HEADLINE_SCENARIOS:
        for n in names:
            g = cells[(cells["stack"] == n) & (cells["scenario"] == sc)]
            if not len(g):
                continue
            st = speedup_stats(g, "value")
            unit = "" if sc == paper.PAIRS else "x"
            up = int((g["vs_default"] > 1 + MOVE).sum())
            down = int((g["vs_default"] < 1 - MOVE).sum())
            lines.append(
                f"| {sc} | {n} | {st['cells']} of {len(g)} | {_fmt(st.get('mean', math.nan), unit)} | "
                f"{_fmt(st.get('min', math.nan), unit)} | {_fmt(st.get('max', math.nan), unit)} | "
                + (f"{up} | {down} |" if n != DEFAULT_STACK_NAME else "— | — |")
            )
    moves = cells[(cells["stack"] != DEFAULT_STACK_NAME) & cells["vs_default"].notna()]
    if len(moves):
        lines += [
            "",
            "## Largest moves",
            "",
            f"Per stack, the cell that moves most up and the one that moves most down (by more than {MOVE:.0%}).",
            "",
            "| stack | cell | default | this stack | ratio |",
            "|---|---|---|---|---|",
        ]
        for n in names[1:]:
            g = moves[moves["stack"] == n]
            if not len(g):
                continue
            picks = [
                i for i in (g["vs_default"].idxmax(), g["vs_default"].idxmin()) if abs(g.at[i, "vs_default"] - 1) > MOVE
            ]
            for _, r in g.loc[list(dict.fromkeys(picks))].iterrows():
                unit = "" if r["kind"] == "pair" else "x"
                lines.append(
                    f"| {n} | {r['cluster']} · {r['model']} · {tokens_label(r['seq_len'])} | "
                    f"{_fmt(r['default_value'], unit)} | {_fmt(r['value'], unit)} | {r['vs_default']:.3f} |"
                )
    lines += ["", f"Every cell: `stacks.csv`; figure: `figures/{FIGURE}.png`.", ""]
    return "\n".join(lines)


@styled
def fig_stack_headlines(cells: pd.DataFrame) -> Figure:
    """Each non-default stack's value of every headline cell against the default stack's, one panel
    per headline scenario; on the diagonal the stack changes nothing."""
    others = [n for n in dict.fromkeys(cells["stack"]) if n != DEFAULT_STACK_NAME]
    colors = series_colors(others)
    fig, axes = new_figure(13, 4.4, 1, len(HEADLINE_SCENARIOS))
    for ax, sc in zip(axes, HEADLINE_SCENARIOS):
        is_pair = sc == paper.PAIRS
        ax.set_title(f"{sc}: " + ("pair ratio" if is_pair else "speedup"))
        ax.set_xlabel(f"{DEFAULT_STACK_NAME} (default stack)")
        ax.set_ylabel("under the stack")
        g = cells[(cells["scenario"] == sc) & (cells["stack"] != DEFAULT_STACK_NAME)]
        g = g[g["value"].notna() & g["default_value"].notna()]
        if not len(g):
            empty(ax, f"no {sc} cell with a value under two stacks")
            continue
        for i, n in enumerate(others):
            s = g[g["stack"] == n]
            ax.scatter(s["default_value"], s["value"], s=28, marker=MARKERS[i % len(MARKERS)], color=colors[n], label=n)
        lo = float(min(g["value"].min(), g["default_value"].min()))
        hi = float(max(g["value"].max(), g["default_value"].max()))
        pad = 0.04 * (hi - lo or 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color=PAPER_COLOR, lw=0.8, ls=":", label="_same")
        missing = cells[(cells["scenario"] == sc) & (cells["stack"] != DEFAULT_STACK_NAME)]
        missing = missing[missing["value"].isna() | missing["default_value"].isna()]
        n_missing = len(missing.drop_duplicates(["cluster", "model", "seq_len", "pair"]))
        if n_missing:
            note(ax, f"{n_missing} cell(s) without a value under one of the stacks (no baseline or nothing fits)")
    legend_outside(fig, title="stack (dotted: no change)", loc="below")
    return fig
