"""The per-node step of a Slurm job script (hexiseq/runs/slurm.py writes the calls):

- `python -m hexiseq.runs.slurm_node --first-node K -- torchrun ... -m hexiseq.cli run ...` runs in
  each task of an `srun` (one task per node) and becomes that node's torchrun agent, told its index
  among the plan's nodes (HEXISEQ_NODE = K + SLURM_PROCID: c10d numbers nodes by arrival, the plan
  by its node mapping; an environment variable, since torchrun would take a `--node` flag for its
  own `--node-rank`). It execs torchrun, so that Slurm's signals reach the agent (and the ranks) once.
- `python -m hexiseq.runs.slurm_node --report RUN_DIR --rc RC` ends the script: one line on how the
  run ended, with the command that continues a stopped run; exit 0 when the run completed or stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

from .rundir import load_summary


def report(run_dir: str, rc: int) -> int:
    """Print how the run ended; the job's exit code (0: completed, or stopped and resumable)."""
    summary = load_summary(run_dir) or {}
    status = summary.get("status")
    done, steps = summary.get("steps_done"), summary.get("steps")
    if status == "completed":
        print(f"hexiseq: the run completed {done} steps: {run_dir}", flush=True)
        return 0
    if status == "stopped":
        print(
            f"hexiseq: the run stopped at step {done} of {steps} (a signal) and checkpointed; continue it with: "
            f"hexiseq launch --slurm --resume {run_dir}",
            flush=True,
        )
        return 0
    why = summary.get("error") or f"the agents exited with {rc}"
    print(f"hexiseq: the run failed: {why} ({run_dir})", file=sys.stderr, flush=True)
    return rc or 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hexiseq.runs.slurm_node", description=__doc__)
    p.add_argument("--first-node", type=int, help="the plan's index of this srun step's first node")
    p.add_argument("--report", metavar="RUN_DIR", help="say how the run in RUN_DIR ended")
    p.add_argument("--rc", type=int, default=0, help="with --report: the agents' exit code")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- torchrun ... (the agent's command)")
    args = p.parse_args(argv)
    if args.report:
        return report(args.report, args.rc)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.first_node is None or not cmd:
        p.error("give --first-node K -- COMMAND, or --report RUN_DIR")
    os.environ["HEXISEQ_NODE"] = str(args.first_node + int(os.environ.get("SLURM_PROCID", "0")))
    os.execv(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
