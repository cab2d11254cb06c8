"""What an attention block's fixed cost is on CPU, and whether a layout's block sizes change the rate
per pair: the measurement behind the profile's per-row cost (calibrate/measure.py,
`measure_attention`), on one thread of this machine.

    python benchmarks/bench_attention_blocks.py [--out data/results/attention_blocks.txt]

1. Full blocks of the tiny model (8 query heads, 4 KV heads, d = 16), forward + backward with the
   executor's kernels (runtime.kernels.local_attention and its backward), at Lq = 128, 256 and 512
   query rows against Lq/4 and Lq keys: the two times' intercept, in seconds and in keys, and the
   operators one block runs. A cost per call (the same seconds at every Lq) is the operators' own,
   which the cost model charges per operator; a cost per row would grow with Lq.
2. The blocks a zigzag layout runs per rank at S = 2K (round 0: two causal diagonal blocks and a full
   one of L rows; each later round a full block of L rows against 2L keys) for ring CP 4 and CP 2,
   Ulysses HP 2 and HP 4 and USP 2 x 2: time per model pair (the cost model's pairs: 2L² per round
   and L·tile waste in round 0, tile = 128).
Each time is the least of 3 (thread CPU time). Depends on the machine: stated in the file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexiseq.calibrate.measure import _attention_fwd_bwd, operators_of  # noqa: E402
from hexiseq.calibrate.profile import machine  # noqa: E402
from hexiseq.runtime.kernels import local_attention, local_attention_backward  # noqa: E402
from hexiseq.specs import write_text_atomic  # noqa: E402

TILE = 128  # costmodel.kernels.KernelOptions.attn_tile


def cpu_time(fn, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def block(lq: int, lk: int, kind: str, hq: int, hk: int, gen: torch.Generator) -> float:
    q, k, v = (torch.randn(n, h, 16, generator=gen) for n, h in ((lq, hq), (lk, hk), (lk, hk)))

    def run() -> None:
        o, lse = local_attention(q, k, v, kind)
        local_attention_backward(torch.ones_like(o), q, k, v, o, lse, kind)

    return cpu_time(run)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/results/attention_blocks.txt")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    m = machine()
    lines = [
        f"bench_attention_blocks: {' '.join(sys.argv)}",
        f"machine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, one thread, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        "1. full blocks, 8 query / 4 KV heads, d = 16: intercept of the times at Lq/4 and Lq keys",
    ]
    cfg = SimpleNamespace(heads=8, kv_heads=4, head_dim=16)
    for lq in (128, 256, 512):
        fns = [_attention_fwd_bwd(lq, lk, "full", cfg, gen) for lk in (lq // 4, lq)]
        (ta, tb), ops = [cpu_time(f) for f in fns], operators_of(fns[0])
        slope = (tb - ta) / (lq - lq // 4)
        lines.append(
            f"   Lq {lq:4d}: {ta * 1e3:6.2f} / {tb * 1e3:6.2f} ms; intercept {(ta - slope * (lq // 4)) * 1e3:+.2f} ms "
            f"= {ta / slope - lq // 4:+5.0f} keys; {ops} operators per block"
        )
    lines += ["", "2. a rank's blocks of a zigzag layout at S = 2,048: time per model pair"]
    for name, L, rounds, hq, hk in (
        ("ring CP 4", 256, 4, 8, 4),
        ("ring CP 2", 512, 2, 8, 4),
        ("Ulysses HP 2", 1024, 1, 4, 2),
        ("Ulysses HP 4", 1024, 1, 2, 1),
        ("USP 2 x 2", 512, 2, 4, 2),
    ):
        t = 2 * block(L, L, "causal", hq, hk, gen) + block(L, L, "full", hq, hk, gen)
        t += (rounds - 1) * block(L, 2 * L, "full", hq, hk, gen)
        pairs = (2 * L * L + L * TILE + (rounds - 1) * 2 * L * L) * hq
        lines.append(f"   {name:<13} {t * 1e3:7.1f} ms, {pairs / 1e6:5.2f} M model pairs: {t / pairs * 1e9:.2f} ns")
    print("\n".join(lines))
    write_text_atomic(Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
