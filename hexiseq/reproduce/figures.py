"""Figures of a results table (`table.py`): every function takes the tidy DataFrame, draws with
the house style and palette, and returns a Figure (object API). Cells where a system does not fit
are said so on the figure, never drawn as zero; the paper's values are drawn in black.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..costmodel import PHASES
from . import paper
from .ceilings import compute_ceiling_time
from .cells import DP1, HEXISEQ
from .palette import BEST_BASELINE_COLOR, HEXISEQ_COLOR, PAPER_COLOR, phase_colors, series_colors
from .sensitivity import SWEEPS
from .style import empty, legend_outside, new_figure, note, si_label, styled, throughput_axis, token_axis, tokens_label
from .table import grid_rows, hexiseq_rows, pair_ratios, table_stack

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

SPEEDUP_LABEL = "speedup over the best CP/HP baseline (x)"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def machines_label(rows: pd.DataFrame) -> str:
    """'Intel Xeon ..., 2 cores (load 1.1-3.5)' from the rows' machine column."""
    kinds: dict[str, list[float]] = {}
    for m in set(rows["machine"]) - {""}:
        what, _, load = m.partition(", load ")
        kinds.setdefault(what, []).append(float(load) if load.replace(".", "", 1).isdigit() else math.nan)
    parts = []
    for what, loads in kinds.items():
        loads = [x for x in loads if not math.isnan(x)]
        parts.append(what + (f" (1-min load {min(loads):g}-{max(loads):g} during the runs)" if loads else ""))
    return "; ".join(parts)


def cell_label(row: Any) -> str:
    return f"{row['cluster']} · {row['model']} · {tokens_label(row['seq_len'])}"


def _paper_line(ax: Any, key: str, ls: str, **kw: Any) -> None:
    f = paper.figure(key)
    ax.axhline(f.value, color=PAPER_COLOR, ls=ls, lw=1.1, label=f.legend, **kw)


def _nofit_note(ax: Any, rows: pd.DataFrame) -> None:
    """Name the cells where HexiSeq has no speedup to plot, and why."""
    if not len(rows):
        return
    nothing = rows[~rows["feasible"]]
    nobase = rows[rows["feasible"] & rows["speedup"].isna()]
    parts = []
    if len(nobase):
        parts.append(
            f"HexiSeq fits, no CP/HP baseline does: {', '.join(cell_label(r) for _, r in nobase.head(4).iterrows())}"
            + (f" (+{len(nobase) - 4})" if len(nobase) > 4 else "")
        )
    if len(nothing):
        parts.append(
            f"nothing fits: {', '.join(cell_label(r) for _, r in nothing.head(4).iterrows())}"
            + (f" (+{len(nothing) - 4})" if len(nothing) > 4 else "")
        )
    if parts:
        note(ax, "not drawn - " + "; ".join(parts))


# ----------------------------------------------------------------------------- per scenario


