"""How every figure looks: one style, token and throughput axes in K/M, legends that list only
what is drawn and sit outside the data, and saving to PNG + PDF.

Figures are built with the object API (`matplotlib.figure.Figure`), never through pyplot's global
state, so they can be made in a worker thread (the notebook explorer) and in tests alike;
notebooks display them with `IPython.display.display(fig)`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

STYLE = {
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "font.family": "DejaVu Sans",
    "pdf.fonttype": 42,  # TrueType in PDFs: editable text, accepted by publishers
}


@contextlib.contextmanager
def style() -> Iterator[None]:
    """The house style, without touching the caller's global rcParams."""
    import matplotlib as mpl

    with mpl.rc_context(STYLE):
        yield


_PYPLOT = contextvars.ContextVar("hexiseq_pyplot_figures", default=False)


@contextlib.contextmanager
def pyplot_figures() -> Iterator[None]:
    """Figures made inside are registered with pyplot (for callers that `plt.show()` them)."""
    token = _PYPLOT.set(True)
    try:
        yield
    finally:
        _PYPLOT.reset(token)


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[Any, Any]:
    """A Figure (object API, constrained layout; not known to pyplot unless inside
    `pyplot_figures()`) and its axes (`subplots` squeeze rules; none with nrows=0, for a caller
    that lays out its own grid)."""
    if _PYPLOT.get():
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(width, height), layout="constrained")
    else:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width, height), layout="constrained")
    return fig, (fig.subplots(nrows, ncols, squeeze=True, **kw) if nrows else None)


def tokens_label(n: float) -> str:
    """16384 -> '16K', 1048576 -> '1M', 1536 -> '1.5K' (binary K/M, as sequence lengths are quoted)."""
    n = float(n)
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{n:.0f}"


def si_label(x: float) -> str:
    """12345 -> '12.3K', 2.5e6 -> '2.5M' (decimal, for throughputs)."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def token_axis(axis: Any, values: Sequence[float] | None = None) -> None:
    """A log2 axis of token counts labelled 16K ... 1M, ticks at `values` when given."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axis.axes.set_xscale("log", base=2) if axis is axis.axes.xaxis else axis.axes.set_yscale("log", base=2)
    if values is not None and len(values):
        axis.set_major_locator(FixedLocator(sorted(set(float(v) for v in values))))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: tokens_label(v)))


def throughput_axis(axis: Any) -> None:
    """Throughput ticks as 12K / 1.5M (major and, on a log axis, the labelled minor ticks)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: si_label(v)))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def styled(fn: Any) -> Any:
    """Decorator: build the figure under the house style (rcParams are read as artists are made)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        with style():
            return fn(*a, **kw)

    return wrapper


def legend_outside(target: Any, title: str | None = None, loc: str = "right", **kw: Any) -> Any:
    """A legend of the labelled, non-empty artists of an Axes (placed right of it) or of every
    Axes of a Figure (`loc` "right" or "below" the whole figure; constrained layout makes room),
    so it never covers data. Returns None, and draws no box, when nothing is listed."""
    is_fig = hasattr(target, "add_axes")
    handles, labels = [], []
    for ax in target.axes if is_fig else [target]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab and not lab.startswith("_") and lab not in labels and has_data(h):
                handles.append(h)
                labels.append(lab)
    handles += kw.pop("extra_handles", [])
    labels += [h.get_label() for h in handles[len(labels) :]]
    if not handles:
        return None
    if not is_fig:
        return target.legend(handles, labels, title=title, loc="upper left", bbox_to_anchor=(1.01, 1.0), **kw)
    if loc == "below":
        return target.legend(
            handles, labels, title=title, loc="outside lower center", **{"ncol": min(len(labels), 4), **kw}
        )
    return target.legend(handles, labels, title=title, loc="outside right upper", **kw)


def has_data(artist: Any) -> bool:
    """False for a series with no finite point (a legend entry for it would describe nothing)."""
    import numpy as np
    from matplotlib.collections import Collection
    from matplotlib.container import BarContainer
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        y = np.asarray(artist.get_ydata(), dtype=float)
        return bool(y.size) and bool(np.isfinite(y).any())
    if isinstance(artist, BarContainer):
        return any(np.isfinite(p.get_height()) and np.isfinite(p.get_width()) for p in artist.patches)
    if isinstance(artist, Collection) and hasattr(artist, "get_offsets"):
        return len(artist.get_offsets()) > 0 or len(artist.get_paths()) > 0
    return True


def save(fig: Any, directory: Path, name: str) -> list[Path]:
    """`DIR/name.png` and `DIR/name.pdf`; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    with style():
        for ext in ("png", "pdf"):
            p = directory / f"{name}.{ext}"
            # no timestamps in the files: the same results give the same bytes
            fig.savefig(
                p,
                metadata={"Software": "hexiseq reproduce"}
                if ext == "png"
                else {"Creator": "hexiseq reproduce", "CreationDate": None},
            )
            out.append(p)
    return out


def note(ax: Any, text: str) -> None:
    """A small grey note under the axes (e.g. what is not drawn and why); never over the data."""
    # anchored under the x label (whatever the tick labels' height), at the axes' left edge
    ax.annotate(
        text,
        xy=(0, 0),
        xycoords=("axes fraction", ax.xaxis.label),
        xytext=(0, -3),
        textcoords="offset points",
        fontsize=7,
        color="0.35",
        ha="left",
        va="top",
    )


def empty(ax: Any, text: str) -> None:
    """An axes with nothing to plot says why instead of staying blank."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
