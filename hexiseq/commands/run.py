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
from pathlib import Path

from ..errors import HexiSeqError
from ..plan import Plan
from ..runs.lock import releases_locks
from ..runs.session import begin_record, previous_end
from ..specs.workload import GlobalBatch
from .checks import (
    clip_arg,
    every_arg,
    keep_arg,
    loss_chunk_arg,
    lr_arg,
    min_lr_arg,
    node_arg,
    ranks_arg,
    seed_arg,
    steps_arg,
    warmup_arg,
    wd_arg,
)
from .common import add_recompute_arg, add_world_args, number_arg, tokens_arg

# Defaults of the options a resumed run takes from its config (given on --resume they are refused).
DEFAULTS = {
    "steps": 5,
    "lr": 1e-3,
    "grad_clip": 1.0,
    "global_batch": 1,
    "seed": 0,
    "dtype": "float32",
    "schedule": "cosine",
    "min_lr_ratio": 0.1,
    "weight_decay": 0.1,
    "loss_chunk": 4096,
    "checkpoint_every": 0,
    "keep_checkpoints": 2,
}
FIXED_ON_RESUME = (
    "data",
    "tokenizer",
    "labels",
    "token_dtype",
    "model",
    "init_from",
    "seq_len",
    "lr",
    "grad_clip",
    "global_batch",
    "seed",
    "dtype",
    "schedule",
    "min_lr_ratio",
    "weight_decay",
    "warmup_steps",
    "recompute",
    "loss_chunk",
    "out",
)


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
    d = p.add_argument_group("data")
    d.add_argument(
        "--data", help="text file or folder (*.txt, *.md), or token file (.bin uint16, .npy 1-D stream or 2-D [N, S])"
    )
    d.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (or its folder) for text; default: byte-level")
    d.add_argument("--labels", help="labels .npy of 2-D token data, Hugging Face convention (-100 = ignored)")
    d.add_argument("--token-dtype", help="dtype of a raw .bin token file (default uint16)")
    m = p.add_argument_group("model and plan")
    m.add_argument(
        "--nproc", type=ranks_arg, help="ranks to spawn (default and only valid value: the plan's world size)"
    )
    m.add_argument(
        "--model",
        help="Llama-family model of data/models.yaml or a HF config.json (default: a small proxy "
        "Llama with the plan's head counts)",
    )
    m.add_argument("--init-from", help="Hugging Face checkpoint directory to start from (overrides --model)")
    m.add_argument(
        "--seq-len",
        type=tokens_arg,
        help="scale the plan to this many tokens, same groups, heads and shard proportions "
        "(default: plans over 8192 tokens are scaled to 2048 unless --full-length; 2-D token data: its length)",
    )
    m.add_argument("--full-length", action="store_true", help="run the plan at its own length (for a real GPU run)")
    add_recompute_arg(
        m,
        "activation checkpointing policy: none, selective (a bare --recompute), full "
        "(default: the plan file's policy, meta['recompute'], else none)",
        allow_auto=False,
    )
    m.add_argument("--fsdp", action="store_true", help="shard parameters with FSDP2 (for large models on GPUs)")
    m.add_argument("--loss-chunk", type=loss_chunk_arg, help="tokens per chunk of the LM head + loss (default 4096)")
    m.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        help="CPU parameters and activations (default float32; float64 for exact comparisons); CUDA runs bf16 autocast",
    )
    m.add_argument(
        "--strict-gpus",
        action="store_true",
        help="refuse (not just warn) when a rank's GPU model differs from the plan's device",
    )
    m.add_argument(
        "--node",
        type=node_arg,
        help="torchrun: this node's index among the plan's nodes (default: torchrun's node rank)",
    )
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=steps_arg, help="optimizer steps (default 5; with --resume: the run's, or more)")
    t.add_argument(
        "--global-batch", type=number_arg(GlobalBatch), help="sequences per step, gradients accumulated (default 1)"
    )
    t.add_argument("--lr", type=lr_arg, help="peak AdamW learning rate (default 1e-3)")
    t.add_argument(
        "--warmup-steps", type=warmup_arg, help="linear warmup steps (default: a tenth of the steps, at most 100)"
    )
    t.add_argument(
        "--schedule", choices=["cosine", "constant"], help="after warmup (default cosine, to --min-lr-ratio x lr)"
    )
    t.add_argument(
        "--min-lr-ratio", type=min_lr_arg, help="final learning rate of the cosine, as a fraction of --lr (default 0.1)"
    )
    t.add_argument("--weight-decay", type=wd_arg, help="AdamW weight decay on matrices (default 0.1)")
    t.add_argument("--grad-clip", type=clip_arg, help="max gradient norm (default 1.0; 0 disables)")
    t.add_argument("--seed", type=seed_arg, help="weights and data order (default 0)")
    o = p.add_argument_group("record")
    o.add_argument(
        "--checkpoint-every",
        type=every_arg,
        help="DCP checkpoint every K steps (default 0: at the end, and when stopped)",
    )
    o.add_argument("--keep-checkpoints", type=keep_arg, help="newest checkpoints kept (default 2)")
    o.add_argument("--save", help="also write the final weights here in Hugging Face layout (as hexiseq export)")
    o.add_argument("--plot", action="store_true", help="save the loss curve as RUN_DIR/loss.png")
    o.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    o.add_argument("--json", action="store_true", help="print the summary as JSON (progress goes to stderr)")
    add_world_args(p)
    p.set_defaults(func=run)