@styled
def fig_systems(df: pd.DataFrame, scenario: str) -> Figure:
    """HexiSeq against every baseline, every cell of a scenario: each system's tokens/s as a
    fraction of HexiSeq's (a heatmap; blank = does not fit in memory)."""
    import seaborn as sns

    rows = df[df["scenario"] == scenario].copy()
    cells = hexiseq_rows(rows).sort_values(
        ["pair", "sweep", "sweep_value", "cluster", "model", "seq_len"], kind="stable"
    )
    labels = [cell_label(r) + (f" ({r['pair_role']})" if r["pair_role"] else "") for _, r in cells.iterrows()]
    systems = list(dict.fromkeys([HEXISEQ, *rows["system"]]))
    fig, ax = new_figure(max(7.0, 0.36 * len(labels) + 3.5), 0.3 * len(systems) + 3.2)
    ax.set_title(f"{scenario}: every system's throughput as a fraction of HexiSeq's")
    if not len(cells):
        empty(ax, f"no cells for scenario {scenario!r}")
        return fig
    mat = np.full((len(systems), len(labels)), np.nan)
    for j, (_, c) in enumerate(cells.iterrows()):
        same = rows[
            (rows["cluster"] == c["cluster"])
            & (rows["model"] == c["model"])
            & (rows["seq_len"] == c["seq_len"])
            & (rows["pair_role"] == c["pair_role"])
            & (rows["sweep"] == c["sweep"])
        ]
        for _, r in same.iterrows():
            if r["feasible"] and c["feasible"] and r["tokens_per_s"] > 0:
                mat[systems.index(r["system"]), j] = r["tokens_per_s"] / c["tokens_per_s"]
    annotate = len(labels) <= 40
    sns.heatmap(
        mat,
        ax=ax,
        cmap="mako",
        vmin=0,
        vmax=max(1.0, float(np.nanmax(mat)) if np.isfinite(mat).any() else 1.0),
        annot=annotate,
        fmt=".2f",
        annot_kws={"fontsize": 6},
        linewidths=0.4,
        linecolor="white",
        cbar_kws={"label": "tokens/s relative to HexiSeq", "shrink": 0.8},
    )
    ax.set_facecolor("#f2f2f2")
    ax.set_xticks(np.arange(len(labels)) + 0.5, labels, rotation=90, fontsize=7)
    ax.set_yticks(np.arange(len(systems)) + 0.5, systems, rotation=0, fontsize=8)
    ax.set_xlabel("cell (cluster · model · sequence length)")
    ax.set_ylabel("system")
    ax.grid(False)
    nothing = int((~cells["feasible"]).sum())
    note(ax, "grey: does not fit in memory" + (f"; {nothing} cell(s) where nothing fits" if nothing else ""))
    return fig


@styled
def fig_speedup_vs_length(df: pd.DataFrame, scenarios: Sequence[str] | None = None) -> Figure:
    """Speedup over the best CP/HP baseline against sequence length, one panel per scenario, one
    line per cluster (colour) and model (marker); the paper's mean / max and points in black."""
    g = grid_rows(df)
    if scenarios is None:  # the paper's experiments when present, else every grid scenario
        scenarios = [s for s in paper.REFERENCE_LINES if (g["scenario"] == s).any()] or list(
            dict.fromkeys(g["scenario"])
        )
    scenarios = [s for s in scenarios if (g["scenario"] == s).any()]
    fig, axes = new_figure(6.0 * max(len(scenarios), 1), 5.0, 1, max(len(scenarios), 1), sharey=True)
    axes = np.atleast_1d(axes)
    if not scenarios:
        empty(axes[0], "no grid cells in the results")
        axes[0].set_title("speedup vs sequence length")
        return fig
    colors = series_colors(g["cluster"])
    models = list(dict.fromkeys(g["model"]))
    for ax, sc in zip(axes, scenarios):
        rows = g[g["scenario"] == sc]
        for (cluster, model), r in rows.groupby(["cluster", "model"], sort=False):
            r = r.sort_values("seq_len")
            if r["speedup"].notna().any():
                ax.plot(
                    r["seq_len"],
                    r["speedup"],
                    marker=MARKERS[models.index(model) % len(MARKERS)],
                    color=colors[cluster],
                    label=f"{cluster} · {model}",
                    lw=1.4,
                    ms=5,
                )
        ax.axhline(1.0, color="0.6", lw=0.8)
        for key, ls in zip(paper.REFERENCE_LINES.get(sc, ()), ("--", ":")):
            _paper_line(ax, key, ls)
        for key, _model, seq in paper.REFERENCE_POINTS.get(sc, ()):
            f = paper.figure(key)
            ax.plot([seq], [f.value], ls="none", marker="*", ms=11, color=PAPER_COLOR, label=f.legend)
        token_axis(ax.xaxis, rows["seq_len"].unique())
        ax.set_xlabel("sequence length (tokens)")
        ax.set_title(f"{sc}")
        _nofit_note(ax, rows)
    legend_outside(fig, loc="below", ncol=3)
    axes[0].set_ylabel(SPEEDUP_LABEL)
    fig.suptitle("HexiSeq speedup vs sequence length", fontweight="bold")
    return fig


