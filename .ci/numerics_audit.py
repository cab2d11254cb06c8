#!/usr/bin/env python3
"""Run the numerics tests (pytest -m numerics) under 1 and 2 threads and print each test's worst
error against its tolerance; fail when any test passes by less than a factor MARGIN.

Threads: OMP_NUM_THREADS for the test process (and torch's intra-op pool) and HEXISEQ_RANK_THREADS
for torch.set_num_threads inside every spawned rank. Errors are recorded by the `within` fixture
(tests/conftest.py). Usage: python .ci/numerics_audit.py [--python .venv/bin/python] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MARGIN = 10.0
SETTINGS = (
    {"OMP_NUM_THREADS": "1", "HEXISEQ_RANK_THREADS": "1"},
    {"OMP_NUM_THREADS": "2", "HEXISEQ_RANK_THREADS": "2"},
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    rows: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in SETTINGS:
            log = Path(tmp) / f"omp{setting['OMP_NUM_THREADS']}.jsonl"
            env = {**os.environ, **setting, "HEXISEQ_NUMERICS_LOG": str(log)}
            label = f"OMP_NUM_THREADS={setting['OMP_NUM_THREADS']}, rank threads {setting['HEXISEQ_RANK_THREADS']}"
            print(f"== numerics tests, {label}", flush=True)
            rc = subprocess.call(
                [args.python, "-m", "pytest", "-q", "-m", "numerics", "-p", "no:cacheprovider"], cwd=root, env=env
            )
            if rc != 0:
                print(f"numerics tests failed under {label}", file=sys.stderr)
                return rc
            for line in log.read_text().splitlines():
                r = json.loads(line)
                key = (r["test"], r["what"])
                ratio = r["err"] / r["tol"]
                if key not in rows or ratio > rows[key]["ratio"]:
                    rows[key] = {**r, "ratio": ratio, "setting": label}
                elif ratio == rows[key]["ratio"] and label not in rows[key]["setting"]:
                    rows[key]["setting"] = "both (the same error)"
    # one row per test: its check closest to its tolerance
    per_test: dict[str, dict] = {}
    for (test, _), r in rows.items():
        if test not in per_test or r["ratio"] > per_test[test]["ratio"]:
            per_test[test] = r
    lines = ["| test | check | tolerance | worst error | margin | setting |", "|---|---|---|---|---|---|"]
    bad = []
    for test, r in sorted(per_test.items()):
        margin = float("inf") if r["err"] == 0 else r["tol"] / r["err"]
        lines.append(
            f"| {test.removeprefix('tests/')} | {r['what']} | {r['tol']:.0e} | {r['err']:.2e} | "
            f"{'exact' if margin == float('inf') else f'{margin:,.0f}x'} | {r['setting']} |"
        )
        if margin < MARGIN:
            bad.append(test)
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if bad:
        print(f"\n{len(bad)} test(s) pass by less than {MARGIN:g}x below their tolerance: {bad}", file=sys.stderr)
        return 1
    print(f"\nall {len(per_test)} numerics tests at least {MARGIN:g}x inside their tolerance in both settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
