"""Tokens/s of the training step on CPU: the tiny model under even and uneven plans on 4 ranks,
next to the single-process step (forward + backward + gradient all-reduce + AdamW).

    .venv/bin/python benchmarks/bench_train.py [--seq-len 2048] [--steps 3] [--json]

The 4 ranks are spawned gloo processes sharing this machine's cores (one thread each when there
are fewer cores than ranks); the single process runs once on one thread, like each rank (the base
of the ratios), and once on all cores. On a small CPU machine the ratios measure the executor's overhead
(communication, smaller kernels), not a speed-up, and other load on the machine skews them (the
load average is printed). Every run has one untimed warm-up step; the median step is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hexiseq.plan import Group, Plan, even_split, ring_plan, symmetric_plan, ulysses_plan  # noqa: E402
from hexiseq.runtime.llama import LlamaConfig  # noqa: E402
from hexiseq.runtime.train import StepJob, reference_job, step_worker_many  # noqa: E402
from hexiseq.runtime.world import spawn_world  # noqa: E402
from hexiseq.specs import get_model  # noqa: E402


def uneven_plan(seq_len: int, heads: int, kv_heads: int, block: int) -> Plan:
    """Two HP groups of two: the first holds ~60% of the sequence; shards 3:1 and 1:1, heads 6+2 and 4+4."""
    blocks = seq_len // (2 * block)
    a = max(1, round(blocks * 0.6)) * block
    b = seq_len // 2 - a
    g0 = Group((0, 1), a, (2 * a * 3 // 4, 2 * a - 2 * a * 3 // 4), (heads * 3 // 4, heads - heads * 3 // 4))
    g1 = Group((2, 3), b, even_split(2 * b, 2), even_split(heads, 2))
    return Plan(seq_len, heads, kv_heads, (g0, g1), block, name="uneven-2x2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    spec = get_model("tiny")
    cfg = LlamaConfig.from_spec(spec)
    S, H, Hkv, blk = args.seq_len, spec.heads, spec.kv_heads, args.block_size
    plans = [
        ring_plan(range(4), S, H, Hkv, block_size=blk),
        ulysses_plan(range(4), S, H, Hkv, block_size=blk),
        symmetric_plan(range(4), S, H, Hkv, cp=2, hp=2, block_size=blk),
        uneven_plan(S, H, Hkv, blk),
    ]
    jobs = [StepJob(plan=p.to_dict(), model=cfg, steps=args.steps, warmup_steps=1) for p in plans]

    def median_tps(steps: list[dict]) -> float:
        return statistics.median(s["tokens_per_s"] for s in steps)

    ref_job = StepJob(plan=None, model=cfg, steps=args.steps, warmup_steps=1)
    cores = os.cpu_count() or 1
    singles = {}
    for threads in sorted({1, cores}):  # one thread like each rank here (the base), and all cores
        torch.set_num_threads(threads)
        singles[threads] = median_tps(reference_job(ref_job, S)["steps"])
    torch.set_num_threads(cores)
    ranks = spawn_world(step_worker_many, 4, jobs, timeout_s=600)

    base = singles[1]
    rows = [
        {"setup": f"single process ({t} thread{'s' * (t > 1)})", "ranks": 1, "tokens_per_s": v, "ratio": v / base}
        for t, v in singles.items()
    ]
    for i, p in enumerate(plans):
        tps = median_tps(ranks[0][i]["steps"])
        shards = "/".join(str(s) for s in p.shards)
        heads = "/".join(str(h) for h in p.heads)
        rows.append(
            {
                "setup": f"{p.name} (shards {shards}, heads {heads})",
                "ranks": 4,
                "tokens_per_s": tps,
                "ratio": tps / base,
            }
        )
    load = os.getloadavg()[0]  # other work on the machine skews the ratio (4 processes get more CPU share than 1)
    if args.json:
        print(
            json.dumps(
                {"model": "tiny", "seq_len": S, "steps": args.steps, "load_avg_1min": load, "rows": rows}, indent=2
            )
        )
    else:
        print(
            f"training step, model tiny ({spec.layers} layers, hidden {spec.hidden}, vocab {spec.vocab}), S={S}, "
            "CPU fp32, gloo; "
            f"{os.cpu_count()} cores, load average {load:.1f}"
        )
        width = max(len(r["setup"]) for r in rows)
        for r in rows:
            print(
                f"  {r['setup']:<{width}}  {r['tokens_per_s']:>9,.0f} tokens/s   "
                f"x{r['ratio']:.2f} of the 1-thread single process"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