@styled
def fig_speedup_vs_gpu_types(df: pd.DataFrame) -> Figure:
    """Speedup over the best CP/HP baseline against the number of GPU types in the cluster (every
    grid cell a point, a box per count); the paper's testbed and simulation means in black."""
    import seaborn as sns

    g = grid_rows(df)
    g = g[g["speedup"].notna()]
    fig, ax = new_figure(7.5, 4.2)
    ax.set_title("HexiSeq speedup vs number of GPU types")
    ax.set_xlabel("GPU types in the cluster")
    ax.set_ylabel(SPEEDUP_LABEL)
    if not len(g):
        empty(ax, "no cell with a speedup (no baseline fits, or no grid cells)")
        return fig
    order = sorted(g["gpu_types"].astype(int).unique())
    pos = {t: i for i, t in enumerate(order)}
    data = g.assign(types=g["gpu_types"].astype(int))
    ax.boxplot(
        [data.loc[data["types"] == t, "speedup"].to_numpy() for t in order],
        positions=list(range(len(order))),
        widths=0.5,
        showfliers=False,
        patch_artist=True,
        boxprops={"facecolor": "0.92", "edgecolor": "0.5"},
        medianprops={"color": "0.4"},
        whiskerprops={"color": "0.5"},
        capprops={"color": "0.5"},
    )
    colors = series_colors(data["scenario"])
    sns.stripplot(
        data=data,
        x="types",
        y="speedup",
        order=order,
        hue="scenario",
        palette=colors,
        ax=ax,
        size=4.5,
        jitter=0.15,
        legend=False,
    )
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], ls="none", marker="o", color=c, label=f"ours: {sc}") for sc, c in colors.items()
    ]  # the strip points
    for sc, (lo, hi) in paper.GPU_TYPES_OF.items():
        keys = paper.REFERENCE_LINES.get(sc, ())
        xs = [pos[t] for t in range(lo, hi + 1) if t in pos]
        if keys and xs:
            f = paper.figure(keys[0])
            handles.append(
                ax.hlines(f.value, min(xs) - 0.3, max(xs) + 0.3, color=PAPER_COLOR, ls="--", lw=1.3, label=f.legend)
            )
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


