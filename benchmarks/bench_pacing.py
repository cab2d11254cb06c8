"""What a paced CPU rank's operators cost: the CPU time each operator takes when its rank sleeps
between operators (runtime/emulation.py), against the same operators unpaced, and how steady the
emulation's per-operator reference is (the least of an operator's first samples).

    python benchmarks/bench_pacing.py [--rows 112,448] [--repeats 3] [--out data/results/pacing.txt]

One process, one torch thread: the tiny model's forward + backward with its loss (the executor's
Llama) on `rows` tokens, 12 iterations per setting (the first 2 left out), under an emulation of one
rank slowed f times, for f = 1.01 (sleeps ~1% of the time: as good as unpaced), 4, 8, 10 and 20 (the
CPU types of cpu-4 and cpu-8), `repeats` times in turn (every f once, then again). For each: the
operators' sampled CPU time per operator (`raw_cpu_s`: what pacing by CPU time charged before the
reference) and the reference's (`cpu_s`: what the emulated device is charged), as median over the
iterations and the spread over the repeats. Depends on the machine and its load: stated in the file.
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
from hexiseq.runtime.llama import Llama, LlamaConfig  # noqa: E402
from hexiseq.specs import get_model, write_text_atomic  # noqa: E402

FACTORS = (1.01, 4.0, 8.0, 10.0, 20.0)
ITERATIONS, WARMUP = 12, 2


def per_operator(f: float, rows: int, seed: int) -> tuple[float, float]:
    """(sampled, reference) CPU seconds per operator, median over the iterations after the warm-up."""
    cfg = LlamaConfig.from_spec(get_model("tiny"))
    model = Llama(cfg).init_weights(0)
    gen = torch.Generator().manual_seed(seed)
    tokens, labels = (torch.randint(0, cfg.vocab, (rows,), generator=gen) for _ in range(2))
    raw, ref = [], []
    with emu.activate(emu.Emulation(slowdown=(f,)), 0) as pacer:
        for i in range(ITERATIONS):
            before = emu.PacerStats(**pacer.stats.to_dict())
            model.zero_grad(set_to_none=True)
            model(tokens, labels=labels).backward()
            d = pacer.stats.since(before)
            if i >= WARMUP:
                raw.append(d.raw_cpu_s / d.ops)
                ref.append(d.cpu_s / d.ops)
    return statistics.median(raw), statistics.median(ref)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="112,448", help="tokens per forward (an x20 rank's shard and group in dp1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="data/results/pacing.txt")
    args = ap.parse_args()
    m = machine()
    load0 = os.getloadavg()[0]
    lines = [
        f"bench_pacing: {' '.join(sys.argv)}",
        f"machine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
        f"load average {load0:.2f}",
        "per operator, us of CPU: sampled (median over the iterations; min-max over the repeats) | reference",
    ]
    print("\n".join(lines), flush=True)
    for rows in (int(r) for r in args.rows.split(",")):
        got: dict[float, list[tuple[float, float]]] = {f: [] for f in FACTORS}
        for rep in range(args.repeats):
            for f in FACTORS:
                got[f].append(per_operator(f, rows, rep))
        base = statistics.median(r for r, _ in got[FACTORS[0]])
        lines.append(f"rows {rows}:")
        for f in FACTORS:
            raw = [r * 1e6 for r, _ in got[f]]
            ref = [x * 1e6 for _, x in got[f]]
            lines.append(
                f"  f = {f:<5g} sampled {statistics.median(raw):6.2f} ({min(raw):6.2f}-{max(raw):6.2f}) "
                f"x{statistics.median(raw) / (base * 1e6):.3f} of f = {FACTORS[0]:g} | reference "
                f"{statistics.median(ref):6.2f} ({min(ref):6.2f}-{max(ref):6.2f}) "
                f"x{statistics.median(ref) / (base * 1e6):.3f}"
            )
        print("\n".join(lines[-len(FACTORS) - 1 :]), flush=True)
    load1 = os.getloadavg()[0]
    lines.append(f"load average after: {load1:.2f}")
    write_text_atomic(Path(args.out), "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
