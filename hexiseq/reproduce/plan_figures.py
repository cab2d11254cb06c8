"""Figures of one plan: where its tokens and heads go (readable from 4 to 1024 ranks), how its
ranks spend their time by cost-model phase, and how its throughput compares with the baselines.

Shares are of the iteration's work: rank r's token share is s_r / S (the linear layers), its
attention share 2·η_r·L_g / (H·S) (the causal pairs of its group's two chunks times its head
fraction; both sum to 1 over the ranks). Large plans are drawn per node and per GPU type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .palette import BEST_BASELINE_COLOR, HEXISEQ_COLOR, IDLE_COLOR, gpu_color, phase_colors
from .style import empty, legend_outside, new_figure, note, si_label, styled, throughput_axis, tokens_label

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ..plan import Plan
    from ..specs import ClusterSpec

DETAIL_MAX_RANKS = 64  # up to this many ranks every rank is drawn; beyond, nodes and GPU types
DETAIL_MAX_GROUPS = 24


def rank_shares(plan: Plan, cluster: ClusterSpec) -> list[dict[str, Any]]:
    """Per rank: device, node, GPU type, group, token share and attention share (module doc)."""
    lay = plan.layout()
    S, H = plan.seq_len, plan.num_heads
    out = []
    for r in lay:
        dev = cluster.devices[r.device]
        L = plan.groups[r.group].chunk_len
        out.append(
            {
                "rank": r.rank,
                "device": r.device,
                "node": dev.node,
                "gpu": dev.gpu.name,
                "group": r.group,
                "tokens": r.num_tokens,
                "heads": r.heads,
                "token_share": r.num_tokens / S,
                "attention_share": 2.0 * r.heads * L / (H * S),
                "layout": r,
            }
        )
    return out


def type_summary(plan: Plan, cluster: ClusterSpec) -> dict[str, dict[str, float]]:
    """Per GPU type: devices used / available, its share of the cluster's matmul FLOP/s, of the
    tokens and of the attention work."""
    shares = rank_shares(plan, cluster)
    total_flops = sum(d.gpu.matmul_flops for d in cluster.devices)
    out: dict[str, dict[str, float]] = {}
    for name, count in cluster.gpu_types.items():
        mine = [s for s in shares if s["gpu"] == name]
        flops = sum(d.gpu.matmul_flops for d in cluster.devices if d.gpu.name == name)
        out[name] = {
            "devices": count,
            "used": len(mine),
            "compute_share": flops / total_flops,
            "token_share": sum(s["token_share"] for s in mine),
            "attention_share": sum(s["attention_share"] for s in mine),
        }
    return out


def left_out(plan: Plan, cluster: ClusterSpec) -> dict[str, list[int]]:
    """{GPU type: device indices the plan does not use}."""
    used = set(plan.rank_devices)
    out: dict[str, list[int]] = {}
    for d in cluster.devices:
        if d.index not in used:
            out.setdefault(d.gpu.name, []).append(d.index)
    return out


def _summary_panel(ax: Any, plan: Plan, cluster: ClusterSpec) -> list[Any]:
    import numpy as np

    summ = type_summary(plan, cluster)
    names = list(summ)
    y = np.arange(len(names))
    h = 0.26
    metrics = (
        ("compute_share", "type: share of cluster matmul FLOP/s", "///"),
        ("token_share", "type: share of tokens (linear layers)", ""),
        ("attention_share", "type: share of attention work", ".."),
    )
    for i, (key, _label, hatch) in enumerate(metrics):
        vals = [100 * summ[n][key] for n in names]
        ax.barh(
            y + (i - 1) * h,
            vals,
            height=h,
            color=[gpu_color(n) for n in names],
            edgecolor="0.25",
            linewidth=0.6,
            hatch=hatch,
        )
    ax.set_yticks(y, [f"{n}\n{summ[n]['used']}/{summ[n]['devices']} used" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("share of the iteration (%)")
    ax.set_title("per GPU type")
    ax.set_xlim(0, 100)
    from matplotlib.patches import Patch

    # legend proxies for the hatches (the colours are the GPU types, named on the y axis)
    return [Patch(facecolor="white", edgecolor="0.25", hatch=hatch, label=label) for _, label, hatch in metrics]


@styled
def plot_allocation(plan: Plan, cluster: ClusterSpec, title: str | None = None) -> Figure:
    """Where the plan's work goes. Up to 64 ranks: every rank's token ranges along the sequence
    (one row per HP group, zigzag chunks visible) and its head range; beyond: tokens and attention
    work per node. Always: per GPU type, the shares of compute, tokens and attention work, and how
    many devices are used. The figure has the same size at any scale."""
    import numpy as np

    fig = new_figure(12, 4.8, nrows=0)[0]
    gs = fig.add_gridspec(2, 2, width_ratios=(2.3, 1), height_ratios=(1, 1))
    shares = rank_shares(plan, cluster)
    k, S = plan.num_groups, plan.seq_len
    out = left_out(plan, cluster)
    n_out = sum(len(v) for v in out.values())
    head = title or " · ".join(x for x in (plan.cluster or cluster.name, plan.model, f"{tokens_label(S)} tokens") if x)
    sub = f"{plan.world_size} ranks in {k} groups" + (
        f", {n_out} of {cluster.size} devices left out" if n_out else f", all {cluster.size} devices"
    )
    fig.suptitle(f"{head}\n{sub}", fontsize=11, fontweight="bold")
    if plan.world_size <= DETAIL_MAX_RANKS and k <= DETAIL_MAX_GROUPS:
        ax_seq, ax_heads = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[1, 0])
        for s in shares:
            r = s["layout"]
            for a, b in r.token_ranges:
                ax_seq.barh(r.group, b - a, left=a, color=gpu_color(s["gpu"]), edgecolor="white", linewidth=0.5)
                if (b - a) / S > 0.035:
                    ax_seq.text((a + b) / 2, r.group, str(r.rank), ha="center", va="center", fontsize=7)
            h0, h1 = r.head_range
            if h1 > h0:
                ax_heads.barh(r.group, h1 - h0, left=h0, color=gpu_color(s["gpu"]), edgecolor="white", linewidth=0.5)
                if (h1 - h0) / plan.num_heads > 0.035:
                    ax_heads.text((h0 + h1) / 2, r.group, str(r.rank), ha="center", va="center", fontsize=7)
        step = max(1, k // 12)
        for ax in (ax_seq, ax_heads):
            ax.set_ylim(k - 0.5, -0.5)
            ax.set_yticks(range(0, k, step), [f"G{g}" for g in range(0, k, step)])
            ax.grid(axis="y", visible=False)
        ax_seq.set_xlim(0, S)
        ticks = np.linspace(0, S, 5)
        ax_seq.set_xticks(ticks, [tokens_label(t) for t in ticks])
        ax_seq.set_xlabel("token position (numbers: rank)")
        ax_seq.set_ylabel("HP group")
        ax_seq.set_title("sequence: tokens held by each rank")
        ax_heads.set_xlim(0, plan.num_heads)
        ax_heads.set_xlabel("query head (numbers: rank)")
        ax_heads.set_ylabel("HP group")
        ax_heads.set_title("heads: attention computed by each rank")
    else:
        ax = fig.add_subplot(gs[:, 0])
        nodes = cluster.node_devices
        tok = np.zeros(len(nodes))
        att = np.zeros(len(nodes))
        for s in shares:
            tok[s["node"]] += 100 * s["token_share"]
            att[s["node"]] += 100 * s["attention_share"]
        x = np.arange(len(nodes))
        types = [cluster.devices[n[0]].gpu.name for n in nodes]
        for t in dict.fromkeys(types):
            idx = [i for i, tt in enumerate(types) if tt == t]
            ax.bar(x[idx], tok[idx], width=0.85, color=gpu_color(t), label=f"node: tokens ({t})")
        ax.plot(
            x,
            att,
            ls="none",
            marker="_",
            ms=max(2.0, min(8.0, 400 / len(nodes))),
            color="0.1",
            label="node: attention work",
        )
        unused = [i for i, n in enumerate(nodes) if tok[i] == 0 and att[i] == 0]
        if unused:
            ax.plot(unused, [0] * len(unused), ls="none", marker="x", ms=4, color="0.4", label="node left out")
        ax.set_xlim(-0.6, len(nodes) - 0.4)
        ax.set_xlabel(f"node (0-{len(nodes) - 1}, in cluster order)")
        ax.set_ylabel("share of the iteration (%)")
        ax.set_title("per node: tokens (bars) and attention work (ticks)")
    proxies = _summary_panel(fig.add_subplot(gs[:, 1]), plan, cluster)
    legend_outside(fig, loc="below", extra_handles=proxies)
    return fig


@styled
@styled
def plot_replicas(plan: Plan, cluster: ClusterSpec, step: Any, title: str | None = None) -> Figure:
    """The allocation of a joint plan (data-parallel replicas): left, every device of the cluster
    in its node's row, coloured by the replica that holds it (grey: left out); right, each
    replica's time for its sequences against the step (costmodel.step.StepEstimate)."""
    import matplotlib.pyplot as plt

    fig, (ax, bx) = new_figure(12.0, 0.5 * max(len(cluster.nodes), plan.num_replicas) + 2.0, 1, 2)
    cmap = plt.get_cmap("tab20")
    owner = {d: i for i in range(plan.num_replicas) for d in plan.replica(i).rank_devices}
    per_node = cluster.node_devices
    width = max(len(n) for n in per_node)
    for row, devs in enumerate(per_node):
        for col, d in enumerate(devs):
            i = owner.get(d)
            ax.add_patch(
                plt.Rectangle(
                    (col, row), 0.92, 0.85, color=cmap(i % 20) if i is not None else IDLE_COLOR, lw=0, alpha=0.95
                )
            )
            if i is not None:
                ax.text(col + 0.46, row + 0.42, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, width)
    ax.set_ylim(len(per_node), 0)
    ax.set_yticks([r + 0.42 for r in range(len(per_node))])
    ax.set_yticklabels([f"node {n}: {cluster.nodes[n].gpu.name}" for n in range(len(per_node))], fontsize=7)
    ax.set_xticks([])
    ax.set_title("devices by replica (number = replica; grey = left out)")
    reps = step.replicas
    for r in reps:
        bx.barh(r.index, r.time_s, color=cmap(r.index % 20), height=0.7)
        if r.waiting_s > 0:  # waits for the replicas it runs in lockstep with (costmodel/step.py)
            bx.barh(r.index, r.waiting_s, left=r.time_s, color="none", edgecolor="0.5", hatch="///", height=0.7)
        gpus = ", ".join(f"{n}x {g}" for g, n in r.gpus.items())
        bx.text(r.time_s + r.waiting_s, r.index, f"  {r.sequences} seq · {gpus}", va="center", fontsize=7)
    bx.axvline(step.step_time_s, color="0.2", ls=":", lw=1.0, label=f"step {step.step_time_s:.3g} s")
    bx.set_ylim(len(reps) - 0.5, -0.5)
    bx.set_yticks(range(len(reps)))
    bx.set_yticklabels([f"replica {r.index}" for r in reps], fontsize=7)
    bx.set_xlabel("seconds per step (its sequences' micro-steps; hatched: waiting in lockstep)")
    exposed = sum(v for k, v in step.sync_s.items() if k != "copies_allreduce")  # the rest runs in the backward
    bx.set_title(f"{step.sharding}; {exposed:.3g} s after the replicas (re-gather, optimizer)")
    bx.legend(loc="lower right", fontsize=7)
    fig.suptitle(title or f"{plan.name}: {plan.num_replicas} replicas on {cluster.name}", fontweight="bold")
    return fig