@styled
def fig_pairs(df: pd.DataFrame) -> Figure:
    """FLOP-comparable pairs: HexiSeq on the mixed cluster against the best CP/HP baseline on the
    homogeneous A100 cluster of equal peak FLOP/s (tokens/s, and their ratio; the paper's ~0.995)."""
    pr = pair_ratios(df)
    fig, (ax_t, ax_r) = new_figure(12, 0.45 * max(len(pr), 2) + 2.6, 1, 2)
    ax_t.set_title("tokens/s")
    ax_r.set_title("mixed (HexiSeq) / homogeneous (best baseline)")
    ax_t.set_xlabel("tokens/s")
    ax_r.set_xlabel("throughput ratio")
    if not len(pr):
        for ax in (ax_t, ax_r):
            empty(ax, "no FLOP-comparable pairs in the results")
        return fig
    labels = [
        f"{p.split(' vs ')[0]} · {m} · {tokens_label(s)}" for p, m, s in zip(pr["pair"], pr["model"], pr["seq_len"])
    ]
    y = np.arange(len(pr))
    ax_t.barh(
        y - 0.2, pr["mixed_tokens_per_s"].fillna(0), height=0.4, color=HEXISEQ_COLOR, label="HexiSeq, mixed cluster"
    )
    ax_t.barh(
        y + 0.2,
        pr["homogeneous_tokens_per_s"].fillna(0),
        height=0.4,
        color=BEST_BASELINE_COLOR,
        label="best baseline, homogeneous cluster",
    )
    ax_t.set_yticks(y, labels)
    ax_t.invert_yaxis()
    throughput_axis(ax_t.xaxis)
    ax_t.set_ylabel("pair · model · sequence length")
    ratio = pr["ratio"]
    ax_r.barh(y[ratio.notna()], ratio[ratio.notna()], color="0.55", height=0.6, label="ours")
    for i, v in zip(y, ratio):
        ax_r.text(
            0.0 if math.isnan(v) else v, i, " does not fit" if math.isnan(v) else f" {v:.3f}", va="center", fontsize=8
        )
    f = paper.figure("pair_a_ratio")
    ax_r.axvline(f.value, color=PAPER_COLOR, ls="--", lw=1.1, label=f.legend)
    stack = table_stack(df)
    bound = [  # the compute-bound ratio of each row: no plan on the mixed side can pass it
        compute_ceiling_time(p.split(" vs ")[1], m, int(n), 1, stack)
        / compute_ceiling_time(p.split(" vs ")[0], m, int(n), 1, stack)
        for p, m, n in zip(pr["pair"], pr["model"], pr["seq_len"])
    ]
    ax_r.scatter(bound, y, marker="|", s=220, color="k", zorder=3, label="_compute-bound ratio")
    ax_r.text(0.99, 0.01, "| compute-bound ratio", transform=ax_r.transAxes, ha="right", va="bottom", fontsize=7)
    ax_r.axvline(1.0, color="0.6", lw=0.8)
    ax_r.set_yticks(y, [""] * len(y))
    ax_r.invert_yaxis()
    ax_r.margins(x=0.15)
    legend_outside(fig, loc="below")
    return fig


