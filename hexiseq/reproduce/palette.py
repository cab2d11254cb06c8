"""The one palette of every HexiSeq figure.

- phases: one colour per entry of the cost model's phase list (`hexiseq.costmodel.PHASES`), in its
  order, from seaborn's colour-blind palette (husl when the list outgrows it): a phase added to or
  renamed in the cost model gets a colour of its own with no change here;
- GPU types: one colour per entry of the GPU catalog (`data/gpus.yaml`), in catalog order, so a
  type has the same colour in every cluster and every figure;
- systems: HexiSeq, the best baseline of a comparison, and the other baselines in the order the
  planner lists them;
- the paper's reference values: black.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from .. import costmodel  # costmodel.PHASES read at call time: the list may grow
from ..specs import gpu_catalog

IDLE_COLOR = "#d9d9d9"  # waiting for others: not a phase of the cost model
UNUSED_COLOR = "#f0f0f0"  # a device the plan leaves out
HEXISEQ_COLOR = "#c44e52"
BEST_BASELINE_COLOR = "#4c72b0"
PAPER_COLOR = "#000000"


def _hex(colors: Iterable) -> list[str]:
    from matplotlib.colors import to_hex

    return [to_hex(c) for c in colors]


def _qualitative(name: str, n: int) -> list[str]:
    """n distinct colours: the named seaborn palette, or husl when it has fewer than n."""
    import seaborn as sns

    base = sns.color_palette(name)
    return _hex(base[:n] if n <= len(base) else sns.color_palette("husl", n))


def phase_colors() -> dict[str, str]:
    """{phase: colour} for the cost model's phases, in their order."""
    return dict(zip(costmodel.PHASES, _qualitative("colorblind", len(costmodel.PHASES))))


@functools.lru_cache(maxsize=1)
def _gpu_colors() -> dict[str, str]:
    import seaborn as sns

    names = list(gpu_catalog())
    colors = _hex(sns.color_palette("Set2", 8) + sns.color_palette("Dark2", 8))
    if len(names) > len(colors):
        colors = _hex(sns.color_palette("husl", len(names)))
    return dict(zip(names, colors))


def gpu_color(name: str) -> str:
    """The colour of a GPU type (catalog order); a type outside the catalog gets a neutral grey."""
    return _gpu_colors().get(name, "#7f7f7f")


def gpu_colors(names: Iterable[str] | None = None) -> dict[str, str]:
    """{GPU type: colour} for `names` (default: the whole catalog)."""
    return dict(_gpu_colors()) if names is None else {n: gpu_color(n) for n in names}


def series_colors(names: Iterable[str]) -> dict[str, str]:
    """{name: colour} for other categorical series (clusters, scenarios, models), in the order given."""
    names = list(dict.fromkeys(names))
    return dict(zip(names, _qualitative("dark", len(names))))


def system_colors(systems: Iterable[str], best: str | None = None) -> dict[str, str]:
    """{system: colour}: HexiSeq and `best` fixed, the others from a muted palette in the order
    given (the planner's order of `PlanResult.baselines`)."""
    from .cells import HEXISEQ

    systems = list(dict.fromkeys(systems))
    rest = [s for s in systems if s not in (HEXISEQ, best)]
    out = dict(zip(rest, _qualitative("muted", len(rest))))
    if best in systems:
        out[best] = BEST_BASELINE_COLOR
    if HEXISEQ in systems:
        out[HEXISEQ] = HEXISEQ_COLOR
    return {s: out[s] for s in systems}