def plot_rank_phases(estimate: Any, title: str | None = None) -> Figure:
    """Time by cost-model phase and memory against capacity: per rank up to 64 ranks, else per
    GPU type (the mean rank of the type, and its slowest rank's busy time as a tick)."""
    import numpy as np

    ranks = list(estimate.ranks)
    colors = phase_colors()
    fig, (ax_t, ax_m) = new_figure(12, 3.8, 1, 2, width_ratios=(2, 1))
    if not ranks:
        empty(ax_t, "no ranks")
        empty(ax_m, "no ranks")
        return fig
    per_rank = len(ranks) <= DETAIL_MAX_RANKS
    if per_rank:
        labels = [str(r.rank) for r in ranks]
        groups = [[r] for r in ranks]
    else:
        by_type: dict[str, list[Any]] = {}
        for r in ranks:
            by_type.setdefault(r.gpu, []).append(r)
        labels = [f"{t}\n({len(v)} ranks)" for t, v in by_type.items()]
        groups = list(by_type.values())
    x = np.arange(len(groups))
    bottom = np.zeros(len(groups))
    for phase, color in colors.items():
        vals = np.array([np.mean([r.time_s.get(phase, 0.0) for r in g]) for g in groups])
        if vals.any():  # no legend entry for a phase that takes no time
            ax_t.bar(x, vals, bottom=bottom, color=color, label=phase, width=0.8)
            bottom += vals
    idle = np.array([np.mean([r.idle_s for r in g]) for g in groups])
    if idle.any():
        ax_t.bar(x, idle, bottom=bottom, color=IDLE_COLOR, label="waiting", width=0.8)
    if not per_rank:
        ax_t.plot(
            x,
            [max(r.busy_s for r in g) for g in groups],
            ls="none",
            marker="_",
            ms=18,
            color="k",
            label="slowest rank busy",
        )
    ax_t.axhline(estimate.iteration_time_s, color="k", lw=1, ls="--", label="iteration")
    ax_t.set_xticks(
        x, labels if (not per_rank or len(x) <= 32) else [s if i % 4 == 0 else "" for i, s in enumerate(labels)]
    )
    ax_t.set_xlabel("rank" if per_rank else "GPU type")
    ax_t.set_ylabel("seconds per iteration")
    ax_t.set_title(title or "time by phase")
    legend_outside(ax_t)
    mem = np.array([max(r.memory_gib for r in g) for g in groups])
    cap = np.array([min(r.capacity_gib for r in g) for g in groups])
    over = mem > cap
    ax_m.bar(
        x,
        mem,
        color=np.where(over, HEXISEQ_COLOR, BEST_BASELINE_COLOR),
        width=0.8,
        label="memory" if per_rank else "largest rank",
    )
    ax_m.plot(x, cap, ls="none", marker="_", ms=14, color="k", label="capacity")
    ax_m.set_xticks(
        x, labels if (not per_rank or len(x) <= 16) else [s if i % 4 == 0 else "" for i, s in enumerate(labels)]
    )
    ax_m.set_xlabel("rank" if per_rank else "GPU type")
    ax_m.set_ylabel("GiB")
    ax_m.set_title("memory")
    legend_outside(ax_m)
    return fig


