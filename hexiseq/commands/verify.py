"""`hexiseq verify`: run one training step of a plan and the same step in one process; compare.

Users check a plan on their own machines before a long run: spawned ranks (gloo on CPU in fp32;
NCCL with bf16 autocast when there is a GPU per rank) run a small Llama under the plan, one
process runs it on the whole sequence with dense attention, and the largest relative errors of
the output, the loss and every parameter gradient are printed. Without --model, a plan file runs
on a proxy Llama with the plan's head counts, and a long plan is scaled to a short sequence with
the same groups, heads and shard proportions (see hexiseq.runtime.verify). Exit 1 when an error
exceeds the tolerance for the dtype; exit 2 when the plan is refused.
"""

from __future__ import annotations

import argparse

from ..errors import PlanError
from ..plan import Plan, random_plan
from ..runtime.capacity import check_local_world
from ..runtime.verify import check_nproc, prepare_check, verify_plan
from ..specs import get_model
from ..specs.workload import BlockSize
from .checks import number_arg, ranks_arg, seed_arg, tokens_arg, tolerance_arg
from .common import add_world_args, dump_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="check a plan numerically: one distributed training step vs one process", description=__doc__
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", help="plan JSON file")
    src.add_argument(
        "--random-plan", action="store_true", help="a random uneven plan for --nproc ranks (hexiseq.plan.random_plan)"
    )
    p.add_argument(
        "--nproc", type=ranks_arg, help="ranks to spawn (default: the plan's world size; required with --random-plan)"
    )
    p.add_argument("--seed", type=seed_arg, default=0, help="random plan, weights and tokens (default 0)")
    p.add_argument(
        "--seq-len",
        type=tokens_arg,
        help="random plan: its length (default 256); plan file: scale it to this length "
        "(default: plans over 8192 tokens are scaled to 2048)",
    )
    p.add_argument(
        "--block-size", type=number_arg(BlockSize), default=16, help="chunk alignment of a random plan (default 16)"
    )
    p.add_argument(
        "--model",
        help="Llama-family model of data/models.yaml or a HF config.json (default: tiny for a random "
        "plan, a proxy with the plan's heads for a plan file)",
    )
    p.add_argument(
        "--tolerance",
        type=tolerance_arg,
        help="largest accepted relative error (default: 1e-4 in fp32, 1e-1 in bf16; fp32 rounding is ~1e-6)",
    )
    add_world_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.random_plan:
        if not args.nproc or args.nproc <= 0:
            raise PlanError("--random-plan needs --nproc N (N >= 1)")
        check_local_world(args.nproc, "--nproc")  # before the plan is made: each rank is a process
        spec = get_model(args.model or "tiny")
        plan = random_plan(
            args.nproc, args.seq_len or 256, spec.heads, spec.kv_heads, seed=args.seed, block_size=args.block_size
        )
        setup = prepare_check(plan, spec)
    else:
        plan = Plan.load(args.plan)
        check_nproc(plan, args.nproc)
        setup = prepare_check(plan, args.model, args.seq_len)
    res = verify_plan(
        setup, seed=args.seed, timeout_s=args.timeout, tolerance=args.tolerance, time_limit_s=args.time_limit
    )
    if args.json:
        dump_json(res)
    else:
        print(
            f"plan {res['plan']!r}: {res['nproc']} ranks, S={res['seq_len']}, model {res['model']}, {res['dtype']} "
            f"({res['backend']})"
        )
        for note in res["notes"]:
            print(f"  note: {note}")
        print(f"  loss      ref {res['loss_ref']:.6f}  dist {res['loss_dist']:.6f}  rel err {res['rel_err_loss']:.2e}")
        if res["max_rel_err_out"] is not None:  # a joint plan compares the loss and gradients of its step
            print(f"  output    max rel err {res['max_rel_err_out']:.2e}")
        print(f"  gradients max rel err {res['max_rel_err_grad']:.2e}  ({res['worst_grad']})")
        print(f"  tolerance {res['tolerance']:.0e} ({res['dtype']}): {'PASS' if res['passed'] else 'FAIL'}")
    return 0 if res["passed"] else 1
