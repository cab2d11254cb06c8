"""Every figure function renders on small inputs, with its title, axis labels and legend entries;
no legend entry for an empty series; the palette follows the cost model's phase list and the
GPU catalog; the allocation picture keeps one size from 4 to 1024 ranks."""

from __future__ import annotations

import io

import matplotlib
import pytest

matplotlib.use("Agg")

from hexiseq.costmodel import PHASES, estimate  # noqa: E402
from hexiseq.plan import symmetric_plan  # noqa: E402
from hexiseq.reproduce import figures as F  # noqa: E402
from hexiseq.reproduce import palette  # noqa: E402
from hexiseq.reproduce.plan_figures import plot_allocation, plot_cell_systems, plot_rank_phases  # noqa: E402
from hexiseq.reproduce.recipes import Cell, ClusterRecipe, cluster_recipe, mixed_cluster  # noqa: E402
from hexiseq.reproduce.style import has_data, tokens_label  # noqa: E402
from hexiseq.reproduce.table import frame, read_csv, rows_of, write_csv  # noqa: E402
from hexiseq.specs import Workload, get_model, load_cluster  # noqa: E402

K = 1024
WL = (("activation_checkpointing", "auto"), ("global_batch", 1))


def _record(
    cluster: str, gpus: int, types: dict, base_tps: dict, hexiseq_tps: float | None, plan_time: float = 0.5
) -> dict:
    """A cell record as cells.run_cell makes it, without planning (systems in the given order)."""
    phases = {p: 0.1 * (i + 1) for i, p in enumerate(PHASES)}
    systems = []
    if hexiseq_tps is not None:
        systems.append(
            {
                "system": "hexiseq",
                "feasible": True,
                "tokens_per_s": hexiseq_tps,
                "step_time_s": 1e5 / hexiseq_tps,
                "devices_used": gpus,
                "phases_s": phases,
                "plan_time_s": plan_time,
                "gap": 0.001,
                "recompute": "none",
            }
        )
    else:
        systems.append({"system": "hexiseq", "feasible": False, "plan_time_s": plan_time, "reason": "nothing fits"})
    for name, tps in base_tps.items():
        if tps:
            systems.append(
                {
                    "system": name,
                    "feasible": True,
                    "tokens_per_s": tps,
                    "step_time_s": 1e5 / tps,
                    "devices_used": gpus // 2,
                    "phases_s": phases,
                    "config": "cp=2",
                }
            )
        else:
            systems.append({"system": name, "feasible": False, "reason": "does not fit"})
    fits = {k: v for k, v in base_tps.items() if v}
    sym = {k: v for k, v in fits.items() if k != "proportional"}
    best_sym = max(sym, key=sym.get) if sym else None
    best = max(fits, key=fits.get) if fits else None
    ok = hexiseq_tps is not None
    return {
        "cluster": {
            "name": cluster,
            "gpus": gpus,
            "types": types,
            "peak_pflops": gpus * 0.6,
            "matmul_pflops": gpus * 0.4,
            "memory_gib": gpus * 80.0,
        },
        "global_batch": 1,
        "machine": {"cpu": "test cpu", "cores": 2, "load_avg_1m": 0.5},
        "status": "ok" if ok else "infeasible",
        "systems": systems,
        "best_symmetric": best_sym,
        "speedup": hexiseq_tps / sym[best_sym] if ok and best_sym else None,
        "best_baseline": best,
        "speedup_vs_all": hexiseq_tps / fits[best] if ok and best else None,
    }


