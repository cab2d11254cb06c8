"""What communication costs in a paced CPU world: a small all-to-all inside one node when its ranks
come to it from paced work (runtime/emulation.py), against the same unpaced, and what the pacer
itself adds per operator.

    python benchmarks/bench_paced_collectives.py [--ranks 2,4] [--rounds 200] [--out data/results/paced-collectives.txt]

1. Per operator, in-process, one torch thread: the wall time of a small matmul + tanh (64x16 @ 16x16)
   plain and under an emulation of one rank at f = 1.0001 (paced, sleeping ~never): what the pacer's
   dispatch and bookkeeping add to every operator a rank runs.
2. A world of `ranks` gloo processes on this machine, every rank the same slowdown f (1.0001, 4, 10,
   20: the CPU types of cpu-4 and cpu-8), no emulated link: `rounds` times, each rank runs the same
   paced work (20 small matmuls: f x ~0.6 ms), settles what it owes (as before every message), then
   one ragged all-to-all of 4,096 float32 per peer. The wall time from the settle to the return: the
   wait for the peers and the real exchange, which the cost model charges as the link's latency per
   all-to-all (plus bytes / bandwidth). Median, mean and 90th percentile over the rounds after the
   first 20, on rank 0.
Depends on the machine and its load: stated in the file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexiseq.calibrate.profile import machine  # noqa: E402
from hexiseq.runtime import emulation as emu  # noqa: E402
from hexiseq.runtime.world import spawn_world  # noqa: E402
from hexiseq.specs import write_text_atomic  # noqa: E402

FACTORS = (1.0001, 4.0, 10.0, 20.0)
SKIP = 20  # first rounds left out (the dispatch mode's set-up, the references' first samples)
PER_PEER = 4096
WORK = 20


def operator_wall(n: int = 3000) -> tuple[float, float]:
    """(plain, paced at f ~ 1) wall seconds per operator."""
    torch.set_num_threads(1)
    a, b = torch.randn(64, 16), torch.randn(16, 16)

    def run() -> float:
        x, t0 = a, time.perf_counter()
        for _ in range(n):
            x = torch.tanh(x @ b)
        return (time.perf_counter() - t0) / (2 * n)

    run()
    plain = min(run() for _ in range(3))
    with emu.activate(emu.Emulation((1.0001,)), 0):
        run()
        paced = min(run() for _ in range(3))
    return plain, paced


def _collective(rank: int, world: int, f: float, rounds: int) -> list[float]:
    """One rank: `rounds` x (paced work, settle, all-to-all); the wall from the settle to the return."""
    import torch.distributed as dist

    from hexiseq.runtime.comm import ragged_all_to_all

    a = torch.randn(64, 64, generator=torch.Generator().manual_seed(rank))
    x = torch.zeros(PER_PEER * world)
    splits = [PER_PEER] * world
    waits = []
    with emu.activate(emu.Emulation((f,) * world), rank) as pacer:
        for _ in range(rounds):
            for _ in range(WORK):
                a = torch.tanh(a @ a) * 0.5
            pacer.settle(0.0)
            t0 = time.monotonic()
            ragged_all_to_all(x, splits, splits)
            waits.append(time.monotonic() - t0)
    dist.barrier()
    return waits[SKIP:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", default="data/results/paced-collectives.txt")
    args = ap.parse_args()
    if args.rounds <= SKIP:
        raise SystemExit(f"--rounds must exceed the {SKIP} rounds left out")
    m = machine()
    lines = [
        f"bench_paced_collectives: {' '.join(sys.argv)}",
        f"machine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
        f"load average {os.getloadavg()[0]:.2f}",
    ]
    plain, paced = operator_wall()
    lines.append(
        f"per operator (64x16 @ 16x16, tanh), wall: plain {plain * 1e6:.1f} us, under the pacer (f = 1.0001) "
        f"{paced * 1e6:.1f} us: +{(paced - plain) * 1e6:.1f} us per operator"
    )
    lines.append(
        f"all-to-all of {PER_PEER:,} float32 per peer inside one node, after {WORK} paced matmuls and a settle; "
        f"wall from the settle to the return, ms (rank 0, rounds {SKIP + 1}-{args.rounds}):"
    )
    print("\n".join(lines), flush=True)
    for world in (int(r) for r in args.ranks.split(",")):
        for f in FACTORS:
            waits = spawn_world(_collective, world, f, args.rounds, timeout_s=600)[0]
            q = sorted(waits)
            lines.append(
                f"  {world} ranks, f = {f:<6g} median {statistics.median(q) * 1e3:5.2f}  mean "
                f"{statistics.mean(q) * 1e3:5.2f}  p90 {q[int(0.9 * len(q))] * 1e3:5.2f}"
            )
            print(lines[-1], flush=True)
    lines.append(f"load average after: {os.getloadavg()[0]:.2f}")
    write_text_atomic(Path(args.out), "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