@styled
def fig_planner_time(df: pd.DataFrame, machine: str = "") -> Figure:
    """The planner's wall time against cluster size (every cell; log-log), the paper's 9 s at 128
    GPUs and 444 s at 1024 GPUs as stars. Times are wall clock on `machine` (default: what the
    rows record)."""
    h = hexiseq_rows(df)
    h = h[h["plan_time_s"].notna()]
    machine = machine or machines_label(h)
    fig, ax = new_figure(7.5, 4.4)
    ax.set_title("planner time vs cluster size")
    ax.set_xlabel("GPUs in the cluster")
    ax.set_ylabel("planner wall time (s)")
    if not len(h):
        empty(ax, "no planner times in the results")
        return fig
    colors = series_colors(h["scenario"])
    for sc, r in h.groupby("scenario", sort=False):
        ax.plot(
            r["gpus"], r["plan_time_s"], ls="none", marker="o", ms=4.5, alpha=0.8, color=colors[sc], label=f"ours: {sc}"
        )
    med = h.groupby("gpus")["plan_time_s"].median()
    ax.plot(med.index, med.values, color="0.3", lw=1, label="ours: median per size")
    for key, n in paper.SCHEDULER_POINTS:
        f = paper.figure(key)
        ax.plot([n], [f.value], ls="none", marker="*", ms=13, color=PAPER_COLOR, label=f.legend)
        ax.annotate(f"{f.value:g} s", (n, f.value), xytext=(6, 4), textcoords="offset points", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    top = max(int(h["gpus"].max()), max(n for _, n in paper.SCHEDULER_POINTS))
    ax.xaxis.set_major_locator(
        FixedLocator([2**i for i in range(int(math.log2(max(int(h["gpus"].min()), 1))), int(math.log2(top)) + 1)])
    )
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    if machine:
        note(ax, f"ours: wall clock on {machine}")
    legend_outside(ax)
    return fig


@styled
def fig_phases(df: pd.DataFrame, scenario: str, cell: Any | None = None) -> Figure:
    """Where the time goes in one cell (default: the scenario's allocation cell): the critical
    rank's time by cost-model phase, for HexiSeq and every baseline that fits."""
    rows = df[df["scenario"] == scenario]
    fig, ax = new_figure(9, 4.0)
    ax.set_xlabel("seconds per iteration (the slowest rank)")
    if cell is None:
        cell = representative_cell(df, scenario)
    if cell is None:
        ax.set_title(f"{scenario}: time by phase")
        empty(ax, "no cell where HexiSeq fits")
        return fig
    r = rows[
        (rows["cluster"] == cell["cluster"])
        & (rows["model"] == cell["model"])
        & (rows["seq_len"] == cell["seq_len"])
        & (rows["pair_role"] == cell["pair_role"])
        & (rows["sweep"] == cell["sweep"])
        & rows["feasible"]
    ]
    r = r.sort_values("step_time_s")
    ax.set_title(f"{scenario}: time by phase, {cell_label(cell)}")
    y = np.arange(len(r))
    left = np.zeros(len(r))
    for phase, color in phase_colors().items():
        col = f"time_{phase}_s"
        vals = r[col].fillna(0).to_numpy() if col in r else np.zeros(len(r))
        if vals.any():
            ax.barh(y, vals, left=left, color=color, label=phase, height=0.7)
            left += vals
    missing = [p for p in PHASES if f"time_{p}_s" not in r]
    ax.plot(r["step_time_s"], y, ls="none", marker="|", ms=14, color="k", label="iteration (simulated)")
    ax.set_yticks(y, list(r["system"]))
    ax.invert_yaxis()
    ax.set_ylabel("system")
    ax.grid(axis="y", visible=False)
    if missing:
        note(ax, f"phases not in these results: {', '.join(missing)}")
    legend_outside(ax)
    return fig


def representative_cell(df: pd.DataFrame, scenario: str) -> Any | None:
    """The cell a scenario's allocation and phase pictures show: among cells where HexiSeq fits,
    mixed clusters first, then the most GPUs, the longest sequence, the highest speedup."""
    h = hexiseq_rows(df)
    h = h[(h["scenario"] == scenario) & h["feasible"]]
    if not len(h):
        return None
    key = h.assign(_mixed=h["gpu_types"] > 1, _sp=h["speedup"].fillna(0.0))
    key = key.sort_values(["_mixed", "gpus", "seq_len", "_sp"], ascending=False, kind="stable")
    return key.iloc[0]


# ----------------------------------------------------------------------------- sensitivity


@styled
def fig_sensitivity(df: pd.DataFrame, sweep: str) -> Figure:
    """One sensitivity sweep: HexiSeq's and the best CP/HP baseline's tokens/s (left) and the
    speedup (right) against the swept quantity, one line per model."""
    spec = SWEEPS[sweep]
    h = hexiseq_rows(df)
    h = h[h["sweep"] == sweep].sort_values("sweep_value")
    fig, (ax_t, ax_s) = new_figure(12, 4.2, 1, 2)
    fig.suptitle(spec.title, fontweight="bold")
    ax_t.set_title("tokens/s")
    ax_s.set_title("HexiSeq over the best CP/HP baseline")
    ax_t.set_ylabel("tokens/s")
    ax_s.set_ylabel(SPEEDUP_LABEL)
    for ax in (ax_t, ax_s):
        ax.set_xlabel(spec.xlabel)
    if not len(h):
        for ax in (ax_t, ax_s):
            empty(ax, f"no {sweep} cells in the results")
        return fig
    models = list(dict.fromkeys(h["model"]))
    for i, (model, r) in enumerate(h.groupby("model", sort=False)):
        m = MARKERS[i % len(MARKERS)]
        tag = f" · {model}" if len(models) > 1 else ""
        base_tps = r["tokens_per_s"] / r["speedup"]
        fits = r[r["feasible"]]
        if len(fits):
            ax_t.plot(fits["sweep_value"], fits["tokens_per_s"], marker=m, color=HEXISEQ_COLOR, label=f"HexiSeq{tag}")
        if base_tps.notna().any():
            ax_t.plot(
                r["sweep_value"],
                base_tps,
                marker=m,
                color=BEST_BASELINE_COLOR,
                ls="--",
                label=f"best CP/HP baseline{tag}",
            )
        if r["speedup"].notna().any():
            ax_s.plot(r["sweep_value"], r["speedup"], marker=m, color=HEXISEQ_COLOR, label=f"HexiSeq{tag}")
    ax_s.axhline(1.0, color="0.6", lw=0.8)
    ax_t.set_ylim(bottom=0)
    throughput_axis(ax_t.yaxis)
    xs = h["sweep_value"].unique()
    for ax in (ax_t, ax_s):
        _sweep_axis(ax, spec.xkind, xs)
    _nofit_note(ax_s, h)
    legend_outside(fig, loc="below")
    return fig


def _sweep_axis(ax: Any, kind: str, values: Sequence[float]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, PercentFormatter

    if kind == "tokens":
        token_axis(ax.xaxis, values)
    elif kind == "gbps":
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    elif kind == "fraction":
        ax.set_xlim(-0.05, 1.05)
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))


