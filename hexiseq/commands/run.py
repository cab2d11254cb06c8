"""`hexiseq run --plan FILE --nproc N [--steps K] [--model tiny]`: a short real training run of a plan.

On this machine the ranks are spawned processes (gloo on CPU; NCCL when there is a GPU per rank);
under `torchrun` each process runs its own rank. The data is one synthetic sequence of the plan's
length (seeded random token ids), trained on for K steps; rank 0 prints the loss and tokens/s of
every step. Start from pretrained weights with `--init-from` (a Hugging Face checkpoint directory)
and write the result with `--save`.
"""

from __future__ import annotations

import argparse
import os
import statistics

from ..errors import PlanError
from ..plan import Plan
from .checks import check_args
from .common import add_recompute_arg, add_world_args, plan_recompute


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="a short training run of a plan (spawned ranks or torchrun)", description=__doc__)
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--nproc", type=int, help="ranks to spawn (default and only valid value: the plan's world size)")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--model", help="Llama-family model of data/models.yaml or a HF config.json (default: a small proxy "
                   "Llama with the plan's head counts)")
    p.add_argument("--seq-len", type=int, help="scale the plan to this many tokens, same groups, heads and shard proportions "
                   "(default: plans over 8192 tokens are scaled to 2048 unless --full-length)")
    p.add_argument("--full-length", action="store_true", help="run the plan at its own length (for a real GPU run)")
    p.add_argument("--init-from", help="Hugging Face checkpoint directory to start from (overrides --model)")
    p.add_argument("--save", help="write the trained weights here in Hugging Face layout")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (default 1.0; 0 disables)")
    add_recompute_arg(p, "activation checkpointing policy: none, selective (a bare --recompute), full "
                         "(default: the plan file's policy, meta['recompute'], else none)", allow_auto=False)
    p.add_argument("--fsdp", action="store_true", help="shard parameters with FSDP2 (for large models on GPUs)")
    p.add_argument("--loss-chunk", type=int, default=4096, help="tokens per chunk of the LM head + loss (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="weights and data (default 0)")
    p.add_argument("--strict-gpus", action="store_true", help="refuse (not just warn) when a rank's GPU model differs from the plan's device")
    add_world_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..runtime.checkpoint import check_save_target, inspect_checkpoint, model_spec_from_checkpoint
    from ..runtime.parallel import ParallelOptions
    from ..runtime.train import StepJob, TrainConfig, step_worker
    from ..runtime.verify import check_nproc, prepare_check, scale_for_check

    check_args(args, "--steps", "--loss-chunk", "--timeout", "--time-limit", "--lr", "--grad-clip", "--seed", "--seq-len", "--nproc")
    if args.save:  # before any work: a save that fails after training would lose the trained weights
        check_save_target(args.save)
    plan = Plan.load(args.plan)
    recompute = args.recompute or plan_recompute(plan) or "none"
    notes: tuple[str, ...] = ()
    seq = plan.seq_len if args.full_length else args.seq_len
    if args.init_from:
        cfg = inspect_checkpoint(args.init_from)  # readable, complete, right shapes, floating dtypes
        spec = model_spec_from_checkpoint(args.init_from)
        plan.check(model=spec)
        name = spec.name
        plan, scale_notes = scale_for_check(plan, seq)
        notes = tuple(scale_notes)
    else:
        setup = prepare_check(plan, args.model, seq)
        plan, cfg, name, notes = setup.plan, setup.model, setup.model_name, setup.notes
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    nproc = args.nproc if args.nproc is not None else plan.world_size
    if not torchrun:
        check_nproc(plan, nproc)
    job = StepJob(
        plan=plan.to_dict(), model=cfg, steps=args.steps, seed=args.seed,
        train=TrainConfig(lr=args.lr, grad_clip=args.grad_clip or None, timeout_s=args.timeout),
        options=ParallelOptions(fsdp=args.fsdp, activation_checkpointing=recompute, loss_chunk=args.loss_chunk),
        init_from=args.init_from, save_to=args.save, show=True, strict_gpus=args.strict_gpus,
    )
    if not torchrun or os.environ.get("RANK") == "0":
        print(f"hexiseq run: plan {plan.name!r}, {plan.world_size} ranks, {plan.seq_len} tokens, model {name}, {args.steps} steps, "
              f"recompute {recompute}")
        for note in notes:
            print(f"  note: {note}")
    if torchrun:  # this process is one rank; check_world (in step_worker) refuses a wrong world size
        from ..runtime.launch import arm_time_limit, init_from_env

        arm_time_limit(args.time_limit, lambda: time_limit_exit(args.time_limit))
        rank, world = init_from_env(timeout_s=args.timeout)
        result = step_worker(rank, world, job)
        if rank != 0:
            return 0
    else:
        from ..runtime.launch import local_backend, spawn_world

        result = spawn_world(step_worker, nproc, job, timeout_s=args.time_limit, pg_timeout_s=args.timeout, backend=local_backend(nproc))[0]
    steps = result["steps"]
    steady = [s["tokens_per_s"] for s in steps[1:]] or [steps[0]["tokens_per_s"]]  # the first step warms up
    print(f"done: loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}; {statistics.median(steady):,.0f} tokens/s (median after step 1)")
    if args.save:
        print(f"saved to {args.save}")
    return 0


def time_limit_exit(limit_s: float) -> None:
    """A torchrun process past --time-limit: one line, then exit 1 (torchrun ends the others)."""
    import sys

    rank = os.environ.get("RANK", "?")
    print(f"hexiseq run: rank {rank}: stopped at the --time-limit of {limit_s:g} s", file=sys.stderr, flush=True)
    os._exit(1)
