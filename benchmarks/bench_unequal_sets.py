"""Unequal shard sets on gloo: the time after the last micro-step (waiting, the cross-set gradient
reduction, AdamW) of a 3 + 2 rank joint run under ZeRO-3 inside each replica, shares 3:1, float32.

    .venv/bin/python benchmarks/bench_unequal_sets.py                 # this checkout
    .venv/bin/python benchmarks/bench_unequal_sets.py --repo /tmp/old # another one (a git worktree)

Replica 0's three ranks run three micro-steps and never wait: their tail is the reduction and the
optimizer. Replica 1's two ranks run one and wait for them. Medians over the steps after the first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __name__ == "__main__" or "--repo" in sys.argv:  # spawned ranks import this file again: the same path
    _i = sys.argv.index("--repo") if "--repo" in sys.argv else -1
    sys.path.insert(0, sys.argv[_i + 1] if _i >= 0 else str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", help="the repository whose hexiseq to run (default: this one)")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    import hexiseq
    from hexiseq.plan import random_plan
    from hexiseq.runtime.llama import LlamaConfig
    from hexiseq.runtime.replicas import ReplicaLayout
    from hexiseq.runtime.sharding import JointJob, joint_worker
    from hexiseq.runtime.train import TrainConfig, unpack
    from hexiseq.runtime.world import spawn_world

    cfg = LlamaConfig(vocab=4096, hidden=512, layers=4, heads=8, kv_heads=4, ffn=1408, rope_theta=1000.0)
    layout = ReplicaLayout(
        (random_plan(3, 256, 8, 4, seed=3, block_size=4), random_plan(2, 256, 8, 4, seed=5, block_size=4)),
        (3, 1),
        "zero3",
        "replica",
    )
    job = JointJob(
        layout.to_dict(), cfg, steps=args.steps, seed=0, train=TrainConfig(lr=1e-3), collect=False, dtype="float32"
    )
    ranks = unpack(spawn_world(joint_worker, 5, [job], timeout_s=600))
    tails = [statistics.median(s["seconds"] - s["compute_s"] for s in r[0]["steps"][1:]) for r in ranks]
    print(f"hexiseq from {Path(hexiseq.__file__).parent}")
    print("seconds after the last micro-step, per rank (replica 0: ranks 0-2):", " ".join(f"{t:.4f}" for t in tails))


if __name__ == "__main__":
    main()