@pytest.fixture(scope="module")
def table():
    tb = cluster_recipe("testbed-8", "t")
    sim = cluster_recipe("sim-32", "t")
    pa, pb = cluster_recipe("pair-a-mixed", "t"), cluster_recipe("pair-a-a100", "t")
    rows = []

    def add(cell, rec):
        rows.extend(rows_of(cell, rec, "cm-test"))

    types8 = {"H100-SXM": 4, "A100-80GB": 4}
    for s, h in ((16 * K, 39e3), (32 * K, 30e3)):
        add(
            Cell("testbed", tb, "gpt-7b", s, WL),
            _record("testbed-8", 8, types8, {"ring": 0.8 * h, "ulysses": 0.7 * h, "proportional": 0.95 * h}, h),
        )
    types32 = {"H100-SXM": 8, "A100-80GB": 16, "L40S": 8}
    add(
        Cell("simulation", sim, "gpt-13b", 128 * K, WL),
        _record("sim-32", 32, types32, {"ring": 5e3, "usp": 9e3, "new-family": 11e3}, 14e3),
    )
    add(
        Cell("simulation", sim, "gpt-70b", 128 * K, WL),
        _record("sim-32", 32, types32, {"ring": 0, "usp": 0, "new-family": 0}, 3e3),
    )
    add(Cell("simulation", sim, "gpt-70b", 1024 * K, WL), _record("sim-32", 32, types32, {}, None))
    label = "pair-a-mixed vs pair-a-a100"
    add(
        Cell("pairs", pa, "gpt-13b", 256 * K, WL, pair=label, role="mixed"),
        _record("pair-a-mixed", 56, {"H100-SXM": 48, "A100-80GB": 8}, {"ulysses": 40e3}, 52e3),
    )
    add(
        Cell("pairs", pb, "gpt-13b", 256 * K, WL, pair=label, role="homogeneous"),
        _record("pair-a-a100", 152, {"A100-80GB": 152}, {"ulysses": 50e3, "proportional": 60e3}, 61e3, 1.8),
    )
    for x, sp in ((12.5, 1.3), (100.0, 1.1)):
        c = ClusterRecipe(f"testbed-8@{x:g}GB/s", "nic", tb.source, (("base", tb), ("nic_gbps", x)))
        add(
            Cell("sensitivity", c, "gpt-7b", 64 * K, WL, sweep="inter_node_bandwidth", sweep_value=x),
            _record(c.name, 8, types8, {"ring": 1e4}, 1e4 * sp),
        )
    for f, sp in ((0.0, 1.0), (0.5, 1.4), (1.0, 1.0)):
        add(
            Cell("sensitivity", tb, "gpt-7b", 64 * K, WL, sweep="old_fraction", sweep_value=f),
            _record(f"old {f}", 8, types8, {"ring": 1e4}, 1e4 * sp),
        )
    for s in (16 * K, 128 * K):
        add(
            Cell("sensitivity", tb, "gpt-7b", s, WL, sweep="seq_len", sweep_value=float(s)),
            _record("testbed-8", 8, types8, {"ring": 1e4}, 1.2e4),
        )
    for n, t in ((32, 0.2), (128, 1.5)):
        add(
            Cell(
                "scaling",
                ClusterRecipe(
                    f"mixed-{n}",
                    "mixed",
                    params=(("gpus", n), ("types", ("H100-SXM", "A100-80GB", "A800", "L40S")), ("node_size", 8)),
                ),
                "gpt-13b",
                1024 * K,
                WL,
            ),
            _record(
                f"mixed-{n}",
                n,
                {"H100-SXM": n // 4, "A100-80GB": n // 4, "A800": n // 4, "L40S": n // 4},
                {"usp": 1e4},
                1.5e4,
                t,
            ),
        )
    return frame(rows)


def _legend_labels(fig) -> set[str]:
    """Every legend entry of the figure (each legend listing each entry once)."""
    out = set()
    for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if leg is not None:
            texts = [t.get_text() for t in leg.get_texts()]
            assert len(texts) == len(set(texts)), f"a legend lists an entry twice: {texts}"
            out |= set(texts)
    return out


def _render(fig) -> tuple[int, int]:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    from PIL import Image

    return Image.open(io.BytesIO(buf.getvalue())).size


def _no_empty_entries(fig) -> None:
    """Every labelled artist a legend lists has data (the legend's own handles are copies that always
    look drawn, so the plotted artists are checked)."""
    listed = {
        t.get_text()
        for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
        if leg is not None
        for t in leg.get_texts()
    }
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label in listed:
                assert has_data(h), f"legend entry {label!r} describes an empty series"


def test_table_round_trips_through_csv(table, tmp_path):
    write_csv(table, tmp_path / "r.csv")
    back = read_csv(tmp_path / "r.csv")
    assert list(back.columns) == list(table.columns) and len(back) == len(table)
    assert back["seq_len"].tolist() == table["seq_len"].tolist()  # 1M stays 1048576, not rounded
    assert back["feasible"].dtype == bool and back["feasible"].tolist() == table["feasible"].tolist()
    # a system the figures have never heard of is simply one more row
    assert "new-family" in set(table["system"])
    assert {f"time_{p}_s" for p in PHASES} <= set(table.columns)


def test_fig_systems_heatmap(table):
    fig = F.fig_systems(table, "simulation")
    ax = fig.axes[0]
    assert ax.get_title() == "simulation: every system's throughput as a fraction of HexiSeq's"
    assert ax.get_xlabel().startswith("cell") and ax.get_ylabel() == "system"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["hexiseq", "ring", "usp", "new-family"]
    assert "sim-32 · gpt-70b · 1M" in [t.get_text() for t in ax.get_xticklabels()]  # nothing fits there: still a column
    _render(fig)


def test_fig_speedup_vs_length(table):
    fig = F.fig_speedup_vs_length(table)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[:2] == ["testbed", "simulation"]
    assert fig.axes[0].get_ylabel() == F.SPEEDUP_LABEL and fig.axes[0].get_xlabel() == "sequence length (tokens)"
    labels = _legend_labels(fig)
    assert {
        "testbed-8 · gpt-7b",
        "sim-32 · gpt-13b",
        "paper: testbed mean 1.11x",
        "paper: simulation max 1.72x",
        "paper: 7B at 16K 1.08x",
    } <= labels
    assert "sim-32 · gpt-70b" not in labels  # no baseline fits there: no speedup, no (empty) series
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["16K", "32K"]
    _no_empty_entries(fig)
    _render(fig)


def test_fig_speedup_vs_gpu_types(table):
    fig = F.fig_speedup_vs_gpu_types(table)
    ax = fig.axes[0]
    assert ax.get_title() == "HexiSeq speedup vs number of GPU types"
    assert ax.get_xlabel() == "GPU types in the cluster" and ax.get_ylabel() == F.SPEEDUP_LABEL
    assert {
        "ours: testbed",
        "ours: simulation",
        "paper: testbed mean 1.11x",
        "paper: simulation mean 1.36x",
    } <= _legend_labels(fig)
    _render(fig)


def test_fig_pairs(table):
    fig = F.fig_pairs(table)
    assert [ax.get_title() for ax in fig.axes] == ["tokens/s", "mixed (HexiSeq) / homogeneous (best baseline)"]
    assert fig.axes[1].get_xlabel() == "throughput ratio"
    assert {
        "HexiSeq, mixed cluster",
        "best baseline, homogeneous cluster",
        "paper: pair A 0.995",
        "ours",
    } == _legend_labels(fig)
    texts = [t.get_text().strip() for t in fig.axes[1].texts]
    assert f"{52e3 / 60e3:.3f}" in texts  # the homogeneous side's strongest system (proportional)
    _render(fig)


def test_fig_planner_time(table):
    fig = F.fig_planner_time(table)
    ax = fig.axes[0]
    assert ax.get_title() == "planner time vs cluster size" and ax.get_xlabel() == "GPUs in the cluster"
    assert ax.get_ylabel() == "planner wall time (s)"
    assert {
        "paper: 128 GPUs 9 s",
        "paper: 1024 GPUs 444 s",
        "ours: scaling",
        "ours: median per size",
    } <= _legend_labels(fig)
    assert any("test cpu, 2 cores" in t.get_text() for t in ax.texts)  # the machine is on the figure
    _render(fig)


@pytest.mark.parametrize("sweep", ["inter_node_bandwidth", "old_fraction", "seq_len"])
def test_fig_sensitivity(table, sweep):
    from hexiseq.reproduce.sensitivity import SWEEPS

    fig = F.fig_sensitivity(table, sweep)
    assert fig.get_suptitle() == SWEEPS[sweep].title
    assert all(ax.get_xlabel() == SWEEPS[sweep].xlabel for ax in fig.axes)
    assert {"HexiSeq", "best CP/HP baseline"} == _legend_labels(fig)
    if sweep == "seq_len":
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["16K", "128K"]
    _no_empty_entries(fig)
    _render(fig)


def test_fig_phases_uses_the_cost_model_phases(table):
    fig = F.fig_phases(table, "simulation")
    ax = fig.axes[0]
    assert ax.get_title().startswith("simulation: time by phase, sim-32")
    assert ax.get_xlabel() == "seconds per iteration (the slowest rank)"
    assert _legend_labels(fig) == set(PHASES) | {"iteration (simulated)"}
    colors = palette.phase_colors()
    bars = {c.get_label(): c.patches[0].get_facecolor() for c in ax.containers}
    assert all(matplotlib.colors.to_hex(bars[p]) == colors[p] for p in PHASES)


def test_fig_calibration():
    rows = [
        {"plan": "even", "measured_s": 1.0, "predicted_before_s": 0.7, "predicted_after_s": 0.95},
        {"plan": "uneven", "measured_s": 0.8, "predicted_before_s": 0.5, "predicted_after_s": 0.82},
    ]
    fig = F.fig_calibration(rows)
    ax = fig.axes[0]
    assert ax.get_title() == "cost model vs measured step time"
    assert ax.get_xlabel() == "measured step time (s)" and ax.get_ylabel() == "predicted step time (s)"
    labels = _legend_labels(fig)
    assert "exact" in labels and any(x.startswith("before calibration (median error") for x in labels)
    _render(fig)


def test_fig_measured_comparison():
    rows = [
        {
            "system": "hexiseq",
            "config": "CP 2 x HP",
            "measured_s": 2.9,
            "predicted_s": 2.85,
            "predicted_profile_s": 2.4,
        },
        {"system": "even", "config": "ulysses", "measured_s": 3.5, "predicted_s": 3.77, "predicted_profile_s": 3.2},
    ]
    fig = F.fig_measured_comparison(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["HexiSeq: 2.90 s", "best even: 3.50 s"]
    assert _legend_labels(fig) == {"measured (bar)", "predicted (calibrated)", "predicted (profile alone)"}
    assert any("1.21x" in t.get_text() for t in ax.texts)  # 3.5 / 2.9
    _render(fig)


def test_empty_inputs_say_so(table):
    """No data is a message on the figure, not a crash or a blank axes."""
    empty = table.iloc[0:0]
    for fig in (
        F.fig_speedup_vs_gpu_types(empty),
        F.fig_pairs(empty),
        F.fig_planner_time(empty),
        F.fig_systems(empty, "x"),
        F.fig_sensitivity(empty, "seq_len"),
        F.fig_calibration([]),
        F.fig_measured_comparison([]),
    ):
        assert any(t.get_text() for ax in fig.axes for t in ax.texts)
        _render(fig)


# ----------------------------------------------------------------------------- plan figures


@pytest.mark.parametrize("n", [4, 1024])
def test_allocation_picture_is_readable_at_any_scale(n):
    cluster = load_cluster("testbed-8") if n == 4 else mixed_cluster(1024)
    model = get_model("gpt-13b")
    devices = [0, 1, 4, 5] if n == 4 else list(range(n))
    cp, hp = (2, 2) if n == 4 else (128, 8)
    plan = symmetric_plan(devices, 1 << 20, model.heads, model.kv_heads, cp=cp, hp=hp, block_size=128, model="gpt-13b")
    fig = plot_allocation(plan, cluster)
    w, h = _render(fig)
    assert (w, h) == _render(
        plot_allocation(
            symmetric_plan([0, 4], 65536, model.heads, model.kv_heads, cp=2, hp=1), load_cluster("testbed-8")
        )
    )
    assert w <= 1300 and h <= 560  # 12 x 4.8 in at 100 dpi, whatever the rank count
    titles = [ax.get_title() for ax in fig.axes]
    assert "per GPU type" in titles
    assert fig.get_suptitle().startswith(f"{cluster.name} · gpt-13b · 1M tokens")
    labels = _legend_labels(fig)
    assert {
        "type: share of cluster matmul FLOP/s",
        "type: share of tokens (linear layers)",
        "type: share of attention work",
    } <= labels
    if n == 4:
        assert titles[:2] == ["sequence: tokens held by each rank", "heads: attention computed by each rank"]
        assert "4 of 8 devices left out" in fig.get_suptitle()
    else:  # aggregated by node; a GPU-type entry only for the types present
        assert titles[0] == "per node: tokens (bars) and attention work (ticks)"
        assert {f"node: tokens ({t})" for t in cluster.gpu_types} | {
            "node: attention work"
        } <= labels and "node left out" not in labels
        assert fig.axes[0].get_xlabel() == "node (0-127, in cluster order)"


def test_rank_phases_per_rank_and_per_type():
    cluster, model = load_cluster("testbed-8"), get_model("gpt-7b")
    plan = symmetric_plan(list(range(8)), 65536, model.heads, model.kv_heads, cp=2, hp=4)
    est = estimate(plan, cluster, model, Workload(seq_len=65536))
    fig = plot_rank_phases(est, title="t")
    ax_t, ax_m = fig.axes[:2]
    assert ax_t.get_title() == "t" and ax_t.get_xlabel() == "rank" and ax_t.get_ylabel() == "seconds per iteration"
    assert ax_m.get_title() == "memory" and ax_m.get_ylabel() == "GiB"
    used = {p for p in PHASES if any(r.time_s[p] > 0 for r in est.ranks)}
    assert used <= _legend_labels(fig) and not (set(PHASES) - used) & _legend_labels(
        fig
    )  # no entry for a phase with no time
    big = mixed_cluster(128)
    plan = symmetric_plan(list(range(128)), 1 << 20, 40, 40, cp=16, hp=8)
    est = estimate(plan, big, get_model("gpt-13b"), Workload(seq_len=1 << 20, activation_checkpointing="full"))
    fig = plot_rank_phases(est)
    assert fig.axes[0].get_xlabel() == "GPU type" and "slowest rank busy" in _legend_labels(fig)
    _render(fig)


def test_cell_systems_names_what_does_not_fit():
    rows = [
        {"system": "hexiseq", "feasible": True, "tokens_per_s": 2e4},
        {"system": "ring", "feasible": True, "tokens_per_s": 1e4},
        {"system": "usp", "feasible": False},
    ]
    fig = plot_cell_systems(rows, title="c", bound_tokens_per_s=3e4)
    ax = fig.axes[0]
    assert ax.get_title() == "c" and ax.get_xlabel() == "tokens/s"
    texts = [t.get_text() for t in ax.texts]
    assert any("does not fit in memory: usp" in t for t in texts) and any("2.00x the best baseline" in t for t in texts)
    assert "compute bound" in texts
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ring", "hexiseq"]


# ----------------------------------------------------------------------------- palette


def test_phase_palette_follows_the_cost_model(monkeypatch):
    colors = palette.phase_colors()
    assert list(colors) == list(PHASES) and len(set(colors.values())) == len(PHASES)
    import hexiseq.costmodel

    more = tuple(PHASES) + tuple(f"new_phase_{i}" for i in range(6))  # the list grows past the base palette
    monkeypatch.setattr(hexiseq.costmodel, "PHASES", more)
    grown = palette.phase_colors()
    assert list(grown) == list(more) and len(set(grown.values())) == len(more)


def test_gpu_palette_from_the_catalog():
    from hexiseq.specs import gpu_catalog

    colors = palette.gpu_colors()
    assert list(colors) == list(gpu_catalog()) and len(set(colors.values())) == len(colors)
    assert palette.gpu_color("H100-SXM") == colors["H100-SXM"]  # the same in every figure
    sys_colors = palette.system_colors(["hexiseq", "ring", "usp"], best="usp")
    assert sys_colors["hexiseq"] == palette.HEXISEQ_COLOR and sys_colors["usp"] == palette.BEST_BASELINE_COLOR


def test_token_labels():
    assert [tokens_label(x) for x in (4096, 16384, 131072, 1 << 20, 1536, 100)] == [
        "4K",
        "16K",
        "128K",
        "1M",
        "1.5K",
        "100",
    ]
