"""Time the cost model: `estimate`, `simulate` and the planner's view of one layout (its
coefficients once, then `evaluate` + replay at a point, as every cutting-plane round does) for
16 ... 1024 GPUs.

    python benchmarks/bench_costmodel.py [--model llama2-70b] [--seq-len 1M] [--reps 3]

Clusters: nodes of 8 GPUs cycling through H100, A100, A800, L40S (NICs 50/25/25/12.5 GB/s).
Plans: the even USP plan with one group per node ("usp-n×8"), a random uneven plan with groups of
up to 8 ("uneven"), and ring attention over every GPU ("ring": N exchange rounds, the worst case
for the simulator). Prints milliseconds per evaluation (best of --reps) and the estimate's
efficiency against the compute bound.
"""

from __future__ import annotations

import argparse
import random
import time

from hexiseq.costmodel import estimate, simulate
from hexiseq.costmodel.arrays import plan_arrays
from hexiseq.costmodel.durations import coefficients, evaluate
from hexiseq.costmodel.simulate import simulate_durations
from hexiseq.plan import Group, Plan, ring_plan, symmetric_plan
from hexiseq.rounding import even_split
from hexiseq.specs import ClusterSpec, NodeSpec, Workload, get_gpu, get_model, parse_tokens

TYPES = [("H100-SXM", 50.0), ("A100-80GB", 25.0), ("A800", 25.0), ("L40S", 12.5)]


def cluster_of(n: int) -> ClusterSpec:
    nodes = [NodeSpec(get_gpu(TYPES[i % 4][0]), 8, TYPES[i % 4][1]) for i in range(n // 8)]
    return ClusterSpec(f"bench-{n}", tuple(nodes))


def uneven_plan(n: int, S: int, H: int, Hkv: int, block: int, seed: int = 0) -> Plan:
    """Random group sizes (1..8 within nodes), random chunk lengths, random shards and heads."""
    rng = random.Random(seed)
    groups, dev = [], 0
    while dev < n:
        size = min(rng.choice([1, 2, 4, 8]), 8 - dev % 8)
        groups.append(list(range(dev, dev + size)))
        dev += size
    k = len(groups)
    weights = [rng.uniform(0.5, 2.0) for _ in range(k)]
    blocks = S // (2 * block)
    chunk_blocks = [max(1, int(blocks * w / sum(weights))) for w in weights]
    chunk_blocks[-1] += blocks - sum(chunk_blocks)
    out = []
    for devs, cb in zip(groups, chunk_blocks):
        L = cb * block
        heads = list(even_split(H, len(devs)))
        out.append(Group(tuple(devs), L, even_split(2 * L, len(devs)), heads))
    return Plan(S, H, Hkv, tuple(out), block, "uneven")


def best_ms(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama2-13b")
    ap.add_argument("--seq-len", default="1M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="16,32,64,128,256,512,1024")
    args = ap.parse_args()
    model = get_model(args.model)
    w = Workload(seq_len=parse_tokens(args.seq_len), activation_checkpointing="selective")
    H, Hkv = model.heads, model.kv_heads
    print(f"{model.name}, S={w.seq_len}, recompute {w.recompute}; ms per evaluation (best of {args.reps})")
    print(
        f"{'GPUs':>5} {'plan':>10} {'estimate':>9} {'simulate':>9} {'coefs':>8} {'point':>8} {'traced':>8} {'eff':>6}"
    )
    for n in [int(x) for x in args.sizes.split(",")]:
        cluster = cluster_of(n)
        plans = [
            symmetric_plan(range(n), w.seq_len, H, Hkv, n // 8, 8, name=f"usp-{n // 8}x8"),
            uneven_plan(n, w.seq_len, H, Hkv, w.block_size),
            ring_plan(range(n), w.seq_len, H, Hkv),
        ]
        for plan in plans:
            estimate(plan, cluster, model, w)  # warm caches (bandwidth matrices)
            # (each timed function runs at once: binding the loop's values is only for the linter)
            t_est = best_ms(lambda p=plan, cl=cluster: estimate(p, cl, model, w), args.reps)
            t_sim = best_ms(
                lambda p=plan, cl=cluster: simulate(p, cl, model, w),
                1 if plan.name == "ring" and n >= 512 else args.reps,
            )
            a = plan_arrays(plan, cluster, model, w)
            t_coef = best_ms(lambda a=a: coefficients(a, model, w), args.reps)
            c = coefficients(a, model, w)
            t_pt = best_ms(lambda a=a, c=c: simulate_durations(evaluate(c, a.s, a.L)), args.reps)
            t_tr = best_ms(lambda a=a, c=c: simulate_durations(evaluate(c, a.s, a.L), trace=True), args.reps)
            e = estimate(plan, cluster, model, w)
            print(
                f"{n:>5} {plan.name:>10} {t_est:>9.2f} {t_sim:>9.2f} {t_coef:>8.2f} {t_pt:>8.2f} {t_tr:>8.2f} "
                f"{e.efficiency_vs_bound:>6.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
