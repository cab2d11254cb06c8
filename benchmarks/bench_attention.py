"""Attention forward+backward time on CPU (gloo, spawned ranks): an even plan, uneven plans with the
same total attention work on the same ranks, and dense single-process attention for scale.

    .venv/bin/python benchmarks/bench_attention.py [--seq 4096 --heads 12 --kv-heads 4 --dim 64 --repeats 5]

The even plan is USP 2x2. "uneven" has groups of 1 and 3 ranks, chunk lengths 1:3, uneven token
shards, and per-rank attention work equal to the even plan's (so only the ragged code path differs);
"uneven-heads" also splits heads 5/4/3 across KV-head boundaries (GQA duplication), so its per-rank
work is not balanced. Plans are timed interleaved (even, uneven, ... per repeat) so machine noise
hits them alike; the figure is the median over repeats of the slowest rank's wall time between
barriers. The check: uneven <= 1.10 x even (`--check` turns it into the exit status).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexiseq.plan import Group, Plan, symmetric_plan  # noqa: E402
from hexiseq.runtime import build_context, local_attention, local_attention_backward, plan_attention, spawn_world  # noqa: E402


def make_plans(seq: int, heads: int, kv_heads: int, block: int) -> list[Plan]:
    """Even USP 2x2 and two uneven plans on the same 4 ranks."""
    even = symmetric_plan(range(4), seq, heads, kv_heads, cp=2, hp=2, block_size=block, name="even-usp-2x2")
    unit = seq // 8  # group A gets chunks of seq/8, group B of 3*seq/8
    if unit % block or heads % 3:
        raise SystemExit(f"--seq must be a multiple of 8 x block ({8 * block}) and --heads a multiple of 3")
    la, lb = unit, 3 * unit
    nb = 2 * lb
    shards_b = (nb // 3 - block, nb // 3 + 2 * block, nb - 2 * (nb // 3) - block)
    uneven = Plan(
        seq,
        heads,
        kv_heads,
        (Group((0,), la, (2 * la,), (heads,)), Group((1, 2, 3), lb, shards_b, (heads // 3,) * 3)),
        block,
        name="uneven",
    )
    h = heads // 3
    uneven_heads = Plan(
        seq,
        heads,
        kv_heads,
        (Group((0,), la, (2 * la,), (heads,)), Group((1, 2, 3), lb, shards_b, (h + 1, h, h - 1))),
        block,
        name="uneven-heads",
    )
    return [even, uneven, uneven_heads]


def _bench_worker(rank: int, world: int, plans: list[str], dim: int, repeats: int) -> dict:
    ctxs = [build_context(Plan.from_json(p), timeout_s=300) for p in plans]
    times: dict[str, list[float]] = {c.plan.name: [] for c in ctxs}
    cpu: dict[str, list[float]] = {c.plan.name: [] for c in ctxs}
    for rep in range(repeats + 1):  # the first round warms up
        for ctx in ctxs:
            p, s = ctx.plan, ctx.layout.num_tokens
            g = torch.Generator().manual_seed(rep)
            q = torch.randn(s, p.num_heads, dim, generator=g).requires_grad_()
            k = torch.randn(s, p.num_kv_heads, dim, generator=g).requires_grad_()
            v = torch.randn(s, p.num_kv_heads, dim, generator=g).requires_grad_()
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            plan_attention(q, k, v, ctx).sum().backward()
            c1 = time.process_time()
            dist.barrier()
            if rep:
                times[p.name].append(time.perf_counter() - t0)
                cpu[p.name].append(c1 - c0)
    return {"wall": times, "cpu": cpu}


def dense_time(seq: int, heads: int, kv_heads: int, dim: int, repeats: int, threads: int) -> float:
    """Single-process causal attention forward+backward with the same CPU kernel, median seconds."""
    torch.set_num_threads(threads)
    out = []
    for rep in range(repeats + 1):
        q, k, v = torch.randn(seq, heads, dim), torch.randn(seq, kv_heads, dim), torch.randn(seq, kv_heads, dim)
        t0 = time.perf_counter()
        o, lse = local_attention(q, k, v, "causal", 0)
        local_attention_backward(torch.ones_like(o), q, k, v, o, lse, "causal", 0)
        if rep:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--check", action="store_true", help="exit 1 when uneven costs more than 1.10 x even")
    a = ap.parse_args(argv)
    plans = make_plans(a.seq, a.heads, a.kv_heads, a.block)
    machine_threads = torch.get_num_threads()
    t0 = time.perf_counter()
    ranks = spawn_world(_bench_worker, 4, [p.to_json() for p in plans], a.dim, a.repeats, timeout_s=1800)
    spawn_s = time.perf_counter() - t0
    res: dict = {
        "seq": a.seq,
        "heads": a.heads,
        "kv_heads": a.kv_heads,
        "dim": a.dim,
        "repeats": a.repeats,
        "threads_per_rank": max(1, (os.cpu_count() or 1) // 4),
        "plans": {},
    }
    for p in plans:
        per_rep = [max(r["wall"][p.name][i] for r in ranks) for i in range(a.repeats)]
        cpu = [sum(r["cpu"][p.name][i] for r in ranks) for i in range(a.repeats)]
        res["plans"][p.name] = {
            "wall_s": statistics.median(per_rep),
            "cpu_s_all_ranks": statistics.median(cpu),
            "heads": list(p.heads),
            "shards": list(p.shards),
            "chunk_len": [g.chunk_len for g in p.groups],
        }
    # Same threads as one rank: dense_s is the attention work itself, comparable with the ranks' CPU sum.
    res["dense_s"] = dense_time(a.seq, a.heads, a.kv_heads, a.dim, a.repeats, res["threads_per_rank"])
    even = res["plans"]["even-usp-2x2"]
    for r in res["plans"].values():
        r["wall_vs_even"] = r["wall_s"] / even["wall_s"]
        r["cpu_vs_even"] = r["cpu_s_all_ranks"] / even["cpu_s_all_ranks"]
        r["wall_vs_dense"] = r["wall_s"] / res["dense_s"]
        r["cpu_vs_dense"] = r["cpu_s_all_ranks"] / res["dense_s"]
    res["uneven_within_10pct"] = res["plans"]["uneven"]["wall_vs_even"] <= 1.10
    print(
        f"S={a.seq} H={a.heads} Hkv={a.kv_heads} d={a.dim}, 4 gloo ranks x {res['threads_per_rank']} thread(s) "
        f"on a {machine_threads}-thread machine, "
        f"{a.repeats} repeats (world run {spawn_s:.1f} s)"
    )
    print(f"{'plan':<14} {'wall s':>8} {'x even':>7} {'x dense':>8} {'cpu s (sum)':>12} {'x even':>7} {'x dense':>8}")
    for name, r in res["plans"].items():
        print(
            f"{name:<14} {r['wall_s']:8.3f} {r['wall_vs_even']:7.3f} {r['wall_vs_dense']:8.2f} "
            f"{r['cpu_s_all_ranks']:12.3f} "
            f"{r['cpu_vs_even']:7.3f} {r['cpu_vs_dense']:8.2f}"
        )
    print(
        f"{'dense (1 proc)':<14} {res['dense_s']:8.3f}   "
        f"({res['threads_per_rank']} thread, same kernel, whole sequence)"
    )
    print(f"uneven within 10% of even: {res['uneven_within_10pct']}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    if a.check and not res["uneven_within_10pct"]:
        raise SystemExit(1)
    return res


if __name__ == "__main__":
    main()
