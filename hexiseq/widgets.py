"""Interactive plan explorer for Jupyter: pick a cluster, a model and a sequence length, plan,
and see the allocation, the comparison with the baselines and the per-rank breakdown.

Only wiring lives here: planning is `hexiseq.planner.plan_cluster`, plots are `hexiseq.viz`.
"""

from __future__ import annotations

from typing import Any

from .errors import HexiSeqError
from .specs import Workload, bundled_clusters, get_model, load_cluster, model_catalog

SEQ_CHOICES = [("8K", 8192), ("16K", 16384), ("32K", 32768), ("64K", 65536), ("128K", 131072),
               ("256K", 262144), ("512K", 524288), ("1M", 1048576)]


def show_plan(cluster_name: str, model_name: str, seq_len: int, recompute: bool | str = "auto", sharding: str = "zero3") -> Any:
    """Plan one case and display its summary and the three plots; returns the PlanResult
    (or None when the case is infeasible, after printing why)."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    from .costmodel import estimate
    from .planner import plan_cluster
    from .viz import plot_comparison, plot_layout, plot_rank_breakdown

    cluster = load_cluster(cluster_name)
    model = get_model(model_name)
    wl = Workload(seq_len=seq_len, activation_checkpointing=recompute, param_sharding=sharding)
    try:
        result = plan_cluster(cluster, model, wl, progress=False)
    except HexiSeqError as e:
        print(f"infeasible: {e}")
        return None
    d = result.to_dict()
    sp, gap = d["speedup_vs_best_baseline"], d["gap"]  # None when no baseline fits / no bound
    print(
        f"HexiSeq {d['throughput_tokens_per_s']:,.0f} tokens/s, "
        + (f"{sp:.3f}x the best baseline" if sp is not None else "no baseline fits")
        + f", gap {'n/a' if gap is None else f'{gap:.2%}'}, recompute {result.recompute}, planned in {d['plan_time_s']:.2f} s"
    )
    throughputs = {k: v for k, v in d["baselines"].items() if v}
    throughputs["hexiseq"] = d["throughput_tokens_per_s"]
    est = estimate(result.plan, cluster, model, wl.with_recompute(result.recompute))  # the policy the planner chose
    for fig in (
        plot_layout(result.plan, cluster),
        plot_comparison(throughputs, bound=est.bound_tokens_per_s, title=f"{cluster.name}, {model.name}, {seq_len // 1024}K tokens"),
        plot_rank_breakdown(est, title="HexiSeq: time per rank by phase"),
    ):
        display(fig)
        plt.close(fig)
    return result


def plan_explorer(cluster: str = "testbed-8", model: str = "llama2-7b", seq_len: int = 131072) -> Any:
    """An ipywidgets panel: dropdowns for cluster / model / length, recompute and sharding
    toggles, a Plan button; results render below."""
    import ipywidgets as W
    from IPython.display import display

    w_cluster = W.Dropdown(options=bundled_clusters(), value=cluster, description="cluster")
    w_model = W.Dropdown(options=list(model_catalog()), value=model, description="model")
    w_seq = W.SelectionSlider(options=SEQ_CHOICES, value=seq_len, description="tokens")
    w_rec = W.Dropdown(options=["auto", "none", "selective", "full"], value="auto", description="recompute")
    w_shard = W.ToggleButtons(options=["zero3", "replicated"], value="zero3", description="states")
    button = W.Button(description="Plan", button_style="primary")
    out = W.Output()

    def on_click(_: Any = None) -> None:
        out.clear_output()
        with out:
            show_plan(w_cluster.value, w_model.value, w_seq.value, w_rec.value, w_shard.value)

    button.on_click(on_click)
    panel = W.VBox([W.HBox([w_cluster, w_model]), W.HBox([w_seq, w_rec]), W.HBox([w_shard, button]), out])
    display(panel)
    on_click()
    return panel
