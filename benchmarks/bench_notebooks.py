"""Every notebook at full size (no HEXISEQ_QUICK), headless, with its wall time; the executed
copies are written to out/notebooks/ to look at. `make notebooks-full` runs this.

    .venv/bin/python benchmarks/bench_notebooks.py [NAME ...]

02 reads data/results/ (the full grid, `hexiseq reproduce`) when it holds results; 04 profiles and
calibrates 4 CPU ranks of this machine (a few minutes). Any error in any notebook fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="notebook stems (default: all)")
    args = ap.parse_args()
    os.environ.pop("HEXISEQ_QUICK", None)
    os.environ.setdefault("MPLBACKEND", "Agg")
    out = REPO / "out" / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    print(f"{'notebook':<22} {'wall s':>8}  result (2-core machine; load: {os.getloadavg()[0]:.2f})")
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        if args.names and path.stem not in args.names:
            continue
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        try:
            NotebookClient(
                nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}
            ).execute()
            status = "ok"
        except Exception as e:  # the cell error is in the executed copy
            status, failed = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:100]}", True
        nbformat.write(nb, out / path.name)
        print(f"{path.stem:<22} {time.perf_counter() - t0:>8.1f}  {status} (executed copy: out/notebooks/{path.name})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
