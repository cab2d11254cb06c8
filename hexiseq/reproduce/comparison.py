"""`paper_comparison.md`: every figure the paper publishes (`paper.py`) next to ours, computed
from the results table, with the reasons where they differ — what our reproduction does that the
paper's measurement did not, facts of our inputs that move the number (computed from the same
table and catalog), and the assumptions the paper does not state.

Our value "agrees" when it is within `TOLERANCE` (relative) of the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..specs.stacks import DEFAULT_STACK_NAME
from . import paper
from .ceilings import compute_ceiling, compute_ceiling_time
from .style import tokens_label
from .table import grid_rows, hexiseq_rows, pair_ratios, speedup_stats, table_stack

TOLERANCE = 0.05


@dataclass
class Comparison:
    figure: paper.PaperFigure
    ours: float | None  # None: the results hold no cell this figure needs
    detail: str  # what our number is made of
    reasons: list[str] = field(default_factory=list)  # why it differs (empty when it agrees)
    facts: list[Any] = field(default_factory=list)  # the computed reasons (Fact, with the numbers they quote)

    @property
    def status(self) -> str:
        if self.ours is None or (isinstance(self.ours, float) and math.isnan(self.ours)):
            return "not computed"
        return "agrees" if abs(self.ours / self.figure.value - 1) <= TOLERANCE else "differs"

    def value_text(self, v: float | None) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "—"
        return self.figure.format(v)


# ----------------------------------------------------------------------------- facts of our inputs

# A bullet quotes numbers of results.csv rows; each is recorded as (scenario, cluster, model, seq_len,
# system, pair_role, column, value) so a test can check it against the table.
Quote = tuple[str, str, str, int, str, str, str, float]
PARAM_SHARE = 0.20  # parameter traffic at least this share of a step is named as a reason


@dataclass(frozen=True)
class Fact:
    """One bullet of a row: its text and the results.csv values it quotes."""

    text: str
    quotes: tuple[Quote, ...] = ()
    ceilings: tuple[tuple[str, str, int, int, float], ...] = ()  # (cluster, model, seq_len, batch, ceiling)

    def __str__(self) -> str:
        return self.text


def _key(c: pd.Series) -> tuple:
    return (c["scenario"], c["cluster"], c["model"], int(c["seq_len"]))


def _row_of(df: pd.DataFrame, c: pd.Series, system: str) -> pd.Series | None:
    r = df[
        (df["scenario"] == c["scenario"])
        & (df["cluster"] == c["cluster"])
        & (df["model"] == c["model"])
        & (df["seq_len"] == c["seq_len"])
        & (df["system"] == system)
        & (df["pair_role"] == c["pair_role"])
        & (df["sweep"] == c["sweep"])
    ]
    return r.iloc[0] if len(r) else None


def _q(r: pd.Series, column: str) -> Quote:
    return (*_key(r), r["system"], r["pair_role"], column, float(r[column]))


def _cell_label(c: pd.Series) -> str:
    return f"{c['cluster']}, {c['model']}, {tokens_label(c['seq_len'])}"


def _ceiling_fact(cells: pd.DataFrame) -> list[Fact]:
    """The compute ceiling of the cells, and the cells whose speedup exceeds it (memory or links
    hold the baseline back there)."""
    rows = [
        (c, compute_ceiling(c["cluster"], c["model"], int(c["seq_len"]), int(c["global_batch"]), table_stack(cells)))
        for _, c in cells.iterrows()
        if not math.isnan(c["speedup"])
    ]
    if not rows:
        return []
    ceils = [x for _, x in rows]
    lo, hi = min(ceils), max(ceils)
    span = f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"
    marks = tuple((c["cluster"], c["model"], int(c["seq_len"]), int(c["global_batch"]), x) for c, x in rows)
    out = [
        Fact(
            f"compute ceiling of these cells {span}: a perfect split of the work by each device's kernel rates "
            "over a symmetric layout that runs every device at the slowest one's pace (no communication, "
            "memory or recompute)",
            ceilings=marks,
        )
    ]
    above = [(c, x) for c, x in rows if c["speedup"] > x * 1.005]
    if above:
        c, x = max(above, key=lambda t: t[0]["speedup"] / t[1])
        out.append(
            Fact(
                f"in {len(above)} of {len(rows)} cells the speedup exceeds the compute ceiling (e.g. {_cell_label(c)}: "
                f"{c['speedup']:.2f}x over a ceiling of {x:.2f}x): there memory or the links hold the best "
                "baseline back, not compute",
                (_q(c, "speedup"),),
                ((c["cluster"], c["model"], int(c["seq_len"]), int(c["global_batch"]), x),),
            )
        )
    return out


def _param_fact(df: pd.DataFrame, cells: pd.DataFrame) -> list[Fact]:
    """Cells where parameter traffic is a large share of HexiSeq's step and of the best baseline's."""
    hits = []
    for _, c in cells.iterrows():
        b = _row_of(df, c, c["best_symmetric"]) if c["best_symmetric"] else None
        if b is None or not c["step_time_s"] > 0:
            continue
        share = c["time_param_comm_s"] / c["step_time_s"]
        if share >= PARAM_SHARE:
            hits.append((share, c, b))
    if not hits:
        return []
    share, c, b = max(hits, key=lambda t: t[0])
    return [
        Fact(
            f"in {len(hits)} of {len(cells)} cells parameter traffic (ZeRO-3 gathers and reduce-scatters over the "
            f"links) is at least {PARAM_SHARE:.0%} of HexiSeq's step (most: {_cell_label(c)}, "
            f"{c['time_param_comm_s']:.2f} s of {c['step_time_s']:.2f} s; the best baseline {b['system']} "
            f"{b['time_param_comm_s']:.2f} s of {b['step_time_s']:.2f} s): both sides pay it, which pulls the "
            "speedup toward 1",
            (_q(c, "time_param_comm_s"), _q(c, "step_time_s"), _q(b, "time_param_comm_s"), _q(b, "step_time_s")),
        )
    ]


def _recompute_fact(df: pd.DataFrame, cells: pd.DataFrame, baseline_column: str = "best_symmetric") -> list[Fact]:
    """Cells where the two sides' recompute seconds differ, each side's seconds quoted."""
    less, more = [], []
    for _, c in cells.iterrows():
        b = _row_of(df, c, c[baseline_column]) if c[baseline_column] else None
        if b is None:
            continue
        h, o = float(c["time_recompute_s"]), float(b["time_recompute_s"])
        if h + 0.01 < o:
            less.append((c, b))
        elif o + 0.01 < h:
            more.append((c, b))
    out = []
    for group, word in ((less, "less"), (more, "more")):
        if group:
            c, b = group[0]
            out.append(
                Fact(
                    f"in {len(group)} of {len(cells)} cells HexiSeq spends {word} on recompute than the best baseline "
                    f"(e.g. {_cell_label(c)}: {c['time_recompute_s']:.2f} s vs {b['system']}'s "
                    f"{b['time_recompute_s']:.2f} s per step)",
                    (_q(c, "time_recompute_s"), _q(b, "time_recompute_s")),
                )
            )
    return out


def _subset_baselines(df: pd.DataFrame, cells: pd.DataFrame) -> Fact | None:
    """How many of these cells' best CP/HP baselines leave devices out, with the speedup over the
    best all-device baseline beside the subset one."""
    hits = []
    for _, c in cells.iterrows():
        b = _row_of(df, c, c["best_symmetric"]) if c["best_symmetric"] else None
        if b is not None and b["devices_used"] < c["gpus"]:
            hits.append((c, b))
    if not hits:
        return None
    c, b = hits[0]
    vs_all = (
        f"; over the best all-device baseline {c['speedup_vs_all']:.2f}x"
        if not math.isnan(c["speedup_vs_all"])
        else "; no all-device baseline fits"
    )
    return Fact(
        f"in {len(hits)} of {len(cells)} cells the best CP/HP baseline runs on a subset of the devices (e.g. "
        f"{b['system']} on {int(b['devices_used'])} of {int(c['gpus'])} GPUs, {_cell_label(c)}: speedup "
        f"{c['speedup']:.2f}x{vs_all}): our baselines may leave slow GPUs out, which makes them stronger than "
        "baselines that must use every device",
        (
            _q(b, "devices_used"),
            _q(c, "speedup"),
            *((_q(c, "speedup_vs_all"),) if not math.isnan(c["speedup_vs_all"]) else ()),
        ),
    )


def _no_baseline(cells: pd.DataFrame) -> str | None:
    nb = cells[cells["feasible"] & cells["speedup"].isna()]
    nothing = cells[~cells["feasible"]]
    parts = []
    if len(nb):
        parts.append(f"{len(nb)} cell(s) where HexiSeq fits but no CP/HP baseline does (no speedup to average)")
    if len(nothing):
        parts.append(f"{len(nothing)} cell(s) where nothing fits in memory")
    return ("left out of our value: " + "; ".join(parts)) if parts else None


def _batch(cells: pd.DataFrame, paper_batch: int | None) -> str | None:
    if paper_batch is None or not len(cells):
        return None
    ours = sorted({int(b) for b in cells["global_batch"].dropna()})
    if ours and ours != [paper_batch]:
        return f"global batch: ours {', '.join(map(str, ours))}, the paper's testbed {paper_batch} (likely)"
    return None


def _direction(ours: float, ref: float) -> str:
    return "higher" if ours > ref else "lower"


def _describe(cells: pd.DataFrame) -> str:
    if not len(cells):
        return "no cells"
    lens = sorted(cells["seq_len"].unique())
    span = tokens_label(lens[0]) if len(lens) == 1 else f"{tokens_label(lens[0])}-{tokens_label(lens[-1])}"
    return (
        f"{len(cells)} cell{'s' if len(cells) != 1 else ''}: {', '.join(dict.fromkeys(cells['cluster']))}; "
        f"{', '.join(dict.fromkeys(cells['model']))}; {span}"
    )


# ----------------------------------------------------------------------------- the figures


def _speedup(
    df: pd.DataFrame,
    scenario: str,
    stat: str,
    model: str | None = None,
    seq_len: int | None = None,
    measured: bool = False,
) -> tuple[float | None, str, list[str]]:
    cells = grid_rows(df, scenario)
    if model is not None:
        cells = cells[cells["model"] == model]
    if seq_len is not None:
        cells = cells[cells["seq_len"] == seq_len]
    st = speedup_stats(cells)
    if not st["cells"]:
        return (
            None,
            f"needs {scenario} cells"
            + (f" for {model}" if model else "")
            + (f" at {tokens_label(seq_len)}" if seq_len else ""),
            [],
        )
    v = st[stat]
    detail = f"{stat} over {_describe(cells[cells['speedup'].notna()])}"
    if stat == "max":
        best = cells.loc[cells["speedup"].idxmax()]
        detail += f"; at {best['cluster']}, {best['model']}, {tokens_label(best['seq_len'])}"
    if seq_len is not None or (model is not None and len(cells) > 1):
        detail += "; per cell " + ", ".join(
            f"{r['cluster']} {tokens_label(r['seq_len'])}: {r['speedup']:.2f}x"
            for _, r in cells.iterrows()
            if not math.isnan(r["speedup"])
        )
    facts = []
    if measured:
        facts.append(
            "ours is the cost model's prediction (simulated step times); the paper's figure is measured on hardware"
        )
    facts += _ceiling_fact(cells) + _param_fact(df, cells) + _recompute_fact(df, cells)
    facts += [
        x for x in (_subset_baselines(df, cells), _no_baseline(cells), _batch(cells, 8 if measured else None)) if x
    ]
    return v, detail, facts


def _pair(df: pd.DataFrame) -> tuple[float | None, str, list[str]]:
    pr = pair_ratios(df)
    a = pr[pr["pair"] == paper.PAIR_A]
    if not len(a) or a["ratio"].isna().all():
        return None, f"needs the pair {paper.PAIR_A}", []
    detail = "mean over " + ", ".join(
        f"{r['model']} {tokens_label(r['seq_len'])}: {r['ratio']:.3f} (vs {r['homogeneous_best']})"
        for _, r in a.iterrows()
        if not math.isnan(r["ratio"])
    )
    facts: list[Any] = []
    h = hexiseq_rows(df)
    mixed_name, homo_name = paper.PAIR_A.split(" vs ")
    mixed, homo = h[h["cluster"] == mixed_name], h[h["cluster"] == homo_name]
    stack = table_stack(df)
    if len(mixed) and len(homo):
        m, o = mixed.iloc[0], homo.iloc[0]
        bounds = []
        for _, r in a.iterrows():
            one = lambda name, r=r: compute_ceiling_time(name, r["model"], int(r["seq_len"]), 1, stack)  # noqa: E731
            bounds.append(one(homo_name) / one(mixed_name))
        lo, hi = min(bounds), max(bounds)
        span = f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"
        facts.append(
            Fact(
                f"the pair is matched by peak FLOP/s ({m['peak_pflops']:.1f} vs {o['peak_pflops']:.1f} PFLOP/s), but "
                f"at the cost model's rates (the {stack or DEFAULT_STACK_NAME} stack) the mixed side's "
                f"compute-bound throughput is {span}x "
                f"the homogeneous side's "
                f"(effective matmul {m['matmul_pflops']:.1f} vs {o['matmul_pflops']:.1f} PFLOP/s, "
                f"{m['matmul_pflops'] / o['matmul_pflops']:.2f}x; memory "
                f"{m['memory_gib']:,.0f} vs {o['memory_gib']:,.0f} GiB): matching peak FLOP/s does not match the rates "
                "the plans run at",
                (_q(m, "peak_pflops"), _q(o, "peak_pflops"), _q(m, "matmul_pflops"), _q(o, "matmul_pflops")),
            )
        )
        for _, r in a.iterrows():
            mc = mixed[(mixed["model"] == r["model"]) & (mixed["seq_len"] == r["seq_len"])]
            oc = df[
                (df["cluster"] == homo_name)
                & (df["model"] == r["model"])
                & (df["seq_len"] == r["seq_len"])
                & (df["system"] == r["homogeneous_best"])
            ]
            if len(mc) and len(oc):
                x, y = mc.iloc[0], oc.iloc[0]
                if abs(float(x["time_recompute_s"]) - float(y["time_recompute_s"])) > 0.01:
                    facts.append(
                        Fact(
                            f"{r['model']} {tokens_label(r['seq_len'])}: recompute {x['time_recompute_s']:.2f} s per "
                            f"step on the mixed side vs {y['time_recompute_s']:.2f} s on the homogeneous side "
                            f"({y['system']})",
                            (_q(x, "time_recompute_s"), _q(y, "time_recompute_s")),
                        )
                    )
    return float(a["ratio"].mean()), detail, facts


def _scheduler(df: pd.DataFrame, gpus: int) -> tuple[float | None, str, list[str]]:
    h = hexiseq_rows(df)
    h = h[(h["gpus"] == gpus) & h["plan_time_s"].notna()]
    scaling = h[h["scenario"] == paper.SCALING]
    h = scaling if len(scaling) else h
    if not len(h):
        return None, f"needs a cell with {gpus} GPUs", []
    v = float(h["plan_time_s"].median())
    detail = (
        f"median over {len(h)} cell(s) ({', '.join(dict.fromkeys(h['cluster']))}; "
        f"{', '.join(f'{m} at {tokens_label(s)}' for m, s in dict.fromkeys(zip(h['model'], h['seq_len'])))})"
    )
    from .figures import machines_label

    facts = [
        f"wall clock on {machines_label(h) or 'this machine'}, one process, HiGHS embedded: a different machine or "
        f"load gives a different time"
    ]
    return v, detail, facts


def _rules() -> dict[str, Callable[[pd.DataFrame], tuple[float | None, str, list[str]]]]:
    T, S = paper.TESTBED, paper.SIMULATION
    return {
        "testbed_mean": lambda df: _speedup(df, T, "mean", measured=True),
        "testbed_max": lambda df: _speedup(df, T, "max", measured=True),
        "sim_mean": lambda df: _speedup(df, S, "mean"),
        "sim_max": lambda df: _speedup(df, S, "max"),
        "testbed_7b_16k": lambda df: _speedup(df, T, "mean", "gpt-7b", 16 * 1024, measured=True),
        "testbed_7b_32k": lambda df: _speedup(df, T, "mean", "gpt-7b", 32 * 1024, measured=True),
        "testbed_13b": lambda df: _speedup(df, T, "mean", "gpt-13b", measured=True),
        "pair_a_ratio": _pair,
        "sched_128": lambda df: _scheduler(df, 128),
        "sched_1024": lambda df: _scheduler(df, 1024),
    }


def compare(df: pd.DataFrame) -> list[Comparison]:
    """Every paper figure against the results (a figure without a rule here is reported as not
    computed, so a figure added to paper.py is never silently dropped)."""
    rules = _rules()
    out = []
    for f in paper.FIGURES:
        if f.key not in rules:
            out.append(Comparison(f, None, "no rule computes this figure yet"))
            continue
        v, detail, facts = rules[f.key](df)
        c = Comparison(f, v, detail)
        if c.status == "differs":
            c.reasons = [f"ours is {_direction(v, f.value)} ({v / f.value:.2f}x the paper's)", *map(str, facts)]
            c.facts = list(facts)
            if f.unstated:
                c.reasons.append("the paper does not state " + "; ".join(f.unstated))
        out.append(c)
    return out


def markdown(rows: list[Comparison], meta: dict[str, Any]) -> str:
    """The comparison as a Markdown document (the table, then the reasons per differing figure)."""
    runs = meta.get("scenarios", {})
    quick = sorted(n for n, s in runs.items() if s.get("quick"))
    lines = [
        "# The HexiSeq paper's figures vs this reproduction",
        "",
        "Generated by `" + meta.get("command", "hexiseq reproduce") + "`; do not edit by hand. "
        f"Cost-model version `{meta.get('version', '?')}`, software stack `{meta.get('stack', DEFAULT_STACK_NAME)}` "
        f"(data/stacks.yaml), {meta.get('cells', '?')} cells"
        + (f" — QUICK grid for {', '.join(quick)} (a subset: not the paper's experiments in full)" if quick else "")
        + ".",
        "Our values are the cost model's predictions: HexiSeq's plan and every baseline (ring, Ulysses, USP over "
        "every legal "
        "CP x HP factorization and placement, on all devices and on each single GPU type, and a FLOP-proportional "
        "split), "
        "all judged by the same step simulator. Speedups are over the best symmetric CP/HP baseline, as the paper "
        "reports. "
        f'"agrees": within {TOLERANCE:.0%} of the paper\'s value.',
        "",
        "| figure | paper | ours | | what ours is |",
        "|---|---|---|---|---|",
    ]
    for c in rows:
        f = c.figure
        lines.append(
            f"| {f.what} | {c.value_text(f.value)} ({f.certainty}) | {c.value_text(c.ours)} | {c.status} | {c.detail} |"
        )
    differing = [c for c in rows if c.reasons]
    if differing:
        lines += ["", "## Where ours differs, and why", ""]
        for c in differing:
            lines.append(f"**{c.figure.what}** — paper {c.value_text(c.figure.value)}, ours {c.value_text(c.ours)}")
            lines += [f"- {r}" for r in c.reasons]
            lines.append("")
    missing = [c for c in rows if c.status == "not computed"]
    if missing:
        lines += ["## Not computed in these results", ""] + [f"- {c.figure.what}: {c.detail}" for c in missing] + [""]
    lines += [
        "## Certainty of the paper's figures",
        "",
        '"abstract": stated in the paper\'s abstract. "summary": from two independent summaries of the full paper '
        "(likely, not verified); see the project's notes on the paper.",
        "",
    ]
    return "\n".join(lines).rstrip() + "\n"


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per scenario of plain grid cells: cells, mean / max / min speedup, and the paper's mean / max."""
    out = []
    for sc in dict.fromkeys(grid_rows(df)["scenario"]):
        st = speedup_stats(grid_rows(df, sc))
        keys = paper.REFERENCE_LINES.get(sc, (None, None))
        out.append(
            {
                "scenario": sc,
                "cells": st["cells"],
                "cells without a speedup": st["without"],
                "mean": st.get("mean"),
                "max": st.get("max"),
                "min": st.get("min"),
                "paper mean": paper.figure(keys[0]).value if keys[0] else None,
                "paper max": paper.figure(keys[1]).value if keys[1] else None,
            }
        )
    return pd.DataFrame(out)
