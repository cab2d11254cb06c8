"""`hexiseq run --plan FILE [--data PATH] [--steps K] [--out RUN_DIR]`: a real training run of a plan.

On this machine the ranks are spawned processes (gloo on CPU; NCCL when there is a GPU per rank);
under `torchrun` each process is the rank of its device (node and local rank follow the cluster
file). The data: a text file or folder (tokenized with --tokenizer's tokenizer.json, else
byte-level), or token files (.bin / .npy, memory-mapped), packed into sequences of the plan's
length; without --data, one synthetic sequence. AdamW with warmup and a cosine schedule, gradient
accumulation over --global-batch sequences, clipping. Everything is recorded in the run directory
(--out, default runs/<timestamp>): config, plan, metrics.jsonl, summary.json (measured vs predicted
step time), TensorBoard events, console log and DCP checkpoints; `--resume RUN_DIR` continues it
exactly, also under another plan (`--plan new.json`: the checkpoint is resharded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from ..calibrate.emulated_clusters import emulation_of
from ..errors import HexiSeqError
from ..plan import Plan
from ..runs import checkpoint as ckpt
from ..runs.config import for_resume
from ..runs.export import export
from ..runs.launch import execute_spawned, execute_torchrun
from ..runs.lock import releases_locks
from ..runs.loop import write_summary
from ..runs.plots import save_loss_curve
from ..runs.progress import Console
from ..runs.rundir import RunDir
from ..runs.session import begin_record, previous_end
from ..runs.settings import OptionField, RunSettings, given_value, options
from ..runs.start import start_run
from ..runtime.failures import print_line
from ..runtime.hf_checkpoint import check_save_target
from ..runtime.placement import placement_from_env
from ..runtime.verify import check_nproc
from ..runtime.world import torchrun_env
from ..specs import load_cluster
from .checks import (
    node_arg,
    number_arg,
    ranks_arg,
    tokens_arg,
)
from .common import add_world_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="a real training run of a plan (spawned ranks or torchrun), recorded in a run directory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="hexiseq run --plan FILE [--data PATH] [--steps K] [--out RUN_DIR] [options]\n"
        "       hexiseq run --resume RUN_DIR [--plan NEW] [--steps K] [options]   (--help: all options)",
    )
    p.add_argument(
        "--plan", help="plan JSON file (with --resume: a new plan for the run, e.g. for a cluster that lost a node)"
    )
    p.add_argument(
        "--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint (config from RUN_DIR)"
    )
    p.add_argument(
        "--checkpoint", metavar="NAME", help="with --resume: the checkpoint to continue from (e.g. step-00000020)"
    )
    p.add_argument(
        "--out", metavar="RUN_DIR", help="the run directory (default runs/<timestamp>; required under torchrun)"
    )
    groups = {
        "data": p.add_argument_group("data"),
        "model": p.add_argument_group("model and plan"),
        "train": p.add_argument_group("training"),
        "record": p.add_argument_group("record"),
    }
    groups["parallel"] = groups["model"]
    groups["model"].add_argument(
        "--nproc", type=ranks_arg, help="ranks to spawn (default and only valid value: the plan's world size)"
    )
    groups["model"].add_argument(
        "--node",
        type=node_arg,
        help="torchrun: this node's index among the plan's nodes (default: torchrun's node rank)",
    )
    for row in options():
        add_option(groups[row.section], row)
    o = groups["record"]
    o.add_argument("--save", help="also write the final weights here in Hugging Face layout (as hexiseq export)")
    o.add_argument("--plot", action="store_true", help="save the loss curve as RUN_DIR/loss.png")
    o.add_argument("--json", action="store_true", help="print the summary as JSON (progress goes to stderr)")
    add_world_args(p)
    p.set_defaults(func=run)


def add_option(group: argparse._ArgumentGroup, row: OptionField) -> None:
    """One option of the field table on the command line. Its argparse default is None (a flag:
    False): "not given", so that a resumed run keeps its own value and a new run takes the table's."""
    how = row.option
    if isinstance(row.default, bool):
        group.add_argument(row.flag, action="store_true", help=how.help)
        return
    kwargs: dict = {"help": how.help, "default": None}
    if how.number is not None:
        kwargs["type"] = number_arg(how.number)
    elif how.tokens:
        kwargs["type"] = tokens_arg
    if how.choices:
        kwargs["choices"] = list(how.choices)
    if how.bare is not None:
        kwargs.update(nargs="?", const=how.bare, metavar="{" + ",".join(how.choices) + "}")
    group.add_argument(row.flag, **kwargs)


