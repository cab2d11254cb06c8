"""`hexiseq launch --plan FILE --slurm [--partition GPU_TYPE=NAME ...] [run options]`: a run as a Slurm job.

Writes an sbatch script into the run directory (RUN_DIR/slurm/job-N.sbatch) and submits it: one
job, or a heterogeneous job with one component per partition when the plan's nodes come from
different partitions (`--partition GPU_TYPE=NAME`, repeated, or `--partition NAME` for all; else
the cluster file's `slurm:` section). The nodes follow the plan's node mapping; each runs one
torchrun agent, meeting at a c10d rendezvous on the first node; the environment is passed through
(`--env KEY=VALUE` adds to it). Before submitting, the partitions are checked with sinfo (they
exist, have the nodes, and enough GPUs of the plan's types). `--dry-run` prints the script.

The job asks for SIGTERM before its time ends (`--signal-before`); that, preemption and `scancel`
stop the run at a step boundary with a checkpoint, and `hexiseq launch --slurm --resume RUN_DIR`
submits its continuation. Every other option is `hexiseq run`'s, passed to the ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import HexiSeqError
from ..plan import Plan
from ..runs import slurm
from ..runs.lock import release
from ..runs.progress import closing_lines
from ..runs.rundir import RunDir, default_run_dir
from . import run as run_command
from .checks import ranks_arg

# `hexiseq run` options that launch itself decides (the rest are passed to every rank as given).
OWN = {"help", "plan", "resume", "out", "json", "nproc", "node", "debug"}


def _as_given(convert: Any) -> Any:
    """An argparse type that checks the text with `convert` but keeps the text itself, so that the
    option reaches `hexiseq run` exactly as the user wrote it."""

    def check(text: str) -> str:
        convert(text)
        return text

    check.__name__ = getattr(convert, "__name__", "value")  # argparse names it in its error message
    return check


def _run_parser() -> argparse.ArgumentParser:
    """A fresh `hexiseq run` parser whose options keep their text (for passing them on)."""
    holder = argparse.ArgumentParser(add_help=False)
    run_command.register(holder.add_subparsers())
    parser = holder._subparsers._group_actions[0].choices["run"]
    for action in parser._actions:
        if action.type is not None:
            action.type = _as_given(action.type)
    return parser


def register(sub: argparse._SubParsersAction) -> None:
    run_parser = _run_parser()
    p = sub.add_parser(
        "launch",
        parents=[run_parser],
        conflict_handler="resolve",
        help="a run as a Slurm job (heterogeneous across partitions), submitted with its sbatch script",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="hexiseq launch --plan FILE --slurm [--partition GPU_TYPE=NAME ...] [--time T] [--dry-run] "
        "[run options]\n       hexiseq launch --slurm --resume RUN_DIR [--steps K]   (--help: all options)",
    )
    s = p.add_argument_group("Slurm")
    s.add_argument("--slurm", action="store_true", help="submit to Slurm (the backend of this command)")
    s.add_argument(
        "--partition",
        action="append",
        metavar="[GPU_TYPE=]NAME",
        help="the partition of a GPU type's nodes (repeat per type), or NAME for all "
        "(default: the cluster file's slurm: partitions)",
    )
    s.add_argument("--time", help="the job's time limit, as sbatch --time (e.g. 4:00:00; default: the partition's)")
    s.add_argument("--account", help="sbatch --account")
    s.add_argument("--qos", help="sbatch --qos")
    s.add_argument("--constraint", help="sbatch --constraint (node features), on every component")
    s.add_argument("--no-gpus", action="store_true", help="request no GPUs (CPU ranks with gloo, e.g. a test cluster)")
    s.add_argument("--cpus-per-task", type=ranks_arg, help="CPUs per node's agent (sbatch --cpus-per-task)")
    s.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="export this in the job (repeatable; the rest passes)"
    )
    s.add_argument(
        "--signal-before",
        type=ranks_arg,
        metavar="S",
        help=f"SIGTERM this many seconds before the time limit: the run checkpoints and stops "
        f"(default {slurm.SIGNAL_BEFORE_END_S})",
    )
    s.add_argument("--job-name", help="the job's name (default hexiseq-<plan name>)")
    s.add_argument("--dry-run", action="store_true", help="print the job script; submit nothing, write nothing")
    s.add_argument("--no-check", action="store_true", help="skip the sinfo checks of partitions, nodes and GPUs")
    s.add_argument("--wait", action="store_true", help="wait for the job to end and print the run's result")
    p.set_defaults(func=launch, _run_actions=[a for a in run_parser._actions if a.dest not in OWN])


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The `hexiseq run` options given, as the user wrote them."""
    out: list[str] = []
    for action in args._run_actions:
        value = getattr(args, action.dest, None)
        if value is None or value is False or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            out.append(flag)
        elif action.nargs == "?" and value == action.const:
            out.append(flag)
        else:
            out += [flag, str(value)]
    return out


