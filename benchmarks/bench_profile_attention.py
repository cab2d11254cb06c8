"""How steady a profile's attention rate is: `hexiseq profile` run `--runs` times on each emulated
cluster, and each device type's rate per visible pair derived from the same raw block timings two
ways -- the profile's fit (calibrate.profile.type_attention: slopes within each rank, their
repeated median over the type) and the two-point slope the profile used before (the blocks of
Lq/4 and Lq keys on each rank, the median over the type's ranks) -- with the spread over the runs
(largest / smallest - 1).

    python benchmarks/bench_profile_attention.py [--clusters cpu-4,cpu-8] [--runs 5]
        [--out data/results/profile-attention.txt]

The runs alternate between the clusters. Depends on the machine and its load: stated in the file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexiseq.calibrate.profile import machine, profile, type_attention  # noqa: E402
from hexiseq.specs import write_text_atomic  # noqa: E402


def two_point(att: dict) -> float:
    """GFLOP/s of one rank by the slope between its Lq/4- and Lq-key blocks (the profile's fit before)."""
    full = {b["lk"]: b["seconds"] for b in att["blocks"] if b["kind"] == "full"}
    lq = next(b["lq"] for b in att["blocks"] if b["kind"] == "full")
    lo = min(full)
    slope = (full[lq] - full[lo]) / (lq - lo)
    return (1 + att["bwd_factor"]) * att["per_pair_flops"] * lq / slope / 1e9 if slope > 0 else float("nan")


def rates(prof) -> dict[str, tuple[float, float]]:  # noqa: ANN001 - a calibrate.profile.Profile
    """{type: (the profile's fit, the two-point median) in GFLOP/s} of one profile."""
    m = prof.measured
    types = m["world"]["types"]
    out = {}
    for t in dict.fromkeys(types):
        atts = [r["attention"] for r, tt in zip(m["ranks"], types) if tt == t]
        fit = type_attention(atts, prof.gpus[t]["op_overhead_us"])["tflops"] * 1e3
        out[t] = (fit, statistics.median(two_point(a) for a in atts))
    return out


def spread(xs: list[float]) -> float:
    return max(xs) / min(xs) - 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default="cpu-4,cpu-8")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="data/results/profile-attention.txt")
    a = ap.parse_args()
    clusters = a.clusters.split(",")
    start, load0 = dt.datetime.now(dt.UTC), os.getloadavg()[0]
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for i in range(a.runs):
        for c in clusters:
            for t, r in rates(profile(cluster=c, model="tiny", seq_len=2048)).items():
                got.setdefault((c, t), []).append(r)
            print(f"run {i + 1}/{a.runs} {c} done", flush=True)
    mach = machine()
    lines = [
        f"bench_profile_attention: {' '.join(sys.argv)}",
        f"({start:%Y-%m-%d %H:%M}-{dt.datetime.now(dt.UTC):%H:%M} UTC; {mach['cpu']}, {mach['cores']} cores, "
        f"torch {mach['torch']}; load average {load0:.2f} at the start)",
        "each run: `hexiseq profile --cluster C --model tiny --seq-len 2048`; attention GFLOP/s per type from the",
        "same timings: the profile's fit (type_attention) and the two-point slope of before (median of ranks)",
        "",
    ]
    worst = {"fit": 0.0, "two-point": 0.0}
    for (c, t), rs in got.items():
        fit, old = [x for x, _ in rs], [y for _, y in rs]
        worst = {"fit": max(worst["fit"], spread(fit)), "two-point": max(worst["two-point"], spread(old))}
        lines += [
            f"{c} {t}",
            f"  profile's fit   {' '.join(f'{x:6.2f}' for x in fit)}   spread {spread(fit):6.1%}",
            f"  two-point       {' '.join(f'{x:6.2f}' for x in old)}   spread {spread(old):6.1%}",
        ]
    lines += ["", f"worst spread over the types: profile's fit {worst['fit']:.1%}, two-point {worst['two-point']:.1%}"]
    text = "\n".join(lines) + "\n"
    print(text)
    write_text_atomic(Path(a.out), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