def _option_values(args: argparse.Namespace) -> dict:
    """The field table's options as given on the command line, by key."""
    return {row.key: getattr(args, row.key) for row in options()}


@releases_locks  # the run directory's lock (taken by RunDir.create / RunDir.lock) ends with the command
def run(args: argparse.Namespace) -> int:
    torchrun = torchrun_env()
    if args.save:  # before any work: a save that fails after training would lose the trained weights
        check_save_target(args.save)
    if args.resume:
        refuse_fixed_on_resume(args)
        run_dir, cfg, resume, session, notes = _prepare_resume(args, torchrun)
        if not torchrun:
            check_nproc(cfg.plan, args.nproc)
    else:
        if not args.plan:
            raise HexiSeqError("give --plan FILE (or --resume RUN_DIR)")
        if torchrun and not args.out:
            raise HexiSeqError(
                "under torchrun give --out RUN_DIR (on a filesystem every node sees): the processes must agree on it"
            )
        # the world against the plan first: nothing is written for a run that cannot start
        if torchrun:
            _placement(Plan.load(args.plan), args)
        else:
            check_nproc(Plan.load(args.plan), args.nproc)
        run_dir, cfg, notes = _prepare_new(args, torchrun)
        resume, session = None, 0
    return _execute(args, run_dir, cfg, resume, session, notes, torchrun)


def refuse_fixed_on_resume(args: argparse.Namespace) -> None:
    """A resumed run continues as configured: refuse the options it may not change (the field
    table's `fixed_on_resume`, and --out), by flag. Also `hexiseq launch --resume`."""
    given = [row.flag for row in options() if row.option.fixed_on_resume and given_value(getattr(args, row.key, None))]
    given += ["--out"] if getattr(args, "out", None) else []
    if given:
        raise HexiSeqError(
            f"--resume continues the run as configured; {', '.join(given)} "
            "cannot change (start a new run with --init-from to change them)"
        )


def _prepare_new(args: argparse.Namespace, torchrun: bool):
    plan = Plan.load(args.plan)
    settings = RunSettings.from_options(_option_values(args), emulation=emulation_of(plan))
    settings = replace(settings, train=replace(settings.train, timeout_s=args.timeout))
    run, cfg = start_run(plan, settings, args.out, shared=torchrun)
    return run, cfg, list(cfg.notes)


def _prepare_resume(args: argparse.Namespace, torchrun: bool):
    run = RunDir.existing(args.resume)
    if not torchrun:  # one writer: refused while another run writes this directory. Under torchrun every
        run.lock()  # process of the world gets here: rank 0 takes the lock when it writes the record

    cfg = run.read_config()  # every field checked, the file named when it is damaged
    plan = Plan.load(args.plan) if args.plan else None
    emulation = emulation_of(plan) if plan is not None else None
    cfg, notes = for_resume(cfg, plan, _option_values(args), args.timeout, emulation)
    notes += previous_end(run)  # a stale "training" status: the last session was killed
    found = ckpt.find(
        run.checkpoints, args.checkpoint
    )  # verified against its manifest: corrupt ones are refused, named
    if found is None:
        notes.append("no checkpoint yet: the run starts from step 0")
        return run, cfg, None, 0, notes
    path, trainer = found
    if args.steps is not None and args.steps < trainer["step"]:
        raise HexiSeqError(
            f"--steps {args.steps}: the run is at step {trainer['step']} already (checkpoint {path.name}); "
            f"--steps is the run's total: give more than {trainer['step']} to train further"
        )
    if trainer["step"] >= cfg.steps:
        raise HexiSeqError(
            f"--resume {run.path}: checkpoint {path.name} is at step {trainer['step']} of {cfg.steps}: the run is "
            "complete; give --steps N (more) to train further"
        )
    session = int(trainer.get("session", 0)) + 1
    notes.append(f"resuming from {path.name} (step {trainer['step']}, written by {trainer['world_size']} ranks)")
    return run, cfg, path, session, notes


