"""`hexiseq reproduce [SCENARIO...] [--quick] [--out DIR] [--force]`: the paper's experiments on
the cost model.

Every cell of the scenarios (default: all of data/scenarios/: the testbeds, the simulation
clusters, the FLOP-comparable pairs, planner time up to 1024 GPUs, the sensitivity sweeps) is
planned for HexiSeq and every baseline; finished cells are cached in DIR/cache (the key includes a
hash of the cost model, planner, catalogs and cluster files, so any change recomputes) and skipped
on the next run unless --force. Writes DIR/results.csv (one row per cell and system),
DIR/figures/ (PNG + PDF), DIR/paper_comparison.md and DIR/meta.json.
DIR defaults to data/results, or out/reproduce-quick with --quick (a small subset of every
scenario, a few minutes on 2 cores). --figures-only redraws figures and comparison from DIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys

from ..errors import HexiSeqError
from ..reproduce import QUICK_DIR, RESULT_DIR, redraw, reproduce


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="reproduce the paper's experiments: results table, figures, paper comparison",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help="bundled scenario names or YAML files (default: every bundled one)",
    )
    p.add_argument("--quick", action="store_true", help="each scenario's quick subset (its `quick:` section)")
    p.add_argument("--out", help="results directory (default data/results; with --quick out/reproduce-quick)")
    p.add_argument("--force", action="store_true", help="recompute cached cells")
    p.add_argument(
        "--figures-only", action="store_true", help="no planning: redraw the figures and the comparison from --out"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = [m for m in ("matplotlib", "seaborn", "pandas") if importlib.util.find_spec(m) is None]
    if missing:  # before anything imports them
        raise HexiSeqError(
            f"hexiseq reproduce draws its figures with {', '.join(missing)}, not installed here: "
            "pip install -e '.[notebooks]' (or: make setup)"
        )

    out = args.out or (QUICK_DIR if args.quick else RESULT_DIR)
    if args.figures_only:
        if args.scenarios or args.force:
            raise HexiSeqError("--figures-only redraws what --out holds: it takes no scenarios and no --force")
        results = redraw(out)
        print(f"figures and paper_comparison.md redrawn in {out}")
        return 0
    command = (
        " ".join(["hexiseq reproduce", *(shlex.quote(a) for a in sys.argv[2:])])
        if sys.argv[1:2] == ["reproduce"]
        else None
    )
    results = reproduce(
        args.scenarios or None,
        quick=args.quick,
        out=out,
        force=args.force,
        progress=not args.no_progress,
        command=command,
    )
    last = results.meta["last_run"]
    print(
        f"{results.meta['cells']} cells ({last['computed']} computed, {last['cached']} from the cache) in "
        f"{last['wall_s']:.0f} s; "
        f"cost-model version {results.meta['version']}"
    )
    print(f"  {out}/results.csv, {out}/paper_comparison.md, {out}/figures/")
    for c in results.comparison():
        print(
            f"  {c.figure.what[:70]:<70} paper {c.value_text(c.figure.value):>8}  ours {c.value_text(c.ours):>8}  "
            f"{c.status}"
        )
    return 0
