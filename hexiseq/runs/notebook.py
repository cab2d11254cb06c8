"""A live notebook view of a background run: loss and tokens/s redrawn while it runs, then the
summary line with predicted vs measured step time. `RunHandle.watch()` calls `watch`."""

from __future__ import annotations

import io
import time
from typing import Any


def _png(metrics: Any, summary: dict[str, Any] | None) -> bytes:
    import matplotlib.pyplot as plt

    from .plots import plot_run

    fig = plot_run(metrics, summary)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def status_line(handle: Any) -> str:
    m = handle.metrics
    if not len(m):
        return f"{handle.run_dir}: {handle.status}"
    last = m.iloc[-1]
    return (
        f"{handle.run_dir}: {handle.status}, step {int(last['step'])}, loss {last['loss']:.4f}, "
        f"{last['tokens_per_s']:,.0f} tokens/s"
    )


def watch(handle: Any, every: float = 1.0) -> dict[str, Any] | None:
    """Redraw every `every` seconds until the run ends; returns its summary."""
    from IPython.display import HTML, Image, display

    from .progress import closing_lines

    text = display(HTML(status_line(handle)), display_id=True)
    picture = display(HTML(""), display_id=True)
    seen = -1
    while True:
        running = handle.running()
        m = handle.metrics
        if len(m) != seen:
            seen = len(m)
            if seen:
                picture.update(Image(data=_png(m, None)))
        text.update(HTML(status_line(handle)))
        if not running:
            break
        time.sleep(every)
    summary = handle.summary
    if handle.error:
        text.update(HTML(f"<pre>{handle.error}</pre>"))
        return summary
    if summary:
        picture.update(Image(data=_png(handle.metrics, summary)))
        text.update(HTML("<br>".join(closing_lines(summary))))
    return summary