# ----------------------------------------------------------------------------- calibration


@styled
def fig_calibration(rows: Sequence[dict[str, Any]]) -> Figure:
    """The cost model before and after calibration against measured step times, one point per
    plan (rows: plan, measured_s, predicted_before_s, predicted_after_s); the diagonal is exact."""
    fig, ax = new_figure(8.0, 5.0)
    ax.set_title("cost model vs measured step time")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    rows = list(rows)
    if not rows:
        empty(ax, "no measured runs")
        return fig
    meas = np.array([r["measured_s"] for r in rows], dtype=float)
    for key, color, label in (
        ("predicted_before_s", BEST_BASELINE_COLOR, "before calibration"),
        ("predicted_after_s", HEXISEQ_COLOR, "after calibration"),
    ):
        pred = np.array([r.get(key, np.nan) for r in rows], dtype=float)
        if np.isfinite(pred).any():
            err = np.nanmedian(np.abs(pred / meas - 1))
            ax.plot(meas, pred, ls="none", marker="o", color=color, label=f"{label} (median error {err:.0%})")
    preds = np.array([r.get(k, np.nan) for r in rows for k in ("predicted_before_s", "predicted_after_s")], dtype=float)
    lo = min(float(np.nanmin(meas)), float(np.nanmin(preds))) * 0.85
    hi = max(float(np.nanmax(meas)), float(np.nanmax(preds))) * 1.15
    ax.plot([lo, hi], [lo, hi], color="0.5", lw=0.8, ls="--", label="exact")
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # seconds as numbers, not powers of ten
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    legend_outside(ax)
    return fig


def fig_measured_comparison(
    rows: Sequence[dict[str, Any]], title: str = "uneven vs even plan, measured (emulated CPU ranks)"
) -> Figure:
    """The planner's plan against the best even plan on one cluster (rows of `hexiseq calibrate
    --compare`: system, config, measured_s, predicted_s, predicted_profile_s): measured step time as
    bars, the calibrated and the profile-only predictions as markers on them."""
    fig, ax = new_figure(8.0, 3.2)
    ax.set_title(title)
    ax.set_xlabel("step time (s)")
    rows = list(rows)
    if not rows:
        empty(ax, "no measured runs")
        return fig
    y = np.arange(len(rows))[::-1]
    colors = [HEXISEQ_COLOR if r["system"] == "hexiseq" else BEST_BASELINE_COLOR for r in rows]
    ax.barh(y, [r["measured_s"] for r in rows], height=0.55, color=colors, alpha=0.85, label="measured (bar)")
    ax.plot([r["predicted_s"] for r in rows], y, ls="none", marker="D", color="black", label="predicted (calibrated)")
    ax.plot(
        [r["predicted_profile_s"] for r in rows],
        y,
        ls="none",
        marker="o",
        mfc="none",
        color="black",
        label="predicted (profile alone)",
    )
    ax.set_yticks(
        y, [f"{'HexiSeq' if r['system'] == 'hexiseq' else 'best even'}: {r['measured_s']:.2f} s" for r in rows]
    )
    if len(rows) == 2:
        sp = rows[1]["measured_s"] / rows[0]["measured_s"]
        note(ax, f"measured speedup of the upper plan over the lower: {sp:.2f}x")
    legend_outside(ax)
    return fig


