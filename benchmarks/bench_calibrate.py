"""Calibration from measurement, and the central claim measured on CPU ranks (issue 11, parts 5-6).

    python benchmarks/bench_calibrate.py [--out data/results/calibrate.txt] [--only calibrate|compare]

1. `hexiseq calibrate`: the default world (4 CPU ranks of this machine), profiled, twelve plans run
   (even and uneven; CP, HP, CP x HP; every recompute policy; data-parallel replicas of one rank;
   one replica accumulating 3-4 sequences per step), four multipliers fitted on seven of them
   (calibrate.FITTED). Target: median |predicted / measured - 1| <= 15% over every plan, after the
   fit (the held-out plans are shown apart).
2. `hexiseq calibrate --cluster cpu-4 --compare`: cpu-4 profiled and calibrated, planned, and the
   planner's uneven plan run against the best even plan. Target: the uneven plan is faster when
   measured, and the calibrated cost model predicted both within 15%.

Every figure is measured on emulated CPU ranks (hexiseq/runtime/emulation.py) and depends on the
machine and its load: the report states both (cores, CPU, load average before and after each part,
the pacing overrun of every run: 1.00 = the emulation held). Exits 1 when a target fails.
About 10 minutes on 2 cores (most of it is cpu-4's slow ranks).
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from hexiseq.calibrate import calibrate, compare
from hexiseq.calibrate.profile import machine
from hexiseq.reproduce.figures import fig_calibration, fig_measured_comparison
from hexiseq.reproduce.style import save
from hexiseq.specs import write_text_atomic

TARGET = 0.15


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/results/calibrate.txt", help="the report (and a .json beside it)")
    ap.add_argument("--only", choices=["calibrate", "compare"], help="run one part")
    ap.add_argument("--runs", help="where the runs go (default: a temporary directory)")
    args = ap.parse_args()
    runs = Path(args.runs or tempfile.mkdtemp(prefix="hexiseq-bench-calibrate-"))
    m = machine()
    buf = io.StringIO()
    record: dict = {"machine": m, "when": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    ok = True

    def say(line: str) -> None:
        print(line, flush=True)
        buf.write(line + "\n")

    say(
        f"bench_calibrate on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), {platform.platform()}, "
        f"torch {m['torch']}, "
        f"{record['when']}; runs in {runs}"
    )
    if args.only in (None, "calibrate"):
        say("\n== 1. hexiseq calibrate (4 CPU ranks of this machine)")
        cal = calibrate(world=4, out=runs / "calibrate", say=lambda s: print(s, file=sys.stderr))
        say(f"load average before {cal.load_average['before']}, after {cal.load_average['after']}")
        say(cal.table())
        say(cal.summary())
        med = cal.stats()["all_after"]["median"]
        passed = med is not None and med <= TARGET
        ok &= passed
        say(f"target: median error after the fit <= {TARGET:.0%}: {med:.1%} -> {'PASS' if passed else 'FAIL'}")
        record["calibrate"] = cal.to_dict()
        figs = save(fig_calibration(cal.rows), Path(args.out).parent / "figures", "calibration")
        say(f"figure: {figs[0]}")
    if args.only in (None, "compare"):
        say("\n== 2. hexiseq calibrate --cluster cpu-4 --compare")
        cmp = compare("cpu-4", out=runs / "compare", say=lambda s: print(s, file=sys.stderr))
        say(f"load average before {cmp.load_average['before']}, after {cmp.load_average['after']}")
        say(cmp.summary())
        ok &= cmp.claim_holds
        say(
            f"target: uneven faster when measured and both calibrated predictions within {TARGET:.0%} -> "
            f"{'PASS' if cmp.claim_holds else 'FAIL'}"
        )
        record["compare"] = cmp.to_dict()
        figs = save(fig_measured_comparison(cmp.rows), Path(args.out).parent / "figures", "cpu4_uneven_vs_even")
        say(f"figure: {figs[0]}")
    say(f"\n{'all targets met' if ok else 'a target failed'}")
    out = Path(args.out)
    write_text_atomic(out, buf.getvalue())
    write_text_atomic(out.with_suffix(".json"), json.dumps(record, indent=2, default=float) + "\n")
    print(f"report: {out} (and {out.with_suffix('.json')})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