def _execute(args, run, cfg, resume, session, notes, torchrun: bool) -> int:
    plan = cfg.plan
    start = 0
    if resume is not None:
        start = int(json.loads((resume / "trainer.json").read_text())["step"])
    console = Console(stream=sys.stderr if args.json else sys.stdout)
    header = [
        f"hexiseq run: plan {plan.name!r}, {plan.world_size} ranks, {plan.seq_len} tokens x {cfg.global_batch}, model "
        f"{cfg.model_name}, steps {start + 1}-{cfg.steps}, recompute {cfg.options.activation_checkpointing}, lr "
        f"{cfg.train.lr:g} ({cfg.train.schedule}, warmup {cfg.train.warmup_steps})"
    ]
    header += [f"  note: {n}" for n in notes]
    header.append(f"  run directory: {run.path}")
    if not torchrun:
        _write_run_files(run, cfg, resume, start, session)
        console.attach(run.console)
        for line in header:
            console.print(line)
        summary = execute_spawned(run, cfg, resume, session, console, start, args.timeout, args.time_limit)
    else:
        placement, cluster = _placement(plan, args)
        if placement.rank == 0:
            console.attach(run.console)
            for line in header:
                console.print(line)
        summary = execute_torchrun(
            run,
            cfg,
            resume,
            session,
            console,
            start,
            placement,
            cluster,
            args.timeout,
            args.time_limit,
            on_time_limit=lambda: time_limit_exit(args.time_limit, run, cfg, placement.rank == 0),
            before_training=lambda rank: _write_run_files(run, cfg, resume, start, session) if rank == 0 else None,
        )
        if summary is None:
            return 0
    if args.plot:
        console.print(f"loss curve: {save_loss_curve(run.path)}")
    if args.save:
        console.print(f"saved to {export(run.path, args.save)} (Hugging Face layout)")
    console.close()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    return 0 if summary.get("status") in ("completed", "stopped") else 1


def _placement(plan: Plan, args: argparse.Namespace):
    """(this torchrun process's Placement, the plan's cluster): the mapping follows the cluster file."""
    cluster = load_cluster(plan.cluster) if plan.cluster else None
    return placement_from_env(plan, cluster, os.environ, node=args.node), cluster


def _write_run_files(run, cfg, resume, start: int, session: int) -> None:
    """The record a run starts with: the run directory locked, config.json, plan.json (earlier plans
    kept in plans/), and the metrics cut back to `start` (the checkpoint's step; 0 without one)."""
    begin_record(run, start)  # locked; metrics cut back to `start` (0 also on a resume with no checkpoint)
    previous = run.read_json(run.plan)
    if previous is not None and previous != cfg.plan.to_dict():
        (run.path / "plans").mkdir(exist_ok=True)
        run.write_json(run.path / "plans" / f"plan-until-step-{start:08d}.json", previous)
    run.write_json(run.config, cfg.to_dict())
    run.write_json(run.plan, cfg.plan.to_dict())
    run.set_status("starting", session=session)


def time_limit_exit(limit_s: float, run=None, cfg=None, lead: bool = False) -> None:
    """A torchrun process past --time-limit: the summary says so (rank 0), one line, exit 1
    (torchrun ends the others). The last checkpoint stays resumable."""
    message = f"stopped at the --time-limit of {limit_s:g} s"
    if lead and run is not None:
        try:
            write_summary(run, cfg, None, "failed", error=message)
        except Exception:
            pass
    print_line(f"hexiseq run: rank {os.environ.get('RANK', '?')}: {message}")
    os._exit(1)
