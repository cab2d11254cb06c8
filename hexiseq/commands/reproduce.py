"""`hexiseq reproduce [SCENARIO...] [--quick] [--out DIR] [--force] [--stack NAME]`: the paper's
experiments on the cost model; `hexiseq reproduce --stacks [NAME...] [--quick]`: how the headline
speedups move under each software stack.

Every cell of the scenarios (default: all of data/scenarios/: the testbeds, the simulation
clusters, the FLOP-comparable pairs, planner time up to 1024 GPUs, the sensitivity sweeps) is
planned for HexiSeq and every baseline; finished cells are cached in DIR/cache (the key includes a
hash of the cost model, planner, catalogs and cluster files, so any change recomputes) and skipped
on the next run unless --force. Writes DIR/results.csv (one row per cell and system),
DIR/figures/ (PNG + PDF), DIR/paper_comparison.md and DIR/meta.json.
DIR defaults to data/results, or out/reproduce-quick with --quick (a small subset of every
scenario, a few minutes on 2 cores). --figures-only redraws figures and comparison from DIR
(with --stack NAME: NAME's default DIR, refused when DIR holds another stack's results).

--stack NAME plans and judges every cell on that software stack (data/stacks.yaml; default
fa2-bf16, said on stderr); results.csv says the stack in its `stack` column. A results directory
holds one stack: --out of another stack's results is refused; without --out a non-default stack
writes to out/reproduce-NAME (out/reproduce-quick-NAME with --quick).

--stacks [NAME...] computes the headline cells (testbed, simulation, pairs) on each named stack
(none named: every stack; stacks with equal factors on those GPUs computed once) into DIR/<stack>/
and writes DIR/stacks.md, DIR/stacks.csv and DIR/figures/stack_headlines.* (DIR defaults to
out/reproduce-stacks, out/reproduce-stacks-quick with --quick).

--rate-sensitivity plans the simulation cells whose clusters hold a GPU with a ranged rate
(`ranges` in data/gpus.yaml) at the low end, the midpoint (the catalog) and the high end, beside the
rates they borrowed before (hexiseq.reproduce.rate_sensitivity): DIR/rate_sensitivity.md, .csv, .png
(DIR defaults to out/rate-sensitivity, out/rate-sensitivity-quick with --quick: one cell).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys

from ..errors import HexiSeqError
from ..reproduce import default_out, load_results, rate_sensitivity, redraw, reproduce
from ..reproduce.stack_report import default_stacks_out, stack_report
from ..specs.stacks import get_stack
from .common import add_stack_arg, load_stack_arg


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
    p.add_argument(
        "--out",
        help="results directory (default data/results; with --quick out/reproduce-quick; "
        "another --stack: out/reproduce[-quick]-NAME; --stacks: out/reproduce-stacks[-quick])",
    )
    p.add_argument("--force", action="store_true", help="recompute cached cells")
    p.add_argument(
        "--figures-only", action="store_true", help="no planning: redraw the figures and the comparison from --out"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    add_stack_arg(p)
    p.add_argument(
        "--stacks",
        nargs="*",
        metavar="NAME",
        default=None,
        help="the stacks report: the headline cells on each named stack (none named: every stack of "
        "data/stacks.yaml), DIR/stacks.md, stacks.csv and figures/stack_headlines.*",
    )
    p.add_argument(
        "--rate-sensitivity",
        action="store_true",
        help="the simulations at both ends of every ranged catalog rate: DIR/rate_sensitivity.md, .csv, .png",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = [m for m in ("matplotlib", "seaborn", "pandas") if importlib.util.find_spec(m) is None]
    if missing:  # before anything imports them
        raise HexiSeqError(
            f"hexiseq reproduce draws its figures with {', '.join(missing)}, not installed here: "
            "pip install -e '.[notebooks]' (or: make setup)"
        )

    command = (
        " ".join(["hexiseq reproduce", *(shlex.quote(a) for a in sys.argv[2:])])
        if sys.argv[1:2] == ["reproduce"]
        else None
    )
    if args.rate_sensitivity:
        return _rate_sensitivity(args)
    if args.stacks is not None:
        return _stacks(args, command)
    if args.figures_only:
        if args.scenarios or args.force:
            raise HexiSeqError("--figures-only redraws what --out holds: it takes no scenarios and no --force")
        stack = get_stack(args.stack).name if args.stack else None  # an unknown name fails here
        out = args.out or default_out(args.quick, stack)
        held = load_results(out)
        if stack and held is not None and held.stack != stack:  # checked before drawing anything
            raise HexiSeqError(f"--figures-only --stack {args.stack}: {out} holds results of the stack {held.stack}")
        results = redraw(out)
        print(f"figures and paper_comparison.md redrawn in {out} (stack {results.stack})")
        return 0
    stack = load_stack_arg(args).name
    out = args.out or default_out(args.quick, stack)
    results = reproduce(
        args.scenarios or None,
        quick=args.quick,
        out=out,
        force=args.force,
        progress=not args.no_progress,
        command=command,
        stack=stack,
    )
    last = results.meta["last_run"]
    print(
        f"{results.meta['cells']} cells ({last['computed']} computed, {last['cached']} from the cache) in "
        f"{last['wall_s']:.0f} s; "
        f"cost-model version {results.meta['version']}; stack {results.stack}"
    )
    print(f"  {out}/results.csv, {out}/paper_comparison.md, {out}/figures/")
    for c in results.comparison():
        print(
            f"  {c.figure.what[:70]:<70} paper {c.value_text(c.figure.value):>8}  ours {c.value_text(c.ours):>8}  "
            f"{c.status}"
        )
    return 0


def _rate_sensitivity(args: argparse.Namespace) -> int:
    """`--rate-sensitivity`: the simulations at the ends of the ranged rates (module doc)."""
    if args.scenarios or args.figures_only or args.stack or args.stacks is not None:
        raise HexiSeqError(
            "--rate-sensitivity plans the simulation cells on the default stack at each end of the ranged rates: "
            "it takes no SCENARIO, no --figures-only, no --stack and no --stacks"
        )
    out = args.out or ("out/rate-sensitivity-quick" if args.quick else "out/rate-sensitivity")
    argv = ["--out", str(out), *(["--quick"] if args.quick else [])]
    return rate_sensitivity.main(argv)


def _stacks(args: argparse.Namespace, command: str | None) -> int:
    """`--stacks [NAME...]`: the stacks report (hexiseq.reproduce.stack_report)."""
    if args.scenarios or args.figures_only or args.stack:
        raise HexiSeqError(
            "--stacks computes the headline scenarios (testbed, simulation, pairs) on each stack it names: "
            "it takes no SCENARIO, no --figures-only and no --stack"
        )
    out = args.out or default_stacks_out(args.quick)
    report = stack_report(
        args.stacks, quick=args.quick, out=out, force=args.force, progress=not args.no_progress, command=command
    )
    same = ", ".join(f"{n} = {a}" for n, a in report.meta["same_as"].items())
    print(
        f"stacks {', '.join(report.stacks)} computed ({len(report.cells)} headline cells in all)"
        + (f"; same factors on these GPUs: {same}" if same else "")
    )
    print(f"  {out}/stacks.md, {out}/stacks.csv, {out}/figures/stack_headlines.png")
    for _, r in report.headlines.iterrows():
        print(
            f"  {r['figure'][:70]:<70} paper {r['paper']:>6.3g}  " + "  ".join(f"{n} {r[n]:.3g}" for n in report.stacks)
        )
    return 0
