"""`hexiseq plan --cluster FILE --model NAME --seq-len N`: find the fastest asymmetric CP x HP plan.

Prints the allocation (groups, ranks, memory), the predicted step time and tokens/s of HexiSeq and of
every baseline with the speedup over the best one, the efficiency against the compute-bound limit,
the solver status, lower bound and gap, and the time of each scheduler stage. `--json` prints the
same as one JSON object; `--out` writes the plan itself (the file `hexiseq run` reads).

Recompute: `--recompute auto` (the default) lets the planner try none, selective and full
activation checkpointing and keep the fastest plan that fits (it says which, and the plan file
records it in meta["recompute"], which `hexiseq estimate` and `hexiseq run` then use by default);
`--recompute none|selective|full` plans exactly that policy (bare `--recompute`: selective).

Global batch: with `--global-batch G` above 1 the planner plans the whole step (planner/joint.py):
data-parallel replicas (`--dp auto` any partition of the cluster's structure or one replica, `--dp 1`
one replica, `--dp N` exactly N replicas), each replica's layout, its sequences per step and the
parameter-sharding strategy (ZeRO-1/2/3 over all devices, each replica or each node, or replicated);
the plan file is then version 2 (replicas and sharding). `--global-batch 1` is the one-sequence
problem of the paper (ZeRO-3 over all devices).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..errors import HexiSeqError
from ..planner import Layout, LayoutModel, plan_cluster
from ..planner.joint import JointResult, plan_joint
from ..planner.joint import to_dict as joint_to_dict
from ..specs import GIB, check_output_path
from .common import (
    add_cluster_args,
    add_stack_arg,
    add_workload_args,
    dump_json,
    load_cluster_arg,
    load_workload_args,
    print_table,
    stack_options,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="plan asymmetric CP x HP for a cluster, model and sequence length", description=__doc__
    )
    add_cluster_args(p)
    add_workload_args(p)
    add_stack_arg(p)
    p.add_argument(
        "--work",
        type=int,
        default=None,
        help="cutting-plane rounds the search may spend in all (a deterministic work limit; default 1500)",
    )
    p.add_argument(
        "--gap",
        type=float,
        default=None,
        help="stop when the plan is provably within this fraction of the best (default 0.002)",
    )
    p.add_argument(
        "--write-model",
        metavar="FILE.lp|FILE.mps",
        help="write the optimization model of the chosen layout (with its cutting planes) for reading or another "
        "solver",
    )
    p.add_argument(
        "--dp",
        type=_dp_arg,
        default="auto",
        help="data-parallel replicas when --global-batch > 1: auto (default), 1 (one replica) or N",
    )
    p.add_argument(
        "--workers",
        type=_workers_arg,
        default="auto",
        help="with --global-batch > 1: processes that plan the replica shapes side by side, auto (default: one "
        "per core on clusters of 64 GPUs or more) or N (1: this process alone); the plan is the same for any number",
    )
    p.add_argument("--out", help="write the plan JSON to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--ranks", type=int, default=64, help="print at most this many rank rows (default 64; 0 = all)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.ranks < 0:
        raise HexiSeqError(f"--ranks must be >= 0 (0 = all), got {args.ranks}")
    if args.out:
        check_output_path(args.out, "--out")  # before planning, not after minutes of it
    cluster = load_cluster_arg(args)
    model, workload = load_workload_args(args, default_recompute="auto")
    if args.write_model:
        check_output_path(args.write_model, "--write-model")
        if not args.write_model.endswith((".lp", ".mps")):
            raise HexiSeqError(
                f"--write-model {args.write_model!r}: the file name must end in .lp or .mps (the format)"
            )
    kw = {k: v for k, v in (("work", args.work), ("gap", args.gap)) if v is not None}
    progress = not args.no_progress and not args.json and sys.stderr.isatty()
    options = stack_options(args)
    if workload.global_batch > 1:
        if args.write_model:
            raise HexiSeqError("--write-model writes one layout's model: use it with --global-batch 1")
        joint = plan_joint(
            cluster, model, workload, dp=args.dp, options=options, progress=progress, workers=args.workers
        )
        if args.out:
            joint.plan.save(args.out)
        if args.json:
            dump_json(joint_to_dict(joint))
            return 0
        print_joint(joint, cluster)
        if args.out:
            print(f"plan written to {args.out}")
        return 0
    result = plan_cluster(cluster, model, workload, progress=progress, options=options, **kw)
    if args.write_model:
        write_model(result, cluster, model, workload, args.write_model)
    if args.out:
        result.plan.save(args.out)
    if args.json:
        dump_json(result.to_dict())
        return 0
    print_result(result, cluster, max_ranks=args.ranks)
    if args.out:
        print(f"plan written to {args.out}")
    return 0


def _auto_or_count(flag: str, unit: str) -> Callable[[str], str | int]:
    """An argparse type for `flag`: "auto" or a positive number of `unit`."""

    def parse(text: str) -> str | int:
        if text == "auto":
            return text
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be auto or a positive number of {unit}, got {text!r}")
        return n

    return parse


_dp_arg = _auto_or_count("--dp", "replicas")
_workers_arg = _auto_or_count("--workers", "processes")


def print_joint(res: JointResult, cluster) -> None:
    """The human report of a joint plan: replicas, shares, strategy, synchronisation, the bound."""
    plan = res.plan
    G = sum(r.sequences for r in res.step.replicas)
    print(
        f"HexiSeq joint plan for {plan.model} on {cluster.name} ({cluster.size} GPUs), S = {plan.seq_len:,} tokens, "
        f"global batch {G}: {plan.num_replicas} replica{'s' * (plan.num_replicas > 1)}, {plan.world_size} ranks"
        + (f" ({cluster.size - plan.world_size} devices left out)" if plan.world_size < cluster.size else "")
    )
    for line in res.explanation():
        print(f"  {line}")
    print()
    print(
        f"  step time {res.step_time_s:.4f} s, {_tok(res.tokens_per_s)} tokens/s; efficiency vs the compute-bound "
        f"limit ({_tok(res.bound_tokens_per_s)} tokens/s): {res.efficiency_vs_bound:.3f}"
    )
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in res.stage_times_s.items())
    print(
        f"  planning took {res.plan_time_s:.2f} s on {res.workers} process{'es' * (res.workers > 1)} ({stages}); "
        f"{res.partitions} replica partitions, "
        f"{res.visited} planned in full, {res.shapes_planned} replica shapes planned"
    )
    for n in res.notes:
        print(f"  note: {n}")


def write_model(result, cluster, model, workload, path: str) -> None:
    """The optimization model of the plan's layout and policy, with the cutting planes that bound it."""
    plan = result.plan
    lm = LayoutModel(cluster, model, workload.with_recompute(result.recompute), Layout.of(plan))
    lm.solve()
    lm.write(path)


