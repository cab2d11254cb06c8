"""Pictures of a run: the loss curve and tokens/s per step, titled with measured vs predicted step time."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_run(metrics: Any, summary: dict[str, Any] | None = None, title: str | None = None):
    """A figure of a run's metrics table (hexiseq.runs.load): loss and tokens/s against the step."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
    if len(metrics):
        a.plot(metrics["step"], metrics["loss"], marker="o" if len(metrics) <= 40 else None, ms=3)
        b.plot(
            metrics["step"],
            metrics["tokens_per_s"],
            marker="o" if len(metrics) <= 40 else None,
            ms=3,
            color="tab:green",
        )
    a.set(xlabel="step", ylabel="loss", title="loss")
    b.set(xlabel="step", ylabel="tokens/s", title="throughput")
    b.set_ylim(bottom=0)
    if summary and summary.get("measured_step_time_s") is not None:
        pred = summary.get("predicted_step_time_s")
        text = f"measured {summary['measured_step_time_s']:.3g} s/step on {summary['measured_on']}"
        if pred is not None:
            text += f"; predicted {pred:.3g} s/step ({(summary.get('prediction') or {}).get('cluster')})"
        fig.suptitle(title or text, fontsize=9)
    elif title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def save_loss_curve(run_dir: Path | str) -> Path:
    """RUN_DIR/loss.png of a run."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from .rundir import RunDir, load, load_summary

    run = RunDir(run_dir)
    fig = plot_run(load(run.path), load_summary(run.path))
    fig.savefig(run.loss_png, dpi=110)
    plt.close(fig)
    return run.loss_png
