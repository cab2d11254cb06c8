"""Plots for notebooks: where the tokens and heads of a Plan go, how ranks spend their time,
and how HexiSeq compares with the baselines. Every function takes library objects, draws on a
matplotlib Axes (made if not given) and returns the Figure; no logic lives here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from .plan import Plan
    from .specs import ClusterSpec

# One colour per GPU type, stable across plots (seaborn's colorblind palette order).
_PALETTE = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9"]
PHASE_COLORS = {
    "linear": "#0173b2",
    "attention": "#de8f05",
    "all_to_all": "#029e73",
    "kv_exchange": "#d55e00",
    "params": "#cc78bc",
    "optimizer": "#949494",
    "idle": "#eeeeee",
}


def gpu_colors(cluster: "ClusterSpec") -> dict[str, str]:
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(cluster.gpu_types)}


def _plt():
    import matplotlib

    matplotlib.use(matplotlib.get_backend())  # keep the notebook's backend
    import matplotlib.pyplot as plt

    return plt


def plot_layout(plan: "Plan", cluster: "ClusterSpec | None" = None, title: str | None = None) -> "Figure":
    """Two panels: the sequence axis coloured by the rank that holds each token (tokens shards,
    zigzag chunks visible), and per group the split of the query heads over its ranks."""
    plt = _plt()
    from matplotlib.patches import Patch

    lay = plan.layout()
    colors = gpu_colors(cluster) if cluster else {}

    def color(rank: int) -> str:
        if cluster:
            return colors[cluster.devices[lay[rank].device].gpu.name]
        return _PALETTE[lay[rank].group % len(_PALETTE)]

    k = plan.num_groups
    fig, (ax_seq, ax_heads) = plt.subplots(
        2, 1, figsize=(11, 2.2 + 0.28 * k), gridspec_kw={"height_ratios": [1, max(1.0, 0.35 * k)]}
    )
    # Sequence panel: one row per group so the zigzag pairing is visible.
    for r in lay:
        for a, b in r.token_ranges:
            ax_seq.barh(r.group, b - a, left=a, color=color(r.rank), edgecolor="white", linewidth=0.5)
            if (b - a) / plan.seq_len > 0.04:
                ax_seq.text((a + b) / 2, r.group, str(r.rank), ha="center", va="center", fontsize=7, color="white")
    ax_seq.set_xlim(0, plan.seq_len)
    ax_seq.set_ylim(k - 0.5, -0.5)
    ax_seq.set_yticks(range(k), [f"G{g}" for g in range(k)])
    ax_seq.set_xlabel("token position (text: rank holding the token)")
    ax_seq.set_title(title or f"{plan.name}: {plan.world_size} ranks, {k} groups, S={plan.seq_len:,}")
    # Heads panel.
    for r in lay:
        h0, h1 = r.head_range
        if h1 > h0:
            ax_heads.barh(r.group, h1 - h0, left=h0, color=color(r.rank), edgecolor="white", linewidth=0.5)
            ax_heads.text((h0 + h1) / 2, r.group, f"{r.rank}", ha="center", va="center", fontsize=7, color="white")
    ax_heads.set_xlim(0, plan.num_heads)
    ax_heads.set_ylim(k - 0.5, -0.5)
    ax_heads.set_yticks(range(k), [f"G{g} ({plan.groups[g].tokens:,} tok)" for g in range(k)])
    ax_heads.set_xlabel("query heads (text: rank)")
    if cluster:
        fig.legend(handles=[Patch(color=c, label=n) for n, c in colors.items()], loc="lower center", fontsize=8, ncol=len(colors), frameon=False)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
    else:
        fig.tight_layout()
    return fig


def plot_rank_breakdown(estimate: Any, title: str | None = None) -> "Figure":
    """Per rank: stacked time by phase (left) and memory against capacity (right)."""
    plt = _plt()
    import numpy as np

    ranks = estimate.ranks
    phases = list(ranks[0].time_s) if ranks else []
    x = np.arange(len(ranks))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 3.6))
    bottom = np.zeros(len(ranks))
    for ph in phases:
        vals = np.array([r.time_s.get(ph, 0.0) for r in ranks])
        if vals.any():
            ax_t.bar(x, vals, bottom=bottom, label=ph, color=PHASE_COLORS.get(ph))
            bottom += vals
    ax_t.axhline(estimate.iteration_time_s, color="k", lw=1, ls="--", label="iteration")
    ax_t.set_xlabel("rank")
    ax_t.set_ylabel("seconds")
    ax_t.set_title(title or "time per rank by phase")
    ax_t.legend(fontsize=7, ncol=2)
    mem = np.array([r.memory_gib for r in ranks])
    cap = np.array([r.capacity_gib for r in ranks])
    ax_m.bar(x, mem, color=["#d55e00" if m > c else "#0173b2" for m, c in zip(mem, cap)])
    ax_m.scatter(x, cap, marker="_", s=200, color="k", label="capacity")
    ax_m.set_xlabel("rank")
    ax_m.set_ylabel("GiB")
    ax_m.set_title("memory per rank")
    ax_m.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_comparison(throughputs: Mapping[str, float], bound: float | None = None, title: str = "tokens/s", highlight: str = "hexiseq") -> "Figure":
    """Horizontal bars of tokens/s per method, best first, with the compute bound as a line."""
    plt = _plt()
    items = sorted(throughputs.items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(items) + 1.2))
    ax.barh([k for k, _ in items], [v for _, v in items], color=["#de8f05" if k == highlight else "#0173b2" for k, _ in items])
    best_base = max((v for k, v in items if k != highlight), default=None)
    for i, (k, v) in enumerate(items):
        label = f"{v:,.0f}"
        if k == highlight and best_base:
            label += f"  ({v / best_base:.2f}x best baseline)"
        ax.text(v, i, " " + label, va="center", fontsize=8)
    if bound:
        ax.axvline(bound, color="k", ls="--", lw=1, label="compute bound")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("tokens/s")
    ax.set_title(title)
    ax.margins(x=0.25)
    fig.tight_layout()
    return fig


def plot_lines(x: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str, title: str = "", logx: bool = False, ref: float | None = None) -> "Figure":
    """Several named series over a shared x (sweeps: speedup vs sequence length, time vs GPUs)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", label=name)
    if ref is not None:
        ax.axhline(ref, color="k", lw=0.8, ls=":")
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