def _given(args: argparse.Namespace, key: str) -> bool:
    value = getattr(args, key)
    return value not in (None, False)


@releases_locks  # the run directory's lock (taken by RunDir.create / RunDir.lock) ends with the command
def run(args: argparse.Namespace) -> int:
    from ..runtime.launch import torchrun_env
    from ..runtime.verify import check_nproc

    torchrun = torchrun_env()
    if args.save:  # before any work: a save that fails after training would lose the trained weights
        from ..runtime.checkpoint import check_save_target

        check_save_target(args.save)
    if args.resume:
        given = [k for k in FIXED_ON_RESUME if _given(args, k)]
        if given:
            raise HexiSeqError(
                f"--resume continues the run as configured; {', '.join('--' + k.replace('_', '-') for k in given)} "
                "cannot change (start a new run with --init-from to change them)"
            )
        run_dir, cfg, resume, session, notes = _prepare_resume(args)
        if not torchrun:
            check_nproc(cfg.plan_obj(), args.nproc)
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


def _prepare_new(args: argparse.Namespace, torchrun: bool):
    from ..runs.config import resolve
    from ..runs.rundir import RunDir, default_run_dir

    plan = Plan.load(args.plan)
    out = Path(args.out) if args.out is not None else default_run_dir()
    if args.out is not None and not args.out.strip():
        RunDir.create(args.out)  # refuses --out '' (it is not a directory path)
    existed = out.exists()
    if not torchrun:
        run = RunDir.create(out)
    else:  # every process checks, none writes before the process group exists (all have passed this check)
        run = RunDir(out)
        if run.config.exists():
            raise HexiSeqError(
                f"--out {out}: already holds a run; continue it with --resume {out}, or give another --out"
            )
        run.path.mkdir(parents=True, exist_ok=True)
    steps = args.steps or DEFAULTS["steps"]
    opt = {k: getattr(args, k) if getattr(args, k) is not None else DEFAULTS[k] for k in DEFAULTS}
    warmup = args.warmup_steps if args.warmup_steps is not None else min(100, steps // 10)
    try:
        cfg = resolve(
            plan,
            run.data,
            model=args.model,
            init_from=args.init_from,
            seq_len=args.seq_len,
            full_length=args.full_length,
            data=args.data,
            tokenizer=args.tokenizer,
            labels=args.labels,
            token_dtype=args.token_dtype,
            steps=steps,
            global_batch=opt["global_batch"],
            seed=opt["seed"],
            dtype=opt["dtype"],
            lr=opt["lr"],
            warmup_steps=warmup,
            schedule=opt["schedule"],
            min_lr_ratio=opt["min_lr_ratio"],
            weight_decay=opt["weight_decay"],
            grad_clip=opt["grad_clip"],
            recompute=args.recompute,
            fsdp=args.fsdp,
            loss_chunk=opt["loss_chunk"],
            checkpoint_every=opt["checkpoint_every"],
            keep_checkpoints=opt["keep_checkpoints"],
            strict_gpus=args.strict_gpus,
            tensorboard=not args.no_tensorboard,
            timeout_s=args.timeout,
        )
    except BaseException:
        if not existed:  # nothing half-made is left behind
            import shutil

            if torchrun:  # other processes may be writing there too: only an empty directory goes
                shutil.rmtree(run.data, ignore_errors=True)
                try:
                    run.path.rmdir()
                except OSError:
                    pass
            else:
                shutil.rmtree(run.path, ignore_errors=True)
        raise
    return run, cfg, list(cfg.notes)


def _prepare_resume(args: argparse.Namespace):
    from ..runs import checkpoint as ckpt
    from ..runs.config import for_resume
    from ..runs.rundir import RunDir

    run = RunDir.existing(args.resume)
    run.lock()  # one writer: refused while another run writes this directory
    cfg = run.read_config()  # every field checked, the file named when it is damaged
    cfg, notes = for_resume(cfg, Plan.load(args.plan) if args.plan else None, args.steps, args.timeout)
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
    from ..runs.launch import execute_spawned, execute_torchrun
    from ..runs.progress import Console

    plan = cfg.plan_obj()
    start = 0
    if resume is not None:
        start = int(json.loads((resume / "trainer.json").read_text())["step"])
    console = Console(stream=sys.stderr if args.json else sys.stdout)
    header = [
        f"hexiseq run: plan {plan.name!r}, {plan.world_size} ranks, {plan.seq_len} tokens x {cfg.global_batch}, model "
        f"{cfg.model_name}, steps {start + 1}-{cfg.steps}, recompute {cfg.options['activation_checkpointing']}, lr "
        f"{cfg.train['lr']:g} ({cfg.train['schedule']}, warmup {cfg.train['warmup_steps']})"
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
        from ..runs.plots import save_loss_curve

        console.print(f"loss curve: {save_loss_curve(run.path)}")
    if args.save:
        from ..runs.export import export

        console.print(f"saved to {export(run.path, args.save)} (Hugging Face layout)")
    console.close()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    return 0 if summary.get("status") in ("completed", "stopped") else 1


def _placement(plan: Plan, args: argparse.Namespace):
    """(this torchrun process's Placement, the plan's cluster): the mapping follows the cluster file."""
    from ..runtime.placement import placement_from_env
    from ..specs import load_cluster

    cluster = load_cluster(plan.cluster) if plan.cluster else None
    return placement_from_env(plan, cluster, os.environ, node=args.node), cluster


def _write_run_files(run, cfg, resume, start: int, session: int) -> None:
    """The record a run starts with: the run directory locked, config.json, plan.json (earlier plans
    kept in plans/), and the metrics cut back to `start` (the checkpoint's step; 0 without one)."""
    begin_record(run, start)  # locked; metrics cut back to `start` (0 also on a resume with no checkpoint)
    previous = run.read_json(run.plan)
    if previous is not None and previous != cfg.plan:
        (run.path / "plans").mkdir(exist_ok=True)
        run.write_json(run.path / "plans" / f"plan-until-step-{start:08d}.json", previous)
    run.write_json(run.config, cfg.to_dict())
    run.write_json(run.plan, cfg.plan)
    run.set_status("starting", session=session)


def time_limit_exit(limit_s: float, run=None, cfg=None, lead: bool = False) -> None:
    """A torchrun process past --time-limit: the summary says so (rank 0), one line, exit 1
    (torchrun ends the others). The last checkpoint stays resumable."""
    message = f"stopped at the --time-limit of {limit_s:g} s"
    if lead and run is not None:
        try:
            from ..runs.loop import write_summary

            write_summary(run, cfg, None, "failed", error=message)
        except Exception:
            pass
    print(f"hexiseq run: rank {os.environ.get('RANK', '?')}: {message}", file=sys.stderr, flush=True)
    os._exit(1)