@styled
def fig_global_batch(df: pd.DataFrame) -> Figure:
    """Tokens/s against the global batch G (the global-batch scenario: whole steps planned), one
    panel per cluster and model: HexiSeq's joint plan (replicas x sharding x CP x HP), the best
    DP x symmetric baseline, HexiSeq at DP = 1 (one replica, ZeRO-3 over all devices: the paper's
    setting) and the compute bound."""
    rows = df[df["sweep"] == "global_batch"]
    panels = list(dict.fromkeys(zip(rows["cluster"], rows["model"], rows["seq_len"])))
    fig, axes = new_figure(5.2 * max(len(panels), 1), 4.4, 1, max(len(panels), 1))
    axes = np.atleast_1d(axes)
    if not panels:
        empty(axes[0], "no global-batch cells in the results")
        axes[0].set_title("tokens/s vs global batch")
        return fig
    for ax, (cluster, model, seq) in zip(axes, panels):
        r = rows[(rows["cluster"] == cluster) & (rows["model"] == model) & (rows["seq_len"] == seq)]
        ok = r[r["feasible"].astype(bool)]
        h = ok[ok["system"] == HEXISEQ].sort_values("sweep_value")
        dp1 = ok[ok["system"] == DP1].sort_values("sweep_value")
        base = ok[ok["system"].str.startswith("dp x ")]
        best = (
            base.loc[base.groupby("sweep_value")["tokens_per_s"].idxmax()].sort_values("sweep_value")
            if len(base)
            else base
        )
        bound = h.assign(b=h["tokens_per_s"] / h["efficiency_vs_bound"])
        ax.plot(h["sweep_value"], h["tokens_per_s"], marker="o", color=HEXISEQ_COLOR, lw=1.8, label="HexiSeq joint")
        ax.plot(
            best["sweep_value"],
            best["tokens_per_s"],
            marker="s",
            color=BEST_BASELINE_COLOR,
            lw=1.4,
            label="best DP x symmetric",
        )
        ax.plot(
            dp1["sweep_value"], dp1["tokens_per_s"], marker="^", color="0.45", lw=1.2, ls="--", label="HexiSeq DP = 1"
        )
        ax.plot(bound["sweep_value"], bound["b"], color="0.2", lw=1.0, ls=":", label="compute bound")
        ax.set_xscale("log", base=2)
        from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

        ax.xaxis.set_major_locator(FixedLocator(sorted(r["sweep_value"].unique())))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(ScalarFormatter())
        throughput_axis(ax.yaxis)
        ax.set_xlabel("global batch G (sequences per step)")
        ax.set_title(f"{cluster} · {model} · {tokens_label(seq)}")
        _nofit_note(ax, r[r["system"] == HEXISEQ])
    axes[0].set_ylabel("tokens/s")
    legend_outside(fig, loc="below", ncol=4)
    fig.suptitle("Throughput vs global batch: whole steps planned", fontweight="bold")
    return fig


def sensitivity_sweeps(df: pd.DataFrame) -> list[str]:
    return [s for s in SWEEPS if (df["sweep"] == s).any()]


__all__ = [
    "fig_calibration",
    "fig_global_batch",
    "fig_measured_comparison",
    "fig_pairs",
    "fig_phases",
    "fig_planner_time",
    "fig_sensitivity",
    "fig_speedup_vs_gpu_types",
    "fig_speedup_vs_length",
    "fig_systems",
    "representative_cell",
    "sensitivity_sweeps",
    "si_label",
]
