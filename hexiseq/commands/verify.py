"""`hexiseq verify`: run one training step of a plan and the same step in one process; compare.

Users check a plan on their own machines before a long run: spawned ranks (gloo on CPU in fp32;
NCCL with bf16 autocast when there is a GPU per rank) run the tiny model under the plan, one
process runs it on the whole sequence with dense attention, and the largest relative errors of
the output, the loss and every parameter gradient are printed. Exit 1 when one exceeds the
tolerance for the dtype; exit 2 when the plan is refused (invalid, or made for another model).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from ..errors import PlanError
from ..plan import Plan, random_plan
from ..specs import ModelSpec, get_model
from .common import dump_json

# Largest relative error accepted, by compute dtype: fp32 reorders sums only (~1e-7 seen), bf16
# rounds every matmul input (~1e-2 typical between two bf16 runs).
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check a plan numerically: one distributed training step vs one process", description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", help="plan JSON file")
    src.add_argument("--random-plan", action="store_true", help="a random uneven plan for --nproc ranks (hexiseq.plan.random_plan)")
    p.add_argument("--nproc", type=int, help="ranks to spawn (default: the plan's world size; required with --random-plan)")
    p.add_argument("--seed", type=int, default=0, help="random plan, weights and tokens (default 0)")
    p.add_argument("--seq-len", type=int, default=256, help="sequence length of a random plan (default 256)")
    p.add_argument("--block-size", type=int, default=16, help="chunk alignment of a random plan (default 16)")
    p.add_argument("--model", default="tiny", help="Llama-family model of data/models.yaml or a HF config.json (default tiny)")
    p.add_argument("--tolerance", type=float, help="largest accepted relative error (default: 1e-5 in fp32, 5e-2 in bf16)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds before the spawned world is killed (default 180)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|: a norm-wise relative error, robust to entries near zero."""
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def resolve_plan(args: argparse.Namespace, spec: ModelSpec) -> Plan:
    """The plan to verify, checked against the model and the requested world size."""
    if args.random_plan:
        if not args.nproc or args.nproc <= 0:
            raise PlanError("--random-plan needs --nproc N (N >= 1)")
        plan = random_plan(args.nproc, args.seq_len, spec.heads, spec.kv_heads, seed=args.seed, block_size=args.block_size)
    else:
        plan = Plan.load(args.plan)
        if args.nproc is not None and args.nproc != plan.world_size:
            raise PlanError(f"plan {plan.name!r} has {plan.world_size} ranks but --nproc is {args.nproc}")
    return plan.check(model=spec)


def verify_plan(plan: Plan, spec: ModelSpec, seed: int = 0, timeout_s: float = 180.0, tolerance: float | None = None) -> dict[str, Any]:
    """One step under the plan (spawned world) and on one device; the errors between them."""
    from ..runtime.launch import spawn_world
    from ..runtime.model import LlamaConfig
    from ..runtime.train import StepJob, reference_job, step_worker, unpack

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= plan.world_size
    dtype = "bf16" if cuda else "fp32"
    job = StepJob(plan=plan.to_dict(), model=LlamaConfig.from_spec(spec), steps=1, seed=seed, collect=True)
    t0 = time.perf_counter()
    ranks = unpack(spawn_world(step_worker, plan.world_size, job, timeout_s=timeout_s, backend="nccl" if cuda else "gloo"))
    seconds = time.perf_counter() - t0
    ref = reference_job(job, plan.seq_len)
    out = torch.empty_like(ref["output"])
    for r in ranks:  # every rank holds the rows of its own (possibly non-contiguous) shard
        out[r["positions"]] = r["output"]
    grad_errs = {n: max(rel_err(r["grads"][n], g) for r in ranks) for n, g in ref["grads"].items()}
    worst = max(grad_errs, key=grad_errs.__getitem__)
    loss_ref, loss_dist = ref["steps"][0]["loss"], ranks[0]["steps"][0]["loss"]
    errs = {
        "rel_err_loss": abs(loss_dist - loss_ref) / abs(loss_ref),
        "max_rel_err_out": rel_err(out, ref["output"]),
        "max_rel_err_grad": grad_errs[worst],
    }
    tol = tolerance if tolerance is not None else TOLERANCE[dtype]
    return {
        "plan": plan.name, "model": spec.name, "nproc": plan.world_size, "seq_len": plan.seq_len,
        "dtype": dtype, "backend": "nccl" if cuda else "gloo",
        "loss_ref": loss_ref, "loss_dist": loss_dist, **errs, "worst_grad": worst,
        "tolerance": tol, "passed": all(v <= tol for v in errs.values()), "seconds_dist": round(seconds, 3),
    }


def run(args: argparse.Namespace) -> int:
    spec = get_model(args.model)
    plan = resolve_plan(args, spec)
    res = verify_plan(plan, spec, seed=args.seed, timeout_s=args.timeout, tolerance=args.tolerance)
    if args.json:
        dump_json(res)
    else:
        print(f"plan {res['plan']!r}: {res['nproc']} ranks, S={res['seq_len']}, model {res['model']}, {res['dtype']} ({res['backend']})")
        print(f"  loss      ref {res['loss_ref']:.6f}  dist {res['loss_dist']:.6f}  rel err {res['rel_err_loss']:.2e}")
        print(f"  output    max rel err {res['max_rel_err_out']:.2e}")
        print(f"  gradients max rel err {res['max_rel_err_grad']:.2e}  ({res['worst_grad']})")
        print(f"  tolerance {res['tolerance']:.0e} ({res['dtype']}): {'PASS' if res['passed'] else 'FAIL'}")
    return 0 if res["passed"] else 1