@styled
def plot_cell_systems(
    systems: Iterable[Mapping[str, Any]], title: str = "", bound_tokens_per_s: float | None = None
) -> Figure:
    """Tokens/s of HexiSeq and every baseline of one cell, best first; the systems that do not
    fit are named under the axes. `systems`: rows with system, feasible, tokens_per_s."""
    from .cells import HEXISEQ

    rows = list(systems)
    fits = sorted((r for r in rows if r.get("feasible")), key=lambda r: r["tokens_per_s"])
    fig, ax = new_figure(9, 0.32 * max(len(fits), 1) + 1.8)
    if not fits:
        empty(ax, "nothing fits in memory")
        ax.set_title(title)
        return fig
    base = [r for r in fits if r["system"] != HEXISEQ]
    best = max(base, key=lambda r: r["tokens_per_s"])["system"] if base else None
    colors = [
        HEXISEQ_COLOR if r["system"] == HEXISEQ else BEST_BASELINE_COLOR if r["system"] == best else "#a1b4d3"
        for r in fits
    ]
    ax.barh([r["system"] for r in fits], [r["tokens_per_s"] for r in fits], color=colors)
    best_tps = max((r["tokens_per_s"] for r in base), default=None)
    for i, r in enumerate(fits):
        label = si_label(r["tokens_per_s"])
        if r["system"] == HEXISEQ and best_tps:
            label += f"  ({r['tokens_per_s'] / best_tps:.2f}x the best baseline)"
        ax.text(r["tokens_per_s"], i, " " + label, va="center", fontsize=8)
    if bound_tokens_per_s:
        ax.axvline(bound_tokens_per_s, color="k", ls="--", lw=1)
        ax.annotate(
            "compute bound",
            (bound_tokens_per_s, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -2),
            textcoords="offset points",
            fontsize=8,
            va="top",
            rotation=90,
        )
    throughput_axis(ax.xaxis)
    ax.set_xlabel("tokens/s")
    ax.set_title(title or "HexiSeq and the baselines")
    ax.margins(x=0.3)
    ax.grid(axis="y", visible=False)
    nofit = [r["system"] for r in rows if not r.get("feasible")]
    if nofit:
        note(
            ax,
            "does not fit in memory: "
            + ", ".join(nofit[:8])
            + (f" and {len(nofit) - 8} more" if len(nofit) > 8 else ""),
        )
    return fig
