"""`hexiseq calibrate [--world N | --cluster C] [--profile FILE] [--quick] [--json] [--compare]`: run
plans on the local world, measure their step times with the real executor, fit what the profile
cannot measure, and print predicted (before and after the fit) vs measured per plan.

    hexiseq calibrate                      4 CPU ranks of this machine, 13 plans, tiny at 8K tokens
    hexiseq calibrate --quick --json       short runs (tests), one JSON object
    hexiseq calibrate --cluster cpu-4 --compare
                                           profile and calibrate cpu-4, then the planner's uneven plan
                                           vs the best even plan on that emulated heterogeneous
                                           cluster, measured and predicted

Without --profile the world is profiled first (as `hexiseq profile`). The plans: even and uneven,
pure CP, pure HP and CP x HP groups, each recompute policy, data-parallel replicas of one rank
(hexiseq/calibrate/plans.py); six are fitted, four held out. Every run keeps its run directory
(metrics.jsonl, summary.json with `emulated: true` and the emulation's factors) under --out, with calibration.json (or
comparison.json). Every figure is measured on emulated CPU ranks (hexiseq/runtime/emulation.py); the
"overrun" column says how far the machine's load pushed a rank past its emulated speed (1.00: the
emulation held). Timings depend on the machine and its load: quote them with both.
"""

from __future__ import annotations

import argparse
import json

from ..calibrate.calibrate import calibrate
from ..calibrate.compare import compare
from ..calibrate.profile import resolve_world
from ..errors import HexiSeqError
from .checks import steps_arg, tokens_arg
from .profile import add_world_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="run plans on the local world; predicted vs measured step time, with a fit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_world_args(p)
    p.add_argument("--profile", help="a profile of this world (hexiseq profile); default: measure one first")
    p.add_argument(
        "--calibration",
        help="with --compare: a calibration.json (or its directory) of this cluster to reuse "
        "instead of calibrating first",
    )
    p.add_argument("--model", default="tiny", help="the model to run, from data/models.yaml (default tiny)")
    p.add_argument(
        "--seq-len",
        type=tokens_arg,
        default=None,
        help="tokens per sequence (default 8K; --quick 1K, 2K with --compare)",
    )
    p.add_argument(
        "--steps",
        type=steps_arg,
        default=None,
        help="steps per plan, the first 2 left out as warm-up (default 6, 8 with --compare; --quick 3)",
    )
    p.add_argument("--quick", action="store_true", help="short runs: for tests and a first look, not for the numbers")
    p.add_argument(
        "--compare", action="store_true", help="with an emulated --cluster: the planner's plan vs the best even plan"
    )
    p.add_argument("--out", help="directory of the runs (default runs/calibrate-<time> or runs/compare-<time>)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec, named = resolve_world(args.world, args.cluster)  # bad input refused before any work
    if args.calibration and not args.compare:
        raise HexiSeqError("--calibration is reused by --compare; without it, calibrate measures a new one")
    say = (lambda s: None) if args.json else print
    if args.compare:
        if not named:
            raise HexiSeqError("--compare needs an emulated heterogeneous --cluster (e.g. cpu-4)")
        cmp = compare(
            spec,
            args.profile,
            args.calibration,
            model=args.model,
            seq_len=args.seq_len,
            steps=args.steps,
            quick=args.quick,
            out=args.out,
            say=say,
        )
        if args.json:
            print(json.dumps(cmp.to_dict(), indent=2, default=float))
        else:
            print(cmp.summary())
            print(f"runs and comparison.json in {cmp.out}")
        return 0
    cal = calibrate(
        world=None if named else spec.size,
        cluster=spec if named else None,
        profile=args.profile,
        quick=args.quick,
        model=args.model,
        seq_len=args.seq_len,
        steps=args.steps,
        out=args.out,
        say=say,
    )
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2, default=float))
    else:
        print(cal.table())
        print(cal.summary())
        print(f"runs and calibration.json in {cal.out}")
    return 0
