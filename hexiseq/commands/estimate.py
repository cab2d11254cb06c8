"""`hexiseq estimate`: time, memory and throughput of a plan under the cost model.

    hexiseq estimate --plan plan.json [--cluster C] [--model M] [--json]
    hexiseq estimate --cluster testbed-8 --model llama2-7b --seq-len 128K --layout usp:2x4

Prints per rank the time by phase (seconds per iteration, from the step replay: its own work, the
exposed exchange, parameter traffic and waiting, summing to the iteration time) and memory against
capacity, then the iteration time, tokens/s, MFU, efficiency against the compute bound, the
critical path, and every rank that does not fit.

A joint plan (a version-2 plan file: data-parallel replicas and a sharding strategy, `hexiseq plan
--global-batch G`) is timed as a whole step (costmodel/step.py): each replica's time, sequences and
memory, and the synchronisation terms; the global batch is the sum of its replicas' sequences.

The cost model needs a concrete recompute policy (--recompute none|selective|full). By default it
is the one the plan file records (meta["recompute"], written by `hexiseq plan`), else none.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from ..costmodel import PHASES, estimate
from ..costmodel.step import estimate_step
from ..errors import PlanError, SpecError
from ..plan import Plan, symmetric_plan
from ..runs.config import plan_recompute
from .common import (
    RECOMPUTE_HELP,
    add_cluster_args,
    add_stack_arg,
    add_workload_args,
    dump_json,
    load_cluster_arg,
    load_workload_args,
    print_table,
    stack_options,
)

# Column headers of the per-phase table: the cost model's phase names (PHASES), shortened where long;
# a phase not named here is its own header (tests check every header is short and unique).
PHASE_ABBREVIATIONS = {
    "memory_bound": "mem",
    "lm_head": "head",
    "attention": "attn",
    "alltoall": "a2a",
    "kv_exchange": "kv",
    "recompute": "recomp",
    "operators": "ops",
    "param_comm": "params",
    "optimizer": "optim",
}


def phase_header(phase: str) -> str:
    """The per-phase table's column header of a cost-model phase."""
    return PHASE_ABBREVIATIONS.get(phase, phase)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="estimate time, memory and throughput of a plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--plan", help="plan JSON file (from `hexiseq plan`)")
    p.add_argument("--layout", help="instead of --plan, a symmetric layout on all devices: ring | ulysses | usp:CPxHP")
    add_cluster_args(p, required=False)
    add_workload_args(
        p,
        seq_required=False,
        recompute_help=RECOMPUTE_HELP + "; default: the plan file's policy "
        "(meta['recompute']), else none (auto is the planner's choice, not a policy to estimate)",
    )
    p.set_defaults(model=None)
    add_stack_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def parse_layout(text: str, n: int) -> tuple[int, int]:
    """'ring' -> (n, 1), 'ulysses' -> (1, n), 'usp:4x2' -> (4, 2)."""
    t = text.strip().lower()
    if t == "ring":
        return n, 1
    if t == "ulysses":
        return 1, n
    m = re.fullmatch(r"usp:(\d+)x(\d+)", t)
    if not m:
        raise SpecError(f"--layout must be ring, ulysses or usp:CPxHP (e.g. usp:2x4), got {text!r}")
    cp, hp = int(m.group(1)), int(m.group(2))
    if cp * hp != n:
        raise SpecError(f"--layout {text}: {cp} x {hp} = {cp * hp} devices, but the cluster has {n}")
    return cp, hp


def _inputs(args: argparse.Namespace):
    if bool(args.plan) == bool(args.layout):
        raise SpecError("give exactly one of --plan FILE or --layout ring|ulysses|usp:CPxHP")
    if args.plan:
        plan = Plan.load(args.plan)
        if not args.cluster:
            if not plan.cluster:
                raise PlanError(f"plan {args.plan} names no cluster: pass --cluster")
            args.cluster = plan.cluster
        args.model = args.model or plan.model or "llama2-7b"
        if args.seq_len is None:
            args.seq_len = str(plan.seq_len)
        args.block_size = plan.block_size
    else:
        if not args.cluster or args.seq_len is None:
            raise SpecError("--layout needs --cluster and --seq-len")
        args.model = args.model or "llama2-7b"
    if args.recompute == "auto":
        raise SpecError(
            "hexiseq estimate needs a concrete --recompute (none, selective or full): "
            "auto is the planner's choice (hexiseq plan records it in the plan file)"
        )
    cluster = load_cluster_arg(args)
    if args.plan and plan.cluster and cluster.name != plan.cluster:
        raise PlanError(
            f"plan {args.plan} was made for cluster {plan.cluster!r}, not {cluster.name!r}: its device "
            f"numbers mean other GPUs there (plan that cluster, or drop --cluster)"
        )
    model, wl = load_workload_args(
        args,
        default_recompute=(plan_recompute(plan) if args.plan else None) or "none",
        recorded_model=plan.meta.get("model_spec") if args.plan else None,
    )
    if not args.plan:
        cp, hp = parse_layout(args.layout, cluster.size)
        plan = symmetric_plan(
            range(cluster.size),
            wl.seq_len,
            model.heads,
            model.kv_heads,
            cp,
            hp,
            wl.block_size,
            cluster=cluster.name,
            model=model.name,
        )
    return plan, cluster, model, wl


def run(args: argparse.Namespace) -> int:
    plan, cluster, model, wl = _inputs(args)
    options = stack_options(args)
    if plan.replicas or not plan.sharding.is_default:
        if plan.replicas:
            wl = replace(wl, global_batch=sum(r.sequences for r in plan.replicas))
        step = estimate_step(plan, cluster, model, wl, options)
        if args.json:
            dump_json(step.to_dict())
        else:
            print(step.summary())
        return 0
    e = estimate(plan, cluster, model, wl, options)
    if args.json:
        dump_json(e.to_dict())
        return 0
    print(
        f"plan {plan.name!r} on {cluster.name} ({plan.world_size} of {cluster.size} GPUs), {model.name}, "
        f"S={wl.seq_len}, batch {wl.global_batch}, {wl.param_sharding}, recompute {wl.recompute}"
    )
    rows = []
    for r in e.ranks:
        rows.append(
            [r.rank, r.device, r.gpu, r.group, r.tokens, r.heads]
            + [r.time_s[p] for p in PHASES]
            + [r.busy_s, r.idle_s, f"{r.memory_gib:.1f}/{r.capacity_gib:.1f}", "" if r.fits else "OOM"]
        )
    print_table(
        ["rank", "dev", "gpu", "grp", "tokens", "heads"]
        + [phase_header(p) for p in PHASES]
        + ["busy s", "wait s", "mem/cap GiB", ""],
        rows,
        indent="  ",
    )
    crit = e.ranks[e.critical_rank]
    print(
        "  memory of the critical rank (GiB): "
        + ", ".join(f"{k} {v:.2f}" for k, v in crit.memory_breakdown_gib.items() if v)
    )
    print(e.summary())
    return 0
