"""`hexiseq reproduce` from a cold cache: the quick grid (the default) or the full one, timed in
one run — planning the cells, then drawing every figure and the comparison — and the rerun from
the cache. Results go to a temporary directory (data/results/ is not touched).

    .venv/bin/python benchmarks/bench_reproduce.py            # quick grid (target: a few minutes on 2 cores)
    .venv/bin/python benchmarks/bench_reproduce.py --full     # the full grid (many minutes)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hexiseq.reproduce import load_scenarios, reproduce  # noqa: E402
from hexiseq.reproduce.pipeline import draw_outputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the full grid instead of the quick one")
    args = ap.parse_args()
    quick = not args.full
    cells = sum(len(s.cells) for s in load_scenarios(quick=quick))
    print(
        f"reproduce {'--quick' if quick else '(full grid)'}: {cells} cells; "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = reproduce(quick=quick, out=Path(tmp), progress=False, draw=False)
        t_plan = time.perf_counter() - t0
        t0 = time.perf_counter()
        figs = draw_outputs(res)
        t_draw = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = reproduce(quick=quick, out=Path(tmp), progress=False, draw=False)
        t_cached = time.perf_counter() - t0
        assert again.meta["last_run"]["computed"] == 0
        slow = res.table[res.table["system"] == "hexiseq"].nlargest(3, "plan_time_s")[
            ["cluster", "model", "seq_len", "plan_time_s"]
        ]
    print(f"  plan every cell (cold cache) {t_plan:8.1f} s  ({res.meta['last_run']['computed']} computed)")
    print(f"  figures + comparison          {t_draw:8.1f} s  ({len(figs)} files)")
    print(f"  total                         {t_plan + t_draw:8.1f} s")
    print(f"  rerun from the cache          {t_cached:8.1f} s  (no figures)")
    print(
        "  slowest cells:\n"
        + "\n".join(f"    {r.cluster} {r.model} {r.seq_len}: {r.plan_time_s:.1f} s" for r in slow.itertuples())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
