"""Helpers shared by the subcommands: common arguments, loading specs, printing tables."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..costmodel import CostOptions
from ..specs import (
    RECOMPUTE_POLICIES,
    ClusterSpec,
    ModelSpec,
    RecomputePolicy,
    Workload,
    load_cluster,
    load_profile,
    parse_tokens,
)
from ..specs.identity import model_named
from ..specs.stacks import DEFAULT_STACK_NAME, Stack, get_stack, stack_catalog
from ..specs.workload import BlockSize, GlobalBatch
from .checks import number_arg, time_limit_arg, timeout_arg, tokens_arg


def add_cluster_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--cluster", required=required, help="cluster YAML file, or the name of a bundled one (e.g. testbed-8)"
    )
    p.add_argument("--profile", help="YAML of measured efficiencies overriding the GPU catalog (data/profiles/)")


def add_stack_arg(p: argparse.ArgumentParser) -> None:
    """`--stack NAME`: the software stack whose kernel factors scale the catalog's rates."""
    p.add_argument(
        "--stack",
        default=None,
        help=f"software stack of data/stacks.yaml whose kernel factors (FP8 GEMMs, another attention kernel) "
        f"scale the GPU catalog's rates (default {DEFAULT_STACK_NAME}: flash-attention 2, bf16, the executor's)",
    )


def load_stack_arg(args: argparse.Namespace) -> Stack:
    """The stack of --stack; without one, the default stack, and a line on stderr that says so."""
    name = getattr(args, "stack", None)
    if name is None:
        print(
            f"stack: {DEFAULT_STACK_NAME} assumed (the default; --stack NAME for another of "
            f"{', '.join(stack_catalog())})",
            file=sys.stderr,
        )
    return get_stack(name)


def stack_options(args: argparse.Namespace, options: CostOptions | None = None) -> CostOptions:
    """The cost options of a command: `options` (default CostOptions()) on the stack of --stack."""
    return dataclasses.replace(options or CostOptions(), stack=load_stack_arg(args))


RECOMPUTE_HELP = (
    "activation checkpointing policy: none, selective (recompute the linear parts; a bare --recompute "
    "means this), full (recompute the whole block, attention and its communication included)"
)


def add_workload_args(p: argparse.ArgumentParser, seq_required: bool = True, recompute_help: str | None = None) -> None:
    p.add_argument(
        "--model", default="llama2-7b", help="model name from data/models.yaml or a HF config.json (default llama2-7b)"
    )
    p.add_argument(
        "--seq-len", required=seq_required, type=tokens_arg, help="tokens per sequence, e.g. 131072, 128K, 1M"
    )
    p.add_argument(
        "--global-batch",
        type=number_arg(GlobalBatch),
        default=1,
        help="sequences per iteration (gradient accumulation)",
    )
    add_recompute_arg(
        p,
        recompute_help or RECOMPUTE_HELP + ", auto (the planner picks the fastest that fits; the default)",
        allow_auto=True,
    )
    p.add_argument(
        "--sharding", choices=["zero3", "replicated"], default="zero3", help="parameter/optimizer state sharding"
    )
    p.add_argument(
        "--block-size", type=number_arg(BlockSize), default=128, help="chunk alignment in tokens (default 128)"
    )


def add_recompute_arg(p: argparse.ArgumentParser, help: str, allow_auto: bool) -> None:
    """`--recompute [POLICY]`; a bare `--recompute` keeps its old meaning, selective. The default
    (None) lets each command choose (plan: auto; estimate / run: the plan file's policy, else none)."""
    choices = [str(p) for p in RECOMPUTE_POLICIES] + ([str(RecomputePolicy.AUTO)] if allow_auto else [])
    p.add_argument(
        "--recompute",
        nargs="?",
        const=str(RecomputePolicy.SELECTIVE),
        default=None,
        choices=choices,
        metavar="{" + ",".join(choices) + "}",
        help=help,
    )


def add_world_args(p: argparse.ArgumentParser, timeout: float = 300.0) -> None:
    """--timeout (every collective), --time-limit (the whole run), --debug: the spawned/torchrun world's bounds."""
    p.add_argument(
        "--timeout",
        type=timeout_arg,
        default=timeout,
        help=f"seconds any one collective may wait for a peer before the run "
        f"fails: the process-group timeout, spawned or under torchrun (default {timeout:g})",
    )
    p.add_argument(
        "--time-limit",
        type=time_limit_arg,
        default=None,
        help="seconds the whole run may take; it is stopped after that (default: none)",
    )
    p.add_argument("--debug", action="store_true", help="show every rank's Python traceback when something fails")


def load_cluster_arg(args: argparse.Namespace) -> ClusterSpec:
    cluster = load_cluster(args.cluster)
    if getattr(args, "profile", None):
        cluster = cluster.with_profile(load_profile(args.profile))
    return cluster


def load_workload_args(
    args: argparse.Namespace, default_recompute: str = "none", recorded_model: Mapping[str, Any] | None = None
) -> tuple[ModelSpec, Workload]:
    """The model and workload of the common arguments; `default_recompute` when --recompute is absent;
    `recorded_model`: the model a plan file recorded (found by its name)."""
    model = model_named(args.model, recorded_model)
    wl = Workload(
        seq_len=parse_tokens(args.seq_len),
        global_batch=args.global_batch,
        activation_checkpointing=args.recompute if args.recompute is not None else default_recompute,
        param_sharding=args.sharding,
        block_size=args.block_size,
    )
    return model, wl


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> None:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print(indent + "  ".join(c.rjust(w) if n and _numeric(c) else c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            print(indent + "  ".join("-" * w for w in widths))


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        return f"{c:.4g}" if abs(c) < 1e4 else f"{c:,.0f}"
    return str(c)


def _numeric(s: str) -> bool:
    try:
        float(s.replace(",", "").rstrip("%x"))
        return True
    except ValueError:
        return False


def dump_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=float))