def _pct(x: float) -> str:
    return "n/a" if x is None or x != x else f"{x:.2%}"


def _tok(x: float) -> str:
    return f"{x:,.0f}"


def print_result(result, cluster, max_ranks: int = 64) -> None:
    """The human report of a PlanResult."""
    plan = result.plan
    print(
        f"HexiSeq plan for {plan.model} on {cluster.name} ({cluster.size} GPUs), S = {plan.seq_len:,} tokens: "
        f"{plan.num_groups} groups, {plan.world_size} ranks"
        + (f" ({cluster.size - plan.world_size} devices left out)" if plan.world_size < cluster.size else "")
    )
    print(f"  grouping: {result.grouping_label}  [{result.source}]")
    print(
        f"  recompute: {result.recompute}"
        + (f" (searched: {', '.join(result.policies_searched)})" if len(result.policies_searched) > 1 else "")
    )
    rows = []
    for gi, g in enumerate(plan.groups):
        types = sorted({cluster.devices[d].gpu.name for d in g.devices})
        rows.append(
            [
                gi,
                ",".join(map(str, g.devices)) if g.size <= 8 else f"{g.devices[0]}..{g.devices[-1]} ({g.size})",
                "+".join(types),
                g.tokens,
                g.chunk_len,
            ]
        )
    print()
    print_table(["group", "devices", "GPU", "tokens", "chunk_len"], rows[: max_ranks or None], indent="  ")
    if max_ranks and len(rows) > max_ranks:
        print(f"  ... {len(rows) - max_ranks} more groups (use --ranks 0 or --json)")
    est = result.estimate
    mem = _rank_memory(est)
    rows = []
    for r, (dev, gi, s, h) in enumerate(zip(plan.rank_devices, plan.group_of_rank, plan.shards, plan.heads)):
        d = cluster.devices[dev]
        used = mem[r] if r < len(mem) else None
        rows.append(
            [
                r,
                f"{dev} {d.name}",
                d.gpu.name,
                gi,
                s,
                h,
                f"{used / GIB:.1f}/{d.gpu.memory_gib:.1f}" if used is not None else "-",
            ]
        )
    print()
    print_table(
        ["rank", "device", "GPU", "group", "tokens", "heads", "memory GiB"], rows[: max_ranks or None], indent="  "
    )
    if max_ranks and len(rows) > max_ranks:
        print(f"  ... {len(rows) - max_ranks} more ranks (use --ranks 0 or --json)")
    print()
    rows = [["hexiseq", result.iteration_time_s, _tok(result.tokens_per_s), "1.000x", result.grouping_label[:48]]]
    for name, b in sorted(result.baselines.items(), key=lambda kv: kv[1].iteration_time_s):
        if b.feasible:
            rows.append(
                [
                    name,
                    b.iteration_time_s,
                    _tok(b.tokens_per_s),
                    f"{result.iteration_time_s / b.iteration_time_s:.3f}x",
                    b.config,
                ]
            )
        else:
            rows.append([name, "-", "-", "-", "; ".join(b.notes) or "infeasible"])
    print_table(["plan", "step s (sim)", "tokens/s", "vs hexiseq", "configuration"], rows, indent="  ")
    print()
    sp = result.speedup_vs_best_baseline
    if sp is not None:
        print(
            f"  speedup over the best baseline ({result.best_baseline.name}): {sp:.3f}x"
            + (
                f"; over the best symmetric CP/HP baseline ({result.best_symmetric_baseline.name}): "
                f"{result.speedup_vs_best_symmetric:.3f}x"
                if result.best_symmetric_baseline and result.best_symmetric_baseline is not result.best_baseline
                else ""
            )
        )
    else:
        print("  no baseline fits in memory on this cluster")
    print(
        f"  efficiency vs the compute-bound limit ({_tok(result.bound_tokens_per_s)} tokens/s): "
        f"{result.efficiency_vs_bound:.3f}"
    )
    print(
        f"  step time (replayed) {result.iteration_time_s:.4f} s; lower bound {result.lower_bound_s:.4f} s "
        f"(what it covers: the note below): this plan is within {_pct(result.gap)} of the best plan at all, "
        f"within {_pct(result.search_gap)} of the best candidate layout the search explored"
    )
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in result.stage_times_s.items())
    print(
        f"  planning took {result.plan_time_s:.2f} s ({stages}); {result.candidates} (layout, policy) candidates: "
        f"{result.solved} searched with their model, {result.pruned} bounded by their devices' subset bound alone "
        f"(balanced compute, parameter collectives); "
        f"{result.work_rounds} cutting-plane rounds"
    )
    for n in result.left_out:
        print(f"  left out: {n}")
    for n in result.notes:
        print(f"  note: {n}")


def _rank_memory(est) -> list[float]:
    """Per-rank memory in bytes from the Estimate (empty when it has none)."""
    if est is None:
        return []
    return [float(r.memory_gib) * GIB for r in getattr(est, "ranks", []) or []]
