"""The executor's operators per piece of a step (data/operators.yaml), measured from recorded runs.

Every emulated rank counts the aten operators it runs (runtime/emulation.py, `PacerStats.ops`, over
all the run's steps). A run's plan, recompute policy and sequences per replica give each rank's
pieces per step (costmodel/operators.py, `pieces_per_step`: linear parts, attention rounds,
all-to-alls, the optimizer step); the counts are the least-squares solution of
counted = Σ pieces × operators per piece over every rank of every run, and the fit's residuals say
how far the piece model is from the counts (a rank without heads, the causal rounds that skip half
their blocks and the sharding's own copies are what it does not model).

    python -m hexiseq.calibrate.operator_counts RUN_DIR [RUN_DIR ...] [--write data/operators.yaml]

Runs of `hexiseq calibrate` and `benchmarks/bench_dp.py` (their run directories) are what it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..costmodel.operators import pieces_per_step
from ..costmodel.policy import RULES
from ..errors import HexiSeqError
from ..plan import Plan
from ..runs.rundir import RunDir
from ..specs import write_text_atomic
from ..specs.operators import COUNT_FIELDS


def run_rows(run_dir: str | Path) -> list[tuple[np.ndarray, float]]:
    """One (pieces per step, operators counted per step) row per paced rank of a finished run."""
    rd = RunDir(run_dir)
    summary, config = rd.read_json(rd.summary), rd.read_json(rd.config)
    if not summary or not config:
        raise HexiSeqError(f"{run_dir}: no summary.json or config.json; give the directory of a finished run")
    pacing = (summary.get("emulation") or {}).get("pacing") or []
    steps = int(summary.get("steps_done") or 0)
    if not pacing or steps < 1:
        raise HexiSeqError(f"{run_dir}: the run has no operator counts (an emulated run of at least one step)")
    plan = Plan.from_dict(config["plan"], f"{run_dir}/config.json")
    rule = RULES[config["options"]["activation_checkpointing"]]
    layers = int(config["model"]["layers"])
    rows = []
    for i, sequences in enumerate(plan.sequences_of(int(config["global_batch"]))):
        rep = plan.replica(i)
        grp = np.array(rep.group_of_rank)
        eta = np.array([h for g in rep.groups for h in g.heads], dtype=float)
        pieces = pieces_per_step(grp, eta, rep.num_groups, rule, layers, sequences)
        for local, rank in enumerate(plan.replica_ranks(i)):
            p = pacing[rank] if rank < len(pacing) else None
            if p and p.get("ops"):
                rows.append((np.array([pieces[f][local] for f in COUNT_FIELDS]), p["ops"] / steps))
    return rows


def solve_counts(rows: list[tuple[np.ndarray, float]]) -> dict[str, Any]:
    """The operators per piece that best explain `rows` (pieces per step, operators counted per step):
    least squares, with the fit's relative residuals: {"counts": {field: operators}, "ranks": n,
    "median_error", "worst_error"}. Refused when the rows cannot tell every count apart."""
    if len(rows) < len(COUNT_FIELDS):
        raise HexiSeqError(f"{len(rows)} ranks counted; the fit of {len(COUNT_FIELDS)} counts needs more runs")
    X = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    rank = int(np.linalg.matrix_rank(X))
    if rank < len(COUNT_FIELDS):
        raise HexiSeqError(
            f"the runs' pieces have rank {rank} < {len(COUNT_FIELDS)}: add runs with other recompute policies, "
            "group sizes and global batches so that every count can be told apart"
        )
    x = np.linalg.lstsq(X, y, rcond=None)[0]
    err = np.abs(X @ x / y - 1.0)
    return {
        "counts": {f: round(float(v), 2) for f, v in zip(COUNT_FIELDS, x)},
        "ranks": len(rows),
        "median_error": float(np.median(err)),
        "worst_error": float(err.max()),
    }


def fit_counts(run_dirs: Iterable[str | Path]) -> dict[str, Any]:
    """`solve_counts` over every paced rank of `run_dirs`, with the number of runs."""
    dirs = [str(d) for d in run_dirs]
    return {**solve_counts([row for d in dirs for row in run_rows(d)]), "runs": len(dirs)}


def write_counts(fit: dict[str, Any], path: str | Path, command: str, runs: list[str]) -> None:
    """data/operators.yaml from a fit, with its record (the command, torch, the residuals)."""
    lines = [
        "# yaml-language-server: $schema=schemas/operators.schema.json",
        "# Operators per executed piece of a step (hexiseq/specs/operators.py). Written by",
        f"#   {command}",
        "# (hexiseq/calibrate/operator_counts.py: least squares over every emulated rank of the runs).",
        *(f"{f}: {v}" for f, v in fit["counts"].items()),
        "measured:",
        f"  command: {json.dumps(command)}",
        f"  when: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}",
        f"  torch: {torch.__version__}",
        f"  runs: {fit['runs']}",
        f"  ranks: {fit['ranks']}",
        f"  median_error: {fit['median_error']:.4f}",
        f"  worst_error: {fit['worst_error']:.4f}",
        "  run_names: [" + ", ".join(json.dumps("/".join(Path(r).parts[-2:])) for r in runs) + "]",
    ]
    write_text_atomic(Path(path), "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hexiseq.calibrate.operator_counts", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="directories of finished emulated runs")
    ap.add_argument("--write", help="write the counts to this file (data/operators.yaml)")
    args = ap.parse_args(argv)
    fit = fit_counts(args.runs)
    print(json.dumps(fit, indent=2))
    if args.write:
        cmd = "python -m hexiseq.calibrate.operator_counts " + " ".join(args.runs) + f" --write {args.write}"
        write_counts(fit, args.write, cmd, args.runs)
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
