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

SYSTEMS = ("joint", "dp-even", "dp1")  # dp-baseline is the joint plan's twin when they agree: not counted twice


def plan_rows(text: str) -> list[tuple[str, str, float, float]]:
    """(cluster, plan, cores used, error %) of each plan row of one bench_dp report."""
    rows, cluster, planned = [], "", False
    for line in text.splitlines():
        if line.startswith("== "):
            cluster = line[3:].strip()
        elif line.startswith("plan "):
            planned = "planned s" in line  # then the last two columns are the planning calibration's
        elif re.match(rf"^({'|'.join(SYSTEMS)})\s+[\d:]+\s", line):
            cols = line.split()
            error, cores = (cols[-1], cols[-3]) if planned else (cols[-3], cols[-1])
            rows.append((cluster, cols[0], float(cores), float(error.rstrip("%"))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--split", type=float, default=1.0, help="cores used at which a plan counts as crowding")
    args = ap.parse_args()
    groups: dict[bool, list[float]] = {False: [], True: []}
    for path in args.reports:
        for cluster, plan, cores, error in plan_rows(path.read_text()):
            print(f"{path.name:40s} {cluster:6s} {plan:8s} cores {cores:4.2f} error {error:+6.1f}%")
            groups[cores >= args.split].append(error)
    for crowded, errors in groups.items():
        if errors:
            print(
                f"cores {'>=' if crowded else '<'} {args.split:g}: {len(errors)} plans, error median "
                f"{statistics.median(errors):+.1f}%, {min(errors):+.1f}% to {max(errors):+.1f}%, "
                f"{sum(e < 0 for e in errors)} of them short"
            )


if __name__ == "__main__":
    main()
