"""The README's pictures (`make figures`): one from the plan explorer (notebook 01: the
allocation of its default case, planned now) and one from the paper figures (notebook 02: the
speedup against sequence length, drawn from the results directory).

    python -m hexiseq.reproduce.readme [--results DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .cells import plan_setting
from .pipeline import RESULT_DIR, redraw
from .plan_figures import plot_allocation
from .style import save

EXPLORER_CASE = ("testbed-8", "llama2-7b", 131072)  # notebook 01's defaults
EXPLORER_NAME = "explorer_allocation"  # the 02 picture is speedup_vs_length, one of the results' figures


def readme_figures(results_dir: Path = RESULT_DIR) -> list[Path]:
    """Redraw the results' figures (the 02 picture among them) and write the explorer's picture
    next to them, in `results_dir/figures/`; returns the two README pictures."""
    results = redraw(results_dir)
    fig_dir = results.directory / "figures"
    cluster, _, _, result = plan_setting(*EXPLORER_CASE)  # the bundled default case fits
    save(plot_allocation(result.plan, cluster), fig_dir, EXPLORER_NAME)
    return [fig_dir / f"{EXPLORER_NAME}.png", fig_dir / "speedup_vs_length.png"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(RESULT_DIR), help="results directory (default data/results)")
    args = ap.parse_args(argv)
    for p in readme_figures(Path(args.results)):
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