def _options(args: argparse.Namespace, previous: slurm.SlurmOptions | None = None) -> slurm.SlurmOptions:
    """The job's Slurm options: those given, over the previous job's (a resume) or the defaults."""
    env = dict(previous.env) if previous else {}
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HexiSeqError(f"--env {item!r}: give KEY=VALUE")
        env[key] = value
    base = previous or slurm.SlurmOptions()
    given = {
        "partitions": slurm.parse_partitions(args.partition),
        "time": args.time,
        "account": args.account,
        "qos": args.qos,
        "constraint": args.constraint,
        "gpus": False if args.no_gpus else None,
        "cpus_per_task": args.cpus_per_task,
        "signal_s": args.signal_before,
        "job_name": args.job_name,
    }
    return dataclasses.replace(base, env=env, **{k: v for k, v in given.items() if v not in (None, {})})


def launch(args: argparse.Namespace) -> int:
    if not args.slurm:
        raise HexiSeqError("give --slurm (the only backend of hexiseq launch; for a run on this machine: hexiseq run)")
    passed = _passed_on(args)
    if args.resume:
        run_command.refuse_fixed_on_resume(args)
        run_dir = RunDir.existing(args.resume).path.resolve()
        plan = Plan.load(args.plan) if args.plan else Plan.from_dict(json.loads((run_dir / "plan.json").read_text()))
        run_args = ["run", "--resume", str(run_dir)]
        if args.plan:
            run_args += ["--plan", str(Path(args.plan).resolve())]
    else:
        if not args.plan:
            raise HexiSeqError("give --plan FILE (or --resume RUN_DIR)")
        plan = Plan.load(args.plan).check()
        run_dir = Path(args.out or default_run_dir()).resolve()
        run_args = ["run", "--plan", str(run_dir / "inputs" / "plan.json"), "--out", str(run_dir)]
    previous = slurm.previous_options(run_dir) if args.resume else None  # a resume keeps the job's options
    job = slurm.make_job(plan, run_dir, run_args + passed, _options(args, previous))
    if args.dry_run:
        print(slurm.render(job), end="")
        return 0
    slurm.require_slurm()
    warnings = [] if args.no_check else slurm.check_job(job)
    for w in warnings:
        print(f"hexiseq launch: warning: {w}", file=sys.stderr)
    if not args.resume:
        RunDir.create(run_dir)  # refuses a directory that already holds a run (and locks it while we write)
        (run_dir / "inputs").mkdir(exist_ok=True)
        plan.save(run_dir / "inputs" / "plan.json")
        release(run_dir)  # the job's rank 0 is the run's writer: it takes the lock when it starts
    handle = slurm.submit_script(job)
    comps = ", ".join(f"{c.partition}: {c.nodes} node{'s' * (c.nodes > 1)} x {c.procs}" for c in job.components)
    info = {
        "job_id": handle.job_id,
        "run_dir": str(run_dir),
        "heterogeneous": job.heterogeneous,
        "components": [c.__dict__ for c in job.components],
        "script": str(sorted(job.log_dir.glob("job-*.sbatch"))[-1]),
        "log": str(job.log_dir / f"{handle.job_id}.out"),
        "warnings": warnings,
    }
    out = sys.stderr if args.json else sys.stdout
    print(
        f"hexiseq launch: submitted Slurm job {handle.job_id} "
        f"({'a heterogeneous job, ' if job.heterogeneous else ''}{comps}); run directory {run_dir}\n"
        f"  script {info['script']}, output {info['log']}\n"
        f"  stop it with scancel {handle.job_id} (it checkpoints at a step boundary); "
        f"continue with hexiseq launch --slurm --resume {run_dir}",
        file=out,
    )
    if args.wait:
        summary = handle.wait()
        info["state"], info["summary"] = handle.state, summary
        for line in closing_lines(summary):
            print(line, file=out)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    return 0
