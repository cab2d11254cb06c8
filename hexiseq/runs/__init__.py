"""Runs: real training experiments with a record.

- `launch(plan, data=..., steps=...)` starts a run in the background (notebooks) -> RunHandle
  (`.metrics`, `.summary`, `.wait()`, `.stop()`, `.watch()`);
- `launch(plan, backend="slurm", partition=...)` submits it to Slurm instead -> slurm.SlurmRun
  (slurm.py: sbatch scripts, heterogeneous jobs, checks; `hexiseq launch --slurm` on the command
  line; not imported here, as it imports the runtime and so torch);
- `load(RUN_DIR)` the per-step metrics as a table, `load_summary(RUN_DIR)` predicted vs measured;
- settings.py (what a run is asked to do, typed: the field table of every run option), start.py
  (`start_run`: the one place a run directory is made), config.py (the resolved run, config.json),
  data.py (tokenize, pack, each rank's own tokens), loop.py (a rank's training loop), checkpoint.py
  (DCP, atomic, verified), rundir.py, progress.py, export.py, plots.py.

The command line twin is `hexiseq run` (and `hexiseq export`).
"""

from ..errors import RunFailed
from .launch import RunHandle, launch
from .rundir import load, load_summary

__all__ = ["RunFailed", "RunHandle", "launch", "load", "load_summary"]
