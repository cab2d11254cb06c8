"""bench_dp's prediction errors against how much of the machine each plan's ranks used.

    python benchmarks/dp_errors_by_cores.py data/results/dp-runs/*.txt [--split 1.0]

Reads the plan rows of bench_dp reports (data/results/dp.txt's format): each distinct plan's error
(the planning calibration's, where a report also has an in-window one) and its `cores` column (what
its ranks used of the machine, calibrate.cores_used). Prints the rows, then the median and range of
the errors of the plans below and at or above --split cores: whether the plans that crowd the
machine are the ones predicted short.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path
from typing import NamedTuple

COUNTED = ("joint", "dp-even", "dp1")  # dp-baseline is the joint plan's twin when they agree: not counted twice


class PlanRow(NamedTuple):
    """One plan row of a bench_dp report; error in % (the planning calibration's where the report also
    has an in-window one), cores None in reports from before that column."""

    cluster: str
    plan: str
    predicted: str
    measured: str
    error: float
    cores: float | None


def plan_rows(text: str) -> list[PlanRow]:
    """Every plan row of one bench_dp report (compare_dp's table: shares, sharding, predicted s,
    measured s, error, overrun, then cores and, with an in-window calibration, planned s and its error)."""
    rows, cluster, header = [], "", ""
    for line in text.splitlines():
        if line.startswith("== "):
            cluster = line[3:].strip()
        elif line.startswith("plan "):
            header = line
        elif re.match(r"^(joint|dp-baseline|dp-even|dp1)\s+[\d:]+\s", line):
            cols = line.split()
            has_cores, planned = "cores" in header, "planned s" in header
            tail = 4 + has_cores + 2 * planned  # the columns from the predicted time on
            predicted, measured, error = cols[-tail : -tail + 3]
            rows.append(
                PlanRow(
                    cluster,
                    cols[0],
                    predicted,
                    measured,
                    float((cols[-1] if planned else error).rstrip("%")),
                    float(cols[-tail + 4]) if has_cores else None,
                )
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--split", type=float, default=1.0, help="cores used at which a plan counts as crowding")
    args = ap.parse_args()
    groups: dict[bool, list[float]] = {False: [], True: []}
    for path in args.reports:
        for r in plan_rows(path.read_text()):
            if r.plan in COUNTED and r.cores is not None:
                print(f"{path.name:40s} {r.cluster:6s} {r.plan:8s} cores {r.cores:4.2f} error {r.error:+6.1f}%")
                groups[r.cores >= args.split].append(r.error)
    for crowded, errors in groups.items():
        if errors:
            print(
                f"cores {'>=' if crowded else '<'} {args.split:g}: {len(errors)} plans, error median "
                f"{statistics.median(errors):+.1f}%, {min(errors):+.1f}% to {max(errors):+.1f}%, "
                f"{sum(e < 0 for e in errors)} of them short"
            )


if __name__ == "__main__":
    main()
