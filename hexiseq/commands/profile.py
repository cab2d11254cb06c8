"""`hexiseq profile [--world N | --cluster C] [--model M] [--seq-len S] [--out FILE] [--json]`: measure the
local devices and links of a running world of CPU ranks and write a profile the cost model reads.

    hexiseq profile                              4 ranks of this machine -> profiles/cpu-local-4.yaml
    hexiseq profile --cluster cpu-4 --out data/profiles/cpu-4.yaml
    hexiseq plan --cluster cpu-4 --model tiny --seq-len 8K --profile data/profiles/cpu-4.yaml

Each rank times the kernels a plan of MODEL at S tokens runs (linear layers, attention blocks,
memory-bound kernels; default tiny at 8K tokens), all ranks at once; then every pair of ranks
exchanges messages (latency and bandwidth) and the world runs an all-to-all. With --cluster the
ranks emulate the cluster's devices and links (hexiseq/runtime/emulation.py; its device types must
be the CPU-x<f> types of data/gpus-cpu.yaml). The file says what was run, when, on what machine and
under what load (data/profiles/README.md). An existing file is not overwritten without --force.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..calibrate.profile import profile, resolve_world
from ..errors import HexiSeqError
from .checks import ranks_arg, tokens_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the local devices and links; write a profile for --profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_world_args(p)
    p.add_argument("--model", default="tiny", help="whose shapes are timed: a model of data/models.yaml (default tiny)")
    p.add_argument(
        "--seq-len",
        type=tokens_arg,
        default=None,
        help="tokens per sequence of the timed shapes (default 8K; --quick 2K)",
    )
    p.add_argument("--quick", action="store_true", help="short: 2K tokens, 2 repeats (tests, a first look)")
    p.add_argument("--out", help="the profile file to write (default profiles/<world>.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite --out when it exists")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.set_defaults(func=run)


def add_world_args(p: argparse.ArgumentParser) -> None:
    """--world / --cluster: the CPU world to measure (shared with `hexiseq calibrate`)."""
    p.add_argument("--world", type=ranks_arg, default=None, help="CPU ranks of this machine, one node (default 4)")
    p.add_argument(
        "--cluster",
        help="an emulated cluster (its devices are CPU-x<f> types), e.g. cpu-4: ranks emulate its devices and links",
    )


def run(args: argparse.Namespace) -> int:
    spec, named = resolve_world(args.world, args.cluster)  # bad input refused before anything starts
    out = Path(args.out or f"profiles/{spec.name}.yaml")
    if out.exists() and not args.force:
        raise HexiSeqError(f"--out {out} exists; give --force to overwrite it, or another --out")
    if out.suffix not in (".yaml", ".yml"):
        raise HexiSeqError(f"--out {out}: a profile is a YAML file (.yaml)")
    say = (lambda s: None) if args.json else print
    prof = profile(
        world=None if named else spec.size,
        cluster=spec if named else None,
        model=args.model,
        seq_len=args.seq_len,
        quick=args.quick,
        say=say,
    )
    prof.save(out)
    if args.json:
        print(json.dumps({**prof.to_dict(), "file": str(out)}, indent=2, default=float))
    else:
        print(
            f"profile written to {out} (use it with: hexiseq plan/estimate --cluster {spec.name if named else '...'} "
            f"--profile {out})"
        )
    return 0
