"""How steady a profile's fitted figures are: `hexiseq profile` run `--runs` times on each emulated
cluster, and each device type's attention rate per visible pair and per-operator time derived from
the same raw timings two ways -- the profile's fits (calibrate.profile.type_attention and
measure.fit_memory: slopes within each rank, their repeated median over the type) and the
two-point fits the profile used before (attention: the blocks of Lq/4 and Lq keys; per-operator
time: the memory-bound kernels at a sixteenth and all of the rows; on each rank, then the median
over the type's ranks) -- with the spread over the runs (largest / smallest - 1).

    python benchmarks/bench_profile_fits.py [--clusters cpu-4,cpu-8] [--runs 5]
        [--out data/results/profile-fits.txt]

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

from hexiseq.calibrate.measure import MEMORY_FRACTIONS, fit_memory  # noqa: E402
from hexiseq.calibrate.profile import machine, profile, type_attention  # noqa: E402
from hexiseq.specs import write_text_atomic  # noqa: E402


def two_point(att: dict) -> float:
    """GFLOP/s of one rank by the slope between its Lq/4- and Lq-key blocks (the profile's fit before)."""
    full = {b["lk"]: b["seconds"] for b in att["blocks"] if b["kind"] == "full"}
    lq = next(b["lq"] for b in att["blocks"] if b["kind"] == "full")
    lo = min(full)
    slope = (full[lq] - full[lo]) / (lq - lo)
    return (1 + att["bwd_factor"]) * att["per_pair_flops"] * lq / slope / 1e9 if slope > 0 else float("nan")


def two_point_op_us(mem: dict) -> float:
    """us per operator of one rank by its memory kernels at a sixteenth and all of the rows (before)."""
    sizes = mem["sizes"]
    small, big = sizes[MEMORY_FRACTIONS.index(16)], sizes[MEMORY_FRACTIONS.index(1)]
    gbps = (big["bytes"] - small["bytes"]) / (big["seconds"] - small["seconds"]) / 1e9
    return max(0.0, small["seconds"] - small["bytes"] / (gbps * 1e9)) / big["operators"] * 1e6


def figures(prof) -> dict[str, dict[str, tuple[float, float]]]:  # noqa: ANN001 - a calibrate.profile.Profile
    """{type: {figure: (the profile's fit, the two-point median)}} of one profile: the attention rate
    in GFLOP/s, the per-operator time in us."""
    m = prof.measured
    types = m["world"]["types"]
    out = {}
    for t in dict.fromkeys(types):
        mine = [r for r, tt in zip(m["ranks"], types) if tt == t]
        op_us = fit_memory([r["memory"]["sizes"] for r in mine])["op_us"]
        fit = type_attention([r["attention"] for r in mine], op_us)["tflops"] * 1e3
        out[t] = {
            "attention GFLOP/s": (fit, statistics.median(two_point(r["attention"]) for r in mine)),
            "us per operator": (op_us, statistics.median(two_point_op_us(r["memory"]) for r in mine)),
        }
    return out


def spread(xs: list[float]) -> float:
    return max(xs) / min(xs) - 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default="cpu-4,cpu-8")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="data/results/profile-fits.txt")
    a = ap.parse_args()
    clusters = a.clusters.split(",")
    start, load0 = dt.datetime.now(dt.UTC), os.getloadavg()[0]
    got: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for i in range(a.runs):
        for c in clusters:
            for t, figs in figures(profile(cluster=c, model="tiny", seq_len=2048)).items():
                for name, r in figs.items():
                    got.setdefault((name, c, t), []).append(r)
            print(f"run {i + 1}/{a.runs} {c} done", flush=True)
    mach = machine()
    lines = [
        f"bench_profile_fits: {' '.join(sys.argv)}",
        f"({start:%Y-%m-%d %H:%M}-{dt.datetime.now(dt.UTC):%H:%M} UTC; {mach['cpu']}, {mach['cores']} cores, "
        f"torch {mach['torch']}; load average {load0:.2f} at the start)",
        "each run: `hexiseq profile --cluster C --model tiny --seq-len 2048`; per type, from the same timings: the",
        "profile's fits (type_attention, fit_memory) and the two-point fits of before (median of ranks)",
        "",
    ]
    worst: dict[str, dict[str, float]] = {}
    for (name, c, t), rs in got.items():
        fit, old = [x for x, _ in rs], [y for _, y in rs]
        w = worst.setdefault(name, {"fit": 0.0, "two-point": 0.0})
        w["fit"], w["two-point"] = max(w["fit"], spread(fit)), max(w["two-point"], spread(old))
        lines += [
            f"{name}, {c} {t}",
            f"  profile's fit   {' '.join(f'{x:6.2f}' for x in fit)}   spread {spread(fit):6.1%}",
            f"  two-point       {' '.join(f'{x:6.2f}' for x in old)}   spread {spread(old):6.1%}",
        ]
    lines.append("")
    lines += [
        f"worst spread over the types, {name}: profile's fit {w['fit']:.1%}, two-point {w['two-point']:.1%}"
        for name, w in worst.items()
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_text_atomic(Path(a.out), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
